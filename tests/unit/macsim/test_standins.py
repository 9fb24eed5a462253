"""The simulated Mac's stand-ins (watchdog/macsim) against what macOS gives.

Each is checked against recorded real output where public reports have it: `sample`'s
report grammar (tests/support/data/sample_jaccl_recv.txt, a JACCL rank's report),
`pmset -g therm` at rest (test_pace_probes.py's record, byte for byte), xnu's struct
layouts (apple-oss-distributions/xnu bsd/sys/proc_info.h and resource.h: the offsets
below are the header's, counted by hand); and the macOS probe's own parsers read what
the stand-ins write for live sockets and threads of this very process.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.unit.daemon.probes.test_pace_probes import PMSET_COOL
from watchdog import gdbstack, host
from watchdog.daemon.probes import macos, powermetrics, samplegraph
from watchdog.daemon.probes.exits import ExitWatcher
from watchdog.macsim import gpu, kqueue, libproc, psutil_mac, tools

DATA = Path(__file__).resolve().parents[2] / "support" / "data"
# A `sample` report's call-graph lines, read off the recorded real report.
THREAD_LINE = re.compile(r"^    \d+ Thread_\d+(:? .*)?$")
# (an offset and address may be lists: "+ 16,24,...  [0x10c814090,0x10c814098,...]")
FRAME_LINE = re.compile(r"^    [+][ !:|]* ?\d+ \S.*  \(in [^)]+\) \+ [\d,.]+  \[[0-9a-fx,.]+\]$")


def test_xnu_layouts_as_the_headers_give_them():
    # struct socket_fdinfo: proc_fileinfo 24, vinfo_stat 136, soi_so..soi_oobmark 48,
    # soi_rcv/soi_snd 24 each, soi_kind + rfu_1 8, the union (un_sockinfo: 16 + 2 * 255,
    # aligned) 528.
    assert (libproc.SOI_SO, libproc.SOI_RCV, libproc.SOI_SND, libproc.SOI_KIND,
            libproc.SOI_PROTO) == (160, 208, 232, 256, 264)
    assert libproc.SOCKET_FDINFO_SIZE == 264 + 528 == macos.SOCKET_FDINFO_SIZE
    assert (macos.SOI_SO, macos.SOI_RCV_CC, macos.SOI_SND_CC, macos.SOI_KIND) == (
        libproc.SOI_SO, libproc.SOI_RCV, libproc.SOI_SND, libproc.SOI_KIND)
    assert libproc.THREADINFO.size == 112  # 2 uint64, 8 int32, MAXTHREADNAMESIZE 64
    # struct rusage_info_v4: a uuid, 35 uint64; v2's disk bytes and pageins where the
    # probe reads them, ri_runnable_time last.
    assert libproc.RUSAGE_V4.size == 296
    assert 16 + 8 * libproc.RUSAGE_FIELDS.index("diskio_bytesread") == macos.DISKIO_OFFSET
    assert 16 + 8 * libproc.RUSAGE_FIELDS.index("pageins") == macos.PAGEINS_OFFSET
    assert libproc.RUSAGE_FIELDS[-1] == "runnable_time" and len(libproc.RUSAGE_FIELDS) == 35


def test_the_probe_reads_socket_buffer_counts_from_the_stand_in():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        client.sendall(b"x" * 100)  # received by `accepted`, never read
        probe = macos.MacProbe(ps=psutil_mac, libproc=libproc.LibProc())
        inode = os.fstat(accepted.fileno()).st_ino
        found = {}
        deadline = time.monotonic() + 5
        while found.get(inode, (0, 0))[1] != 100 and time.monotonic() < deadline:
            found = {h: (snd, rcv) for h, snd, rcv in probe.socket_queues(os.getpid()) or ()}
        assert found[inode] == (0, 100), found  # soi_snd.sbi_cc 0, soi_rcv.sbi_cc 100
    finally:
        for s in (client, accepted, server):
            s.close()


def test_the_probe_reads_file_offsets_where_the_disk_counters_see_nothing(tmp_path):
    """A Mac counts no disk byte for a FIFO or a network mount; each descriptor's
    fi_offset (struct vnode_fdinfo: proc_fileinfo first, 176 bytes) moves with every
    byte read or written through it. Here: a file this process writes, by hand."""
    assert libproc.VNODE_FDINFO_SIZE == macos.VNODE_FDINFO_SIZE == 24 + 152
    assert libproc.FILEINFO.size == 16  # fi_openflags, fi_status, fi_offset (of the 24)
    lib = libproc.LibProc()
    before = macos.read_offsets(os.getpid(), lib)
    assert before is not None
    with open(tmp_path / "checkpoint", "wb", buffering=0) as f:
        f.write(b"x" * 1000)
        assert macos.read_offsets(os.getpid(), lib) == before + 1000
        f.write(b"y" * 24)
        assert macos.read_offsets(os.getpid(), lib) == before + 1024
        info = ctypes.create_string_buffer(macos.VNODE_FDINFO_SIZE)
        assert lib.proc_pidfdinfo(os.getpid(), f.fileno(), macos.PROC_PIDFDVNODEINFO, info,
                                  len(info)) == macos.VNODE_FDINFO_SIZE
        flags, _, offset = libproc.FILEINFO.unpack_from(info.raw)
        assert offset == 1024 and flags & 2  # FWRITE
    assert macos.read_offsets(os.getpid(), lib) == before
    sample = macos.MacProbe(ps=psutil_mac, libproc=lib).sample(os.getpid())
    assert sample is not None and sample.offsets == before


def test_a_fifos_offset_moves_as_a_macs_does(tmp_path):
    """Linux keeps a FIFO's position at 0; a Mac advances fi_offset with every byte."""
    fifo = tmp_path / "ckpt.fifo"
    os.mkfifo(fifo)
    drained = threading.Thread(target=lambda: open(fifo, "rb").read(), daemon=True)
    drained.start()
    lib = libproc.LibProc()
    with open(fifo, "wb", buffering=0) as sink:
        before = macos.read_offsets(os.getpid(), lib)
        sink.write(b"x" * 65536)
        after = macos.read_offsets(os.getpid(), lib)
    drained.join(5)
    assert before is not None and after is not None and after - before >= 65536


