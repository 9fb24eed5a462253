"""The frame table (watchdog/backends.py) and its classifier (judge/frames.py), against
real stacks: gdb backtraces of real MLX ring ranks recorded on this machine
(tests/support/data/gdb_ring_*.txt: rank 0 spinning on a stopped peer, rank 1
computing a matmul chain, rank 0 waiting for it; gdb_mpi_wedged.txt: an Open MPI rank
whose TCP reads the wedge injector answers EAGAIN), a macOS `sample` report of a JACCL
rank (sample_jaccl_recv.txt), and the frames the seeds' reports quote."""

from __future__ import annotations

import pytest

from tests.support import SUPPORT
from watchdog import gdbstack
from watchdog.backends import BACKENDS, COMPUTING_FRAMES, WAITING_FRAMES
from watchdog.daemon.judge import frames
from watchdog.daemon.judge.frames import classify, thread_kind
from watchdog.daemon.probes.macos import sample_stacks
from watchdog.states import FrameKind

DATA = SUPPORT / "data"


def gdb(name: str) -> dict[int, tuple[str, ...]]:
    return gdbstack.parse((DATA / name).read_text())


def busiest_unparked(stacks: dict[int, tuple[str, ...]]) -> list[int]:
    return [tid for tid, f in stacks.items() if not frames.parked(f)]


def test_gdb_output_gives_every_thread_by_its_lwp_id_leaf_first():
    stacks = gdb("gdb_ring_waiting_peer_stopped.txt")
    assert sorted(stacks) == [7873, 7875, 7878, 7880, 7881, 7884]
    worker = stacks[7880]
    assert worker[0] == "__libc_recv"
    assert "mlx::core::distributed::ring::(anonymous namespace)::SocketThread::worker()" in worker
    assert stacks[7873][0] == "__futex_abstimed_wait_common64"


@pytest.mark.parametrize("text", ["", "garbage\n#0 nothing", "Thread x (LWP y)\n#0 ?? ()"])
def test_gdb_output_without_threads_gives_none(text):
    assert gdbstack.parse(text) == {}


def test_a_ring_worker_spinning_on_a_stopped_peer_waits():
    stacks = gdb("gdb_ring_waiting_peer_stopped.txt")
    seen = classify(stacks, [7880], "ring")
    assert seen.kind == FrameKind.WAITING
    assert "SocketThread::worker -> __libc_recv" in seen.what and "7880" in seen.what


def test_a_rank_computing_a_matmul_chain_computes():
    stacks = gdb("gdb_ring_computing_matmul.txt")
    seen = classify(stacks, [7977], "ring")
    assert seen.kind == FrameKind.COMPUTING and "sgemm_" in seen.what
    # The same on JACCL and MPI: compute frames are every backend's.
    assert classify(stacks, [7977], "jaccl").kind == FrameKind.COMPUTING
    assert classify(stacks, [7977], "mpi").kind == FrameKind.COMPUTING


def test_the_rank_waiting_for_a_slow_peer_waits():
    stacks = gdb("gdb_ring_waiting_for_slowpeer.txt")
    # Its busy thread (the socket worker in recv), and, with no busy id known, every
    # thread not parked in the kernel: the worker alone (the others sleep in futexes).
    assert busiest_unparked(stacks) == [7972]
    assert classify(stacks, [7972], "ring").kind == FrameKind.WAITING
    assert classify(stacks, [], "ring").kind == FrameKind.WAITING


def test_a_ring_wait_is_not_another_backends():
    """recv() is the ring's wait; on JACCL a busy thread in it is not named a wait."""
    stacks = gdb("gdb_ring_waiting_peer_stopped.txt")
    assert classify(stacks, [7880], "jaccl").kind == FrameKind.COMPUTING


def test_a_jaccl_rank_sampled_on_a_mac_spins_in_tbt_poll_cq():
    text = (DATA / "sample_jaccl_recv.txt").read_text()
    stacks = sample_stacks(text)
    assert len(stacks) == 3
    seen = classify(stacks, [], "jaccl")
    assert seen.kind == FrameKind.WAITING
    assert "MeshImpl::recv" in seen.what


MPI_STREAM, MPI_EVENTS, PMIX_EVENTS = 18775, 18761, 18762  # gdb_mpi_wedged.txt's threads