def test_rusage_and_threadinfo_from_the_live_process():
    lib = libproc.LibProc()
    buffer = ctypes.create_string_buffer(macos.RUSAGE_V2_SIZE)
    assert lib.proc_pid_rusage(ctypes.c_int(os.getpid()), ctypes.c_int(2), buffer) == 0
    read, written = macos.rusage_io(buffer.raw)
    assert read >= 0 and written >= 0 and macos.rusage_pageins(buffer.raw) >= 0
    assert lib.proc_pid_rusage(os.getpid(), 3, buffer) == -1  # a flavour it has not
    handles = ctypes.create_string_buffer(8 * 64)
    filled = lib.proc_pidinfo(os.getpid(), libproc.PROC_PIDLISTTHREADS, 0, handles, 512)
    assert filled >= 8 and filled % 8 == 0
    first = int.from_bytes(handles.raw[:8], "little")
    info = ctypes.create_string_buffer(libproc.THREADINFO.size)
    assert lib.proc_pidinfo(os.getpid(), libproc.PROC_PIDTHREADINFO, first, info,
                            len(info)) == libproc.THREADINFO.size
    user, system, *_ = libproc.THREADINFO.unpack(info.raw)
    assert user + system > 0  # this thread has run: nanoseconds, as pth_user_time


def test_threads_through_libproc_have_the_ids_python_gives():
    """PROC_PIDLISTTHREADIDS + PROC_PIDTHREADID64INFO: root reads them for any process,
    in ns, with the ids threading.get_native_id() returns, whatever psutil's version."""
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        lib = libproc.LibProc()
        found = macos.read_threads(os.getpid(), lib)
        assert found is not None and found[0][0] == threading.get_native_id()
        assert worker.native_id in {t for t, _, _ in found}
        sample = macos.MacProbe(ps=psutil_mac, libproc=lib).sample(os.getpid())
        assert sample is not None and sample.native_ids and sample.main_tid == os.getpid()
        assert worker.native_id in dict(sample.threads) and sample.threads_error == ""
    finally:
        stop.set()
        worker.join()


def test_a_rank_whose_threads_cannot_be_read_is_said():
    class Refused(libproc.LibProc):
        def proc_pidinfo(self, *args):
            return 0  # libproc refuses: as task_for_pid, or an older macOS

    class NoThreads(psutil_mac.Process):
        def threads(self):
            raise psutil.AccessDenied(self.pid)

    class Ps:
        Process, NoSuchProcess, AccessDenied = NoThreads, psutil.NoSuchProcess, \
            psutil.AccessDenied

    sample = macos.MacProbe(ps=Ps, libproc=Refused()).sample(os.getpid())
    assert sample is not None and sample.threads == () and not sample.native_ids
    assert "threads could not be read" in sample.threads_error