def test_a_wedged_mpi_rank_spins_in_its_progress_engine():
    stacks = gdb("gdb_mpi_wedged.txt")
    # Linux: its busy thread (MLX's stream thread in MPI_Allreduce) by its id.
    seen = classify(stacks, [MPI_STREAM], "mpi")
    assert seen.kind == FrameKind.WAITING
    assert "ompi_request_default_wait -> __GI___poll" in seen.what, seen.what


def test_a_wedged_mpi_rank_read_as_a_mac_reads_it_waits():
    """No busy id known (`sample`'s threads by position): every thread not parked is read,
    Open MPI's own event thread asleep in poll() too. It waits in libevent's loop, not
    computing; the thread named is the stream thread, deepest in MPI's wait."""
    stacks = gdb("gdb_mpi_wedged.txt")
    assert sorted(busiest_unparked(stacks)) == sorted([MPI_STREAM, MPI_EVENTS])
    assert thread_kind(stacks[MPI_EVENTS], "mpi")[0] == FrameKind.WAITING
    seen = classify(stacks, [], "mpi")
    assert seen.kind == FrameKind.WAITING and not seen.guessed, seen
    assert f"thread {MPI_STREAM} spins in ompi_request_default_wait" in seen.what, seen.what


def test_an_mpi_thread_polling_with_select_on_a_mac_is_busy():
    """On a Mac Open MPI's event loop polls with select(): a `sample` of the spinning
    thread may end in `__select`, a parked frame, yet under opal_progress it never
    sleeps; the same leaf with no progress engine under it is parked."""
    stacks = gdb("gdb_mpi_wedged.txt")
    stream = ("__select",) + stacks[MPI_STREAM][1:]
    assert not frames.parked(stream)
    assert frames.parked(("__select",) + stacks[MPI_EVENTS][1:])
    mac = {**stacks, MPI_STREAM: stream}
    seen = classify(mac, [], "mpi")
    assert seen.kind == FrameKind.WAITING and f"thread {MPI_STREAM}" in seen.what, seen.what


# The frames the seeds' reports quote from macOS `sample` (mlx #3910, #3830, PR 4060).
QUOTED = [
    ("jaccl", ("tbt_poll_qp_recv", "tbt_poll_cq",
               "mlx::core::distributed::jaccl::MeshImpl::recv(char*, unsigned long, int)"),
     FrameKind.WAITING),
    ("jaccl", ("ring_indicies_err", "tbt_poll_cq"), FrameKind.WAITING),
    ("ring", ("-[IOSurfaceSharedEvent waitUntilSignaledValue:timeoutMS:]",
              "mlx::core::Event::wait()", "mlx::core::array::wait()"), FrameKind.WAITING),
    ("jaccl", ("-[IOSurfaceSharedEvent waitUntilSignaledValue:timeoutMS:]",
               "mlx::core::Event::wait()"), FrameKind.WAITING),
    ("ring", ("__recvfrom", "mlx::core::distributed::ring::(anonymous namespace)::"
              "SocketThread::worker()"), FrameKind.WAITING),
    ("mpi", ("opal_progress", "ompi_request_default_wait", "PMPI_Wait"), FrameKind.WAITING),
    ("nccl", ("mlx::core::cu::AtomicEvent::wait()",), FrameKind.WAITING),
    ("ring", ("mlx::core::metal::CommandEncoder::dispatch_threads()",), FrameKind.COMPUTING),
    ("mpi", ("cblas_sgemm", "mlx::core::matmul<float>()"), FrameKind.COMPUTING),
    ("jaccl", ("_PyEval_EvalFrameDefault",), FrameKind.COMPUTING),
]


@pytest.mark.parametrize("backend, stack, kind", QUOTED)
def test_the_frames_the_reports_quote(backend, stack, kind):
    assert thread_kind(stack, backend)[0] == kind


def test_frames_the_table_does_not_name_count_as_computing():
    kind, what = thread_kind(("some_vendor_kernel_loop", "??"), "jaccl")
    assert kind == FrameKind.COMPUTING and "does not name" in what


def test_no_stack_read_is_unknown():
    assert classify(None, [1], "ring").kind == FrameKind.UNKNOWN
    assert classify({}, [1], "ring").kind == FrameKind.UNKNOWN
    # A busy thread the sample does not hold (it ended meanwhile): unknown, not waiting.
    assert classify({5: ("recv",)}, [6], "ring").kind == FrameKind.UNKNOWN