def test_sample_stacks_are_keyed_by_the_thread_ids_sample_prints():
    report = ("Call graph:\n    5 Thread_4233561   DispatchQueue_1: com.apple.main-thread\n"
              "    + 5 start  (in dyld) + 1  [0x1]\n    5 Thread_4233570\n"
              "    + 5 thread_start  (in libsystem_pthread.dylib) + 8  [0x2]\n\n")
    assert set(macos.sample_stacks(report)) == {4233561, 4233570}
    assert set(macos.sample_stacks(report.replace("Thread_4233570", "worker"))) == {0, 1}


def test_ri_runnable_time_read_in_seconds():
    assert 16 + 8 * libproc.RUSAGE_FIELDS.index("runnable_time") == macos.RUNNABLE_OFFSET
    assert macos.RUSAGE_V4_SIZE == libproc.RUSAGE_V4.size
    raw = libproc.RUSAGE_V4.pack(b"\0" * 16, *([0] * 34), libproc.abstime(2.5e9))
    assert macos.rusage_runnable(raw, libproc.TIMEBASE) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        macos.rusage_runnable(raw[:200], libproc.TIMEBASE)
    # xnu counts running time as runnable: the run queue is what is left of it after
    # the CPU time (ri_user_time + ri_system_time, the two fields after the uuid).
    ran = libproc.RUSAGE_V4.pack(b"\0" * 16, libproc.abstime(1.0e9), libproc.abstime(0.5e9),
                                 *([0] * 32), libproc.abstime(2.5e9))
    assert macos.rusage_run_queue(ran, libproc.TIMEBASE) == pytest.approx(1.0)


@pytest.mark.slow
def test_the_probe_reads_a_contended_process_run_queue_from_ri_runnable_time():
    """Two busy loops on one core: each waits for it about half the time, which macOS
    counts in ri_runnable_time and the probe hands the straggler judge as `runnable`."""
    from watchdog import macsim

    cpu = min(os.sched_getaffinity(0))
    loops = [subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"])
             for _ in range(2)]
    try:
        lib = libproc.LibProc()
        probe = macos.MacProbe(ps=psutil_mac, libproc=lib, tool=macsim.tool,
                               timebase=lib.mach_timebase_info)
        first = probe.sample(loops[0].pid)
        assert first is not None and first.runnable is not None and first.demand == ()
        began = time.monotonic()
        waited = 0.0
        while waited < 0.3 and time.monotonic() < began + 15:
            time.sleep(0.2)
            later = probe.sample(loops[0].pid)
            assert later is not None and later.runnable is not None
            waited = later.runnable - first.runnable
        assert waited >= 0.3, waited  # of up to 15 s sharing one core
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def test_psutil_as_macos_answers():
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        proc = psutil_mac.Process(os.getpid())
        ids = [t.id for t in proc.threads()]
        assert ids == list(range(1, len(ids) + 1)) and len(ids) >= 2  # positions, from 1
        assert threading.get_native_id() not in ids[1:]  # never the kernel's
        assert proc.kernel_tids()[0] == os.getpid()  # the main thread first
        assert proc.status() in ("running", "stopped", "zombie", "idle")
        assert len(proc.uids()) == 3
        assert not hasattr(proc, "cpu_num") and not hasattr(proc, "io_counters")
        assert psutil_mac.virtual_memory().wired >= 0
    finally:
        stop.set()
        worker.join()


def test_a_stopped_process_is_stopped_and_a_traced_one_running():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        proc = psutil_mac.Process(child.pid)
        os.kill(child.pid, 19)  # SIGSTOP
        deadline = time.monotonic() + 5
        while psutil.Process(child.pid).status() != "stopped" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.status() == "stopped"
        assert psutil_mac._STATUS.get(psutil.STATUS_TRACING_STOP) is None  # -> running
        assert psutil_mac._STATUS.get(psutil.STATUS_DISK_SLEEP) is None
    finally:
        child.kill()
        child.wait()