def test_one_busy_thread_computing_makes_the_rank_compute():
    stacks = {1: ("__libc_recv", "SocketThread::worker()"), 2: ("sgemm_",)}
    seen = classify(stacks, [1, 2], "ring")
    assert seen.kind == FrameKind.COMPUTING and "thread 2" in seen.what


def test_bare_names_match_whole_names_only():
    assert frames.matches("__GI___poll", "poll")
    assert frames.matches("mlx::core::distributed::jaccl::MeshImpl::recv(char*)", "recv")
    assert not frames.matches("tbt_poll_cq", "poll")
    assert not frames.matches("recvfrom_helper", "recv")


def test_the_table_is_data_for_every_backend():
    assert all(isinstance(p, str) and p for p in WAITING_FRAMES + COMPUTING_FRAMES)
    named = {b.name for b in BACKENDS if b.waiting_frames}
    assert named == {"ring", "jaccl", "nccl", "mpi"}


# -- the GPU's own clock (macOS) ---------------------------------------------------------


def test_ioreg_gives_each_process_its_gpu_time_summed_over_its_clients():
    from watchdog.daemon.probes.gputime import gpu_time_by_pid

    text = (DATA / "ioreg_agx_clients.txt").read_text()
    assert gpu_time_by_pid(text) == {4245: 812534000 + 3000, 4246: 0, 397: 4519238000000}
    assert gpu_time_by_pid("") == {} and gpu_time_by_pid("+-o junk {}") == {}


def test_gpu_time_advancing_computes_whatever_the_cpu_spins_in():
    """mlx #3830's look-alike: a long prefill under fast synch spins the CPU in
    waitUntilSignaledValue while the GPU works; the wedge spins there with the GPU idle."""
    stacks = {0: ("-[IOSurfaceSharedEvent waitUntilSignaledValue:timeoutMS:]",
                  "mlx::core::Event::wait()")}
    assert classify(stacks, [], "ring").kind == FrameKind.WAITING
    moving = classify(stacks, [], "ring", gpu_moved=True)
    assert moving.kind == FrameKind.COMPUTING and "GPU time advances" in moving.what
    flat = classify(stacks, [], "ring", gpu_moved=False)
    assert flat.kind == FrameKind.WAITING and flat.what.endswith("GPU time flat")


def test_a_sample_is_bounded_whatever_its_threads_and_names():
    """Issue 57, item 6: names cut to MAX_FRAME_CHARS, MAX_THREAD_FRAMES a thread from
    its leaf, MAX_SAMPLE_FRAMES in all with the busy and main threads first; a cut name
    still classifies by its head, and a worst-case sample is classified in well under a
    second (6.6-9.4 s before: the memo by (frame, entry) thrashed)."""
    import time

    from watchdog.daemon.probes.stacksampler import (
        MAX_FRAME_CHARS,
        MAX_SAMPLE_FRAMES,
        MAX_THREAD_FRAMES,
        bounded,
    )

    long = {t: tuple(f"f{t}_{j}(" + "A" * 5000 + ")" for j in range(100)) for t in range(300)}
    kept = bounded(long, (299, 7))
    assert list(kept)[:2] == [299, 7]  # the busy (and main) threads first
    assert sum(map(len, kept.values())) == MAX_SAMPLE_FRAMES
    assert all(len(f) <= MAX_THREAD_FRAMES for f in kept.values())
    assert all(len(name) == MAX_FRAME_CHARS for f in kept.values() for name in f)
    assert bounded({1: ("recv", "SocketThread::worker()")}) == \
        {1: ("recv", "SocketThread::worker()")}  # a real sample is unchanged
    cut = bounded({1: ("mlx::core::matmul<" + "x" * 400 + ">(int)",)})
    assert thread_kind(cut[1], "ring")[0] == FrameKind.COMPUTING
    assert "computes in" in thread_kind(cut[1], "ring")[1]
    began = time.perf_counter()
    seen = classify(kept, tuple(kept), "ring")
    assert time.perf_counter() - began < 1.0
    assert seen.kind == FrameKind.COMPUTING and seen.guessed