def test_sample_report_keeps_the_recorded_grammar():
    recorded = (DATA / "sample_jaccl_recv.txt").read_text().split("Call graph:\n")[1]
    graph = [line for line in recorded.split("\n\n")[0].splitlines()]
    assert all(THREAD_LINE.match(line) or FRAME_LINE.match(line) for line in graph), graph
    parsed = gdbstack.parse((DATA / "gdb_ring_waiting_for_slowpeer.txt").read_text())
    reads = [{tid: [(name, "libmlx.so", "0x1") for name in reversed(frames)]
              for tid, frames in parsed.items()}]
    main = min(parsed)
    report = tools.sample_report(main, reads, "python3", 1)
    lines = report.split("Call graph:\n")[1].split("\n\n")[0].splitlines()
    assert lines and all(THREAD_LINE.match(line) or FRAME_LINE.match(line) for line in lines)
    threads = samplegraph.parse(report)
    assert [t.thread.split()[0] for t in threads] == [f"Thread_{tid}" for tid in
                                                      sorted(parsed, key=lambda t: (t != main, t))]
    # The heaviest path of each thread is its gdb stack, root first; the ids are the
    # kernel's, as on a Mac (`Thread_<id>`), while psutil's are positions.
    for thread, tid in zip(threads, sorted(parsed, key=lambda t: (t != main, t)), strict=True):
        assert tuple(p.frame for p in reversed(thread.path)) == parsed[tid][:len(thread.path)]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("gdb"), reason="no gdb behind the sample stand-in")
def test_the_sample_stand_in_waits_for_a_gdb_still_attached():
    """A stand-in killed at the daemon's time box leaves its gdb to finish, attached: the
    next one waits for it to let go (within its box) rather than fail to attach and read
    nothing, and never kills it (a gdb killed mid-attach leaves the rank stopped)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = subprocess.Popen([*gdbstack.command(shutil.which("gdb") or "gdb", child.pid)[:-2],
                                   "-ex", "shell sleep 1.5"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            assert wait_until(lambda: tools._traced(child.pid), 10)
            assert tools.gdb_read(child.pid, time.monotonic() + 0.2) == {}  # gave up
            read = tools.gdb_read(child.pid, time.monotonic() + 10)  # waited, then read
            assert child.pid in read and read[child.pid], read
            assert holder.wait(timeout=10) == 0  # the holder ended on its own
        finally:
            holder.kill()
            holder.wait()
        assert psutil.Process(child.pid).status() != psutil.STATUS_STOPPED
    finally:
        child.kill()
        child.wait()


def wait_until(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_pmset_at_rest_is_the_recorded_output(monkeypatch, capsys):
    monkeypatch.setattr(tools, "cpufreq_limit", lambda: None)
    assert tools.main(["pmset", "-g", "therm"]) == 0
    assert capsys.readouterr().out == PMSET_COOL
    monkeypatch.setattr(tools, "cpufreq_limit", lambda: 71)
    tools.main(["pmset", "-g", "therm"])
    assert macos.pmset_therm(capsys.readouterr().out) == "CPU speed limit 71% (thermal)"


# A rank on the simulated Mac: the hook labels MLX's compute thread (gpu.label), then it
# computes (argv[1] "work") or sleeps in Python ("rest") until its stdin closes.
GPU_RANK = """
import sys, threading, watchdog, mlx.core as mx
watchdog.install()
print("ready", flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
a = mx.ones((400, 400))
while not done.is_set():
    mx.eval(a @ a) if sys.argv[1] == "work" else done.wait(0.1)
"""


@pytest.fixture(scope="module")
def gpu_ranks(tmp_path_factory):
    """Four simulated ranks: one computing, one resting whose GPU spins on nothing
    (#3830), one computing that ioreg does not list, one resting (its GPU time flat)."""
    env = {**os.environ, "MLX_WATCHDOG_SIMULATE": "macos",
           "MLX_WATCHDOG_DIR": str(tmp_path_factory.mktemp("gpu-ranks"))}
    procs = {name: subprocess.Popen([sys.executable, "-c", GPU_RANK, what],
                                    env={**env, gpu.MODES_VARIABLE: mode},
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for name, what, mode in (("work", "work", ""), ("spin", "rest", "spin"),
                                      ("unlisted", "work", "unlisted"),
                                      ("rest", "rest", ""))}
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield {name: proc.pid for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.communicate(timeout=30)


def test_mlx_compute_stands_for_the_gpu(gpu_ranks):
    """Its compute thread is not among its threads (psutil, libproc): its CPU time is the
    process's accumulatedGPUTime in ioreg's format, which the probe reads advancing; the
    GPU's power is read from every Metal process's GPU time; the modes give a rank ioreg
    does not list and a GPU spinning on nothing."""
    from watchdog.macsim import tool

    work = gpu_ranks["work"]
    (compute,) = gpu.labelled(work)
    shown = psutil_mac.Process(work)
    assert compute not in shown.kernel_tids()
    assert len(shown.threads()) == len(psutil.Process(work).threads()) - 1
    assert compute not in libproc.LibProc().tids(work)
    probe = macos.MacProbe(ps=psutil_mac, libproc=libproc.LibProc(), tool=tool)
    first, why = probe.gpu_reading(work, 10)
    assert first is not None and why == "", why
    deadline = time.monotonic() + 20
    while (probe.gpu_reading(work, 10)[0] or 0) <= first:
        assert time.monotonic() < deadline, "the GPU time never advanced"
        time.sleep(0.2)
    ns, why = probe.gpu_reading(gpu_ranks["unlisted"], 10)
    assert ns is None and f"no Metal client for pid {gpu_ranks['unlisted']}" in why
    # Issue 55: the same ioreg lists the other processes' GPU time and name, which a
    # rank whose own GPU time stands still may be waiting behind.
    others = probe.gpu_others(gpu_ranks["spin"])
    assert others is not None and work in others and gpu_ranks["spin"] not in others
    assert others[work][0] > first and others[work][1].startswith("python"), others
    spin = probe.gpu_reading(gpu_ranks["spin"], 10)[0]
    time.sleep(0.3)
    assert (probe.gpu_reading(gpu_ranks["spin"], 10)[0] or 0) >= (spin or 0) + 250_000_000
    power = probe.gpu_power(10)  # a spinning rank here: the whole GPU resident (#3830)
    assert power is not None and power.active_percent == 100.0
    # the spin's 3 W, the working rank's power on top (a GPU shared with work)
    assert power.milliwatts > gpu.SPIN_MILLIWATTS
    residency, watts = gpu.gpu_power(0.2, {gpu.MODES_VARIABLE: "zero-watts"})
    assert watts == 0.0  # macOS 27, an M5 Max: 0 mW, which the judge reads as no reading


@pytest.mark.skipif(shutil.which("gdb") is None, reason="no gdb behind the sample stand-in")
def test_sample_draws_the_compute_thread_as_a_macs_gpu_stream_asleep(gpu_ranks):
    from watchdog.daemon.judge.frames import parked
    from watchdog.macsim import tool

    work = gpu_ranks["work"]
    assert gpu.labelled(work)
    probe = macos.MacProbe(ps=psutil_mac, libproc=libproc.LibProc(), tool=tool)
    began = time.monotonic()
    threads = probe.native_stacks(work, 10)  # `sample PID 1 -file <temp>`, read back
    took = time.monotonic() - began
    assert threads, "the sample read nothing"
    gpu_stream = [f for f in threads.values() if "-[_MTLCommandBuffer waitUntilCompleted]" in f]
    assert gpu_stream and parked(gpu_stream[0]) and gpu_stream[0][0] == "__psynch_cvwait"
    assert not list(Path(tempfile.gettempdir()).glob("mlx-watchdog-sample-*")), \
        "a sample report was left behind"
    print(f"sample stand-in on a computing rank: {took:.2f}s (the daemon's box: 3 s)")


def test_gpu_modes_and_powermetrics_format_without_a_metal_process():
    text = gpu.powermetrics_text(99.35, 8503.0, 501.9)
    power = powermetrics.parse(text)
    assert power is not None and (power.active_percent, power.milliwatts) == (99.35, 8503.0)
    recorded = (DATA / "powermetrics_gpu_power.txt").read_text()
    assert text.splitlines()[-5].split(":")[0] in recorded  # the recorded line names
    idle = powermetrics.parse(gpu.powermetrics_text(gpu.IDLE_RESIDENCY, gpu.IDLE_MILLIWATTS,
                                                    500))
    assert idle is not None and idle.active_percent < 5


def test_kqueue_reports_an_exit_and_a_gone_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    queue = kqueue.kqueue()
    change = kqueue.kevent(child.pid, kqueue.KQ_FILTER_PROC,
                           kqueue.KQ_EV_ADD | kqueue.KQ_EV_ONESHOT, kqueue.KQ_NOTE_EXIT)
    events = []
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        events = queue.control([change], 4, 0.5)
    assert [(e.ident, e.fflags) for e in events] == [(child.pid, kqueue.KQ_NOTE_EXIT)]
    child.wait()
    gone = queue.control([kqueue.kevent(child.pid, kqueue.KQ_FILTER_PROC,
                                        kqueue.KQ_EV_ADD)], 4, 0)
    assert gone[0].flags & kqueue.KQ_EV_ERROR and gone[0].data == errno.ESRCH
    with pytest.raises(ProcessLookupError):
        queue.control([kqueue.kevent(child.pid, kqueue.KQ_FILTER_PROC, kqueue.KQ_EV_ADD)], 0)
    queue.close()
    with pytest.raises(ValueError):
        queue.control([], 1, 0)


def test_the_exit_watcher_wakes_through_the_stand_in():
    wake = threading.Event()
    watcher = ExitWatcher(wake, kq=kqueue)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    watcher.watch({child.pid})
    watcher.start()
    try:
        assert wake.wait(10)
    finally:
        watcher.stop()
        watcher.join(2)
        child.wait()


@pytest.mark.parametrize("environ, platform, simulated", [
    ({"MLX_WATCHDOG_SIMULATE": "macos"}, "linux", True),
    ({"MLX_WATCHDOG_SIMULATE": "macos"}, "darwin", False),  # a real Mac is never simulated
    ({"MLX_WATCHDOG_SIMULATE": "1"}, "linux", False),
    ({}, "linux", False)])
def test_the_variable_is_read_once_and_only_on_linux(environ, platform, simulated):
    assert host.simulating(environ, platform) is simulated


def test_the_simulated_defaults_and_label(monkeypatch):
    monkeypatch.setattr(host, "SIMULATED", True)
    monkeypatch.setattr(host, "OS", host.DARWIN)
    monkeypatch.setenv(host.SIMULATE_ROOT_VARIABLE, "/tmp/elsewhere")
    assert host.platform_label() == "macos (simulated)"
    d = host.defaults()
    assert (d.record_dir, d.state_dir, d.service, d.stderr_log) == (
        "/tmp/elsewhere/var/run/mlx-watchdog", "/tmp/elsewhere/var/db/mlx-watchdog",
        "launchd", "/tmp/elsewhere/var/log/mlx-watchdog.err.log")
    assert host.for_service("systemd").record_dir == "/run/mlx-watchdog"
    from watchdog.daemon.probes import probe

    simulated = probe()
    assert isinstance(simulated, macos.MacProbe) and simulated.ps is psutil_mac
    assert simulated.stack_command(1)[-3:] == ["sample", "1", "1"]
    assert simulated.stack_command(1)[1:3] == ["-I", "-c"]  # never from the working dir
    monkeypatch.setattr(host, "SIMULATED", False)
    assert host.platform_label() == "macos"


@pytest.mark.skipif(shutil.which("gdb") is None, reason="no gdb behind the sample stand-in")
def test_a_rank_whose_gpu_time_stands_still_behind_anothers_work_is_read_so(gpu_ranks):
    """Issue 55, incident 2 on the simulated Mac: a Metal process whose GPU time stands
    still while another's advances: the stack sampler reads whom it waits behind (ioreg's
    other clients) and the GPU's power with it (powermetrics), which the judge reads
    (judge/gpuwork.behind: table-tested in tests/unit/daemon/test_shared_gpu.py)."""
    from watchdog.daemon.judge import gpuwork
    from watchdog.daemon.probes.stacksampler import Identity, StackSampler
    from watchdog.macsim import tool

    class NoStacks(macos.MacProbe):
        """The stand-ins whole, but no `sample` of the threads (gdb's seconds under load):
        the GPU's readings are what this test reads, not the frames."""

        def native_stacks(self, pid: int, timeout: float) -> dict[int, tuple[str, ...]]:
            return {}

    probe = NoStacks(ps=psutil_mac, libproc=libproc.LibProc(), tool=tool)
    sampler = StackSampler(probe, lambda *a: None)
    rest = gpu_ranks["rest"]
    seen = probe.sample(rest)
    assert seen is not None
    who = Identity(rest, seen.start_time, seen.uid, seen.start_ticks)
    key = (rest, seen.start_time)
    sampler._run(key, who, ())
    time.sleep(0.3)
    sampler._run(key, who, ())
    found = sampler.found[key]
    assert found.gpu_moved is False, found
    # (Other simulated Metal processes on this shared machine may be advancing too.)
    behind = [pid for pid, _ in found.gpu_behind]
    assert gpu_ranks["work"] in behind and rest not in behind, found
    # The GPU's power read with it: below working power here, where a rank of the
    # fixture spins on nothing (#3830: the whole GPU at ~3 W), so not explained.
    power = found.gpu_power
    assert power is not None and power.milliwatts > 0, found
    said = gpuwork.behind(found.gpu_behind, power)
    assert bool(said) == (power.milliwatts >= gpuwork.SPIN_MILLIWATTS), (said, power)
