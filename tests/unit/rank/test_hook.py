"""The heartbeat hook in this process, with the real mlx.core: patches, counters, fail-soft.

Every test that installs leaves the interpreter as it found it: the `clean` fixture
uninstalls and checks that every MLX function is the original again. Cases that need a
fresh interpreter (another uid, zero-code activation, exit) run in a subprocess.
"""

from __future__ import annotations

import faulthandler
import io
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import psutil
import pytest

import watchdog
from tests.support import REPO
from watchdog import record
from watchdog.rank import hook, patches  # noqa: E402
from watchdog.record import layout
from watchdog.states import Phase

# Everything the design says the hook patches (section 3), named independently of the hook.
PATCHED: dict[str, tuple[Any, str]] = {
    "mx.eval": (mx, "eval"),
    "mx.synchronize": (mx, "synchronize"),
    # Found by the audit of blocking entry points (docs/coverage.md).
    **{f"mx.{n}": (mx, n)
       for n in ("async_eval", "save", "savez", "savez_compressed", "save_safetensors",
                 "save_gguf", "load", "clear_streams")},
    **{f"mx.array.{n}": (mx.array, n)
       for n in ("item", "tolist", "__bool__", "__int__", "__float__", "__complex__",
                 "__index__", "__format__", "__repr__", "__bytes__", "__array__",
                 "__dlpack__", "__getstate__")},
    **{f"mx.distributed.{n}": (mx.distributed, n)
       for n in ("all_sum", "all_gather", "all_max", "all_min", "sum_scatter", "send", "recv",
                 "recv_like", "init")},
}

if watchdog.current() is not None:  # MLX_WATCHDOG=1 in the test's own environment
    watchdog.uninstall()
ORIGINALS = {name: vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)
             for name, (owner, attr) in PATCHED.items()}


def current_functions() -> dict[str, Any]:
    return {name: vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)
            for name, (owner, attr) in PATCHED.items()}


def unpatched() -> list[str]:
    now = current_functions()
    return [name for name in PATCHED if now[name] is ORIGINALS[name]]


def patched() -> list[str]:
    now = current_functions()
    return [name for name in PATCHED if now[name] is not ORIGINALS[name]]


def force_restore() -> None:
    for name, (owner, attr) in PATCHED.items():
        setattr(owner, attr, ORIGINALS[name])


@pytest.fixture(autouse=True)
def launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No launch variables leak in from the environment that runs the tests."""
    for key in list(os.environ):
        if key.startswith("MLX_"):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    watchdog.uninstall()
    yield
    watchdog.uninstall()
    left = patched()
    if left:
        force_restore()
        pytest.fail(f"uninstall() left patched: {left}")
    assert faulthandler.unregister(signal.SIGUSR2) is False, "dump handler left registered"


# Every test here runs over both hot paths (compiled and pure Python): tests/conftest.py.
pytestmark = pytest.mark.usefixtures("hotpath")


@pytest.fixture
def hb(record_dir: Path, hotpath: str) -> watchdog.Heartbeat:
    beat = watchdog.install(str(record_dir))
    assert beat.active, "install() failed on a usable directory"
    return beat


def read(beat: watchdog.Heartbeat) -> record.Record:
    assert beat.path is not None
    return record.read_path(beat.path)


def warnings_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("mlx-watchdog:")]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MLX_") or k == "MLX_WATCHDOG_HOTPATH"}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def run_python(code: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          env=env or subprocess_env(), capture_output=True, text=True,
                          timeout=timeout)


# -- install ---------------------------------------------------------------------------------


def test_install_returns_a_heartbeat_and_opens_the_record(record_dir: Path) -> None:
    before = time.monotonic_ns()
    beat = watchdog.install(str(record_dir))
    assert isinstance(beat, watchdog.Heartbeat) and beat.active
    assert watchdog.current() is beat
    assert beat.path == str(record_dir / f"{os.getpid()}.rec")
    rec = read(beat)
    me = psutil.Process()
    assert (rec.pid, rec.uid, rec.start_time) == (os.getpid(), os.getuid(), me.create_time())
    assert rec.host == socket.gethostname()
    assert rec.job == f"pid{os.getpid()}"  # not a distributed launch: a job of one
    assert rec.dump_signal == signal.SIGUSR2
    assert rec.status == record.STATUS_OPEN
    assert rec.phase is Phase.RUNNING and rec.op == ""
    assert (rec.collectives, rec.waits_entered, rec.waits_completed, rec.steps) == (0, 0, 0, 0)
    assert before <= rec.last_progress_ns <= time.monotonic_ns()
    assert rec.flight == ()
    assert os.path.exists(record_dir / f"{os.getpid()}.stacks")
    assert sorted(patched()) == sorted(PATCHED)


def test_install_is_idempotent(hb: watchdog.Heartbeat, record_dir: Path) -> None:
    functions = current_functions()
    assert watchdog.install(str(record_dir)) is hb
    assert watchdog.install() is hb
    assert current_functions() == functions  # not wrapped twice
    mx.eval(mx.ones(2))
    assert read(hb).waits_entered == 1
    assert [n for n in os.listdir(record_dir) if n.endswith(".rec")] == [f"{os.getpid()}.rec"]


def test_install_takes_the_directory_and_job_from_the_environment(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLX_WATCHDOG_DIR", str(record_dir))
    monkeypatch.setenv("MLX_WATCHDOG_JOB", "train-42")
    monkeypatch.setenv("MLX_RANK", "2")
    beat = watchdog.install()
    assert beat.path == str(record_dir / f"{os.getpid()}.rec")
    rec = read(beat)
    assert (rec.job, rec.rank) == ("train-42", 2)


def test_a_launch_gives_rank_size_backend_and_a_shared_job_before_init(
        record_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([["127.0.0.1:5000"], ["127.0.0.1:5001"], ["127.0.0.1:5002"]]))
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    monkeypatch.setenv("MLX_RANK", "1")
    rec = read(watchdog.install(str(record_dir)))
    assert (rec.rank, rec.world_size, rec.backend) == (1, 3, "ring")
    assert rec.job.startswith("j") and rec.job == hook.job_id(dict(os.environ))
    # Another rank of the same launch (another MLX_RANK) derives the same job id.
    assert hook.job_id({"MLX_HOSTFILE": str(hostfile), "MLX_RANK": "0"}) == rec.job


def test_init_is_a_wait_and_fills_in_the_group(hb: watchdog.Heartbeat) -> None:
    group = mx.distributed.init()
    assert (group.rank(), group.size()) == (0, 1)
    rec = read(hb)
    assert (rec.rank, rec.world_size, rec.backend) == (0, 1, "single")
    assert (rec.waits_entered, rec.waits_completed) == (1, 1)
    assert rec.phase is Phase.RUNNING and rec.op == ""
    assert (rec.last_wait_ns, rec.max_wait_ns) == (0, 0)  # init has a deadline of its own


# -- counters ----------------------------------------------------------------------------------

WAIT_CALLS: dict[str, Callable[[mx.array], object]] = {
    "eval": lambda a: mx.eval(a),
    "synchronize": lambda a: mx.synchronize(),
    "item": lambda a: a[1].item(),
    "tolist": lambda a: a.tolist(),
    "bool": lambda a: bool(a[1]),
    "int": lambda a: int(a[1]),
    "float": lambda a: float(a[1]),
    "async_eval": lambda a: mx.async_eval(a),
    "complex": lambda a: complex(a[1]),
    "index": lambda a: [10, 11, 12][a[1]],
    "format scalar": lambda a: f"{a[1]:.1f}",
    "format array": lambda a: f"{a}",
    "str": lambda a: str(a),
    "repr": lambda a: repr(a),
    "bytes": lambda a: bytes(a),
    "__array__": lambda a: a.__array__().tolist(),
    "__dlpack__": lambda a: type(a.__dlpack__()).__name__,
    "pickle": lambda a: len(pickle.dumps(a)) > 100,
    "save": lambda a: mx.save(io.BytesIO(), a),
    "savez": lambda a: mx.savez(io.BytesIO(), a=a),
    "savez_compressed": lambda a: mx.savez_compressed(io.BytesIO(), a=a),
    "save_safetensors": lambda a: mx.save_safetensors(io.BytesIO(), {"a": a}),
    "load": lambda a: type(mx.load(io.BytesIO(NPY_BYTES), format="npy")).__name__,
}
_npy = io.BytesIO()
np.save(_npy, np.zeros(3, np.int32))
NPY_BYTES = _npy.getvalue()
SHOWN = "array([0, 2, 4], dtype=int32)"
WAIT_RESULTS = {"eval": None, "synchronize": None, "item": 2, "tolist": [0, 2, 4], "bool": True,
                "int": 2, "float": 2.0, "async_eval": None, "complex": 2 + 0j, "index": 12,
                "format scalar": "2.0", "format array": SHOWN, "str": SHOWN, "repr": SHOWN,
                "bytes": bytes([0] * 4 + [2, 0, 0, 0, 4, 0, 0, 0]), "__array__": [0, 2, 4],
                "__dlpack__": "PyCapsule", "pickle": True, "save": None, "savez": None,
                "savez_compressed": None, "save_safetensors": None, "load": "array"}


@pytest.mark.parametrize("name", list(WAIT_CALLS))
def test_each_blocking_call_is_one_completed_wait(hb: watchdog.Heartbeat, name: str) -> None:
    a = mx.arange(3) * 2
    before = read(hb)
    started = time.monotonic_ns()
    result = WAIT_CALLS[name](a)
    ended = time.monotonic_ns()
    assert result == WAIT_RESULTS[name]
    rec = read(hb)
    assert rec.waits_entered == before.waits_entered + 1
    assert rec.waits_completed == before.waits_completed + 1
    assert rec.collectives == before.collectives
    assert rec.phase is Phase.RUNNING and rec.op == "" and rec.wait_since_ns == 0
    assert started <= rec.last_progress_ns <= ended
    assert 0 < rec.last_wait_ns <= ended - started
    assert rec.max_wait_ns >= rec.last_wait_ns


FAILING_CALLS: dict[str, Callable[[], object]] = {
    "format spec on an array": lambda: f"{mx.ones(3):.2f}",
    "index of a float": lambda: [1, 2][mx.array(1.5)],
    "complex of many": lambda: complex(mx.ones(2)),
    "save to a bad path": lambda: mx.save("/nonexistent-dir/x.npy", mx.ones(2)),
    "load of garbage": lambda: mx.load(io.BytesIO(b"garbage"), format="npy"),
}


@pytest.mark.parametrize("name", list(FAILING_CALLS))
def test_errors_of_the_new_waits_pass_through_unchanged(record_dir: Path, name: str) -> None:
    def error() -> tuple[type, str]:
        with pytest.raises(Exception) as caught:
            FAILING_CALLS[name]()
        return caught.type, str(caught.value)

    plain = error()
    beat = watchdog.install(str(record_dir))
    assert error() == plain
    rec = read(beat)
    assert rec.waits_entered == rec.waits_completed >= 1 and rec.phase is Phase.RUNNING


def test_print_and_thread_teardown_are_waits(hb: watchdog.Heartbeat,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    a = mx.arange(3) * 2
    before = read(hb)
    print(a)
    assert capsys.readouterr().out == SHOWN + "\n"
    assert read(hb).waits_completed == before.waits_completed + 1
    # clear_streams() drops the calling thread's streams: run it where that harms nobody.
    worker = threading.Thread(target=mx.clear_streams)
    worker.start()
    worker.join()
    rec = read(hb)
    assert (rec.waits_entered, rec.waits_completed) == (before.waits_entered + 2,
                                                       before.waits_completed + 2)
    assert rec.phase is Phase.RUNNING


def test_save_gguf_is_a_wait(hb: watchdog.Heartbeat, tmp_path: Path) -> None:
    before = read(hb)
    mx.save_gguf(str(tmp_path / "a.gguf"), {"a": mx.arange(3, dtype=mx.float32)})
    assert read(hb).waits_completed == before.waits_completed + 1
    assert mx.load(str(tmp_path / "a.gguf"))["a"].tolist() == [0.0, 1.0, 2.0]


def test_counters_add_up_over_a_mixed_loop(hb: watchdog.Heartbeat) -> None:
    for i in range(10):
        x = mx.distributed.all_sum(mx.ones(4) * i)
        mx.eval(x)
        assert x[0].item() == i
        hb.step()
    rec = read(hb)
    assert (rec.collectives, rec.waits_entered, rec.waits_completed, rec.steps) == (10, 20, 20, 10)


def test_a_blocking_call_that_raises_passes_through_and_still_counts(
        hb: watchdog.Heartbeat) -> None:
    with pytest.raises(ValueError, match="length-1"):
        mx.ones(3).item()
    rec = read(hb)
    assert (rec.waits_entered, rec.waits_completed) == (1, 1)
    assert rec.phase is Phase.RUNNING


COLLECTIVE_CALLS = [
    ("all_sum", lambda: mx.distributed.all_sum(mx.ones(16, dtype=mx.int32)), "int32", 64,
     [1] * 16),
    ("all_gather", lambda: mx.distributed.all_gather(mx.ones((2, 3), dtype=mx.float16)),
     "float16", 12, [[1, 1, 1], [1, 1, 1]]),
    ("all_max", lambda: mx.distributed.all_max(mx.full(5, 3, dtype=mx.bfloat16)), "bfloat16",
     10, [3] * 5),
    ("all_min", lambda: mx.distributed.all_min(mx.full(3, 7, dtype=mx.uint8)), "uint8", 3,
     [7] * 3),
    ("sum_scatter", lambda: mx.distributed.sum_scatter(mx.ones(8, dtype=mx.float64)),
     "float64", 64, [1] * 8),
]


def test_collectives_are_counted_with_op_dtype_and_bytes(hb: watchdog.Heartbeat) -> None:
    group = mx.distributed.init()
    assert group.size() == 1
    outs = []
    before = time.monotonic_ns()
    for number, (_, call, _, _, _) in enumerate(COLLECTIVE_CALLS, start=1):
        outs.append(call())
        assert read(hb).collectives == number
    after = time.monotonic_ns()
    rec = read(hb)
    assert rec.waits_entered == 1  # only init: issuing a collective is lazy, not a wait
    assert [(c.number, c.op, c.dtype, c.nbytes) for c in rec.flight] == [
        (n, op, dtype, nbytes) for n, (op, _, dtype, nbytes, _) in
        enumerate(COLLECTIVE_CALLS, start=1)]
    issued = [c.issued_ns for c in rec.flight]
    assert issued == sorted(issued) and before <= issued[0] and issued[-1] <= after
    # The wrapped collectives return the real results (a group of one: the input itself).
    for out, (_, _, _, _, want) in zip(outs, COLLECTIVE_CALLS, strict=True):
        assert out.tolist() == want


def test_point_to_point_errors_pass_through_uncounted(hb: watchdog.Heartbeat) -> None:
    mx.distributed.init()
    a = mx.ones(4)
    with pytest.raises(ValueError, match="singleton"):
        mx.distributed.send(a, 0)
    with pytest.raises(ValueError, match="singleton"):
        mx.distributed.recv((4,), mx.float32, 0)
    with pytest.raises(ValueError, match="singleton"):
        mx.distributed.recv_like(a, 0)
    assert read(hb).collectives == 0


def test_flight_recorder_keeps_the_last_64_collectives(hb: watchdog.Heartbeat) -> None:
    for i in range(70):
        mx.distributed.all_sum(mx.ones(i + 1, dtype=mx.int8))
    rec = read(hb)
    assert rec.collectives == 70
    assert [c.number for c in rec.flight] == list(range(7, 71))
    assert [c.nbytes for c in rec.flight] == list(range(7, 71))
    assert {(c.op, c.dtype) for c in rec.flight} == {("all_sum", "int8")}


def test_step_counts(hb: watchdog.Heartbeat) -> None:
    for _ in range(5):
        hb.step()
    assert read(hb).steps == 5


# -- idle and expect ---------------------------------------------------------------------------


def test_idle_shows_in_the_record_and_ends_with_the_block(hb: watchdog.Heartbeat) -> None:
    started = time.monotonic_ns()
    with hb.idle():
        rec = read(hb)
        assert rec.phase is Phase.IDLE
        assert started <= rec.phase_since_ns <= time.monotonic_ns()
        mx.eval(mx.ones(2))  # a wait inside idle stays idle
        assert read(hb).phase is Phase.IDLE
        with hb.idle():
            pass
        assert read(hb).phase is Phase.IDLE  # the inner block does not end the outer one
    rec = read(hb)
    assert rec.phase is Phase.RUNNING and rec.waits_completed == 1


def test_expect_shows_in_the_record_and_nests(hb: watchdog.Heartbeat) -> None:
    before = time.monotonic_ns()
    with hb.expect(900, "checkpoint"):
        outer = read(hb)
        assert (outer.expect_seconds, outer.expect_reason) == (900.0, "checkpoint")
        assert before <= outer.expect_since_ns <= time.monotonic_ns()
        with hb.expect(2.5, "load shard"):
            inner = read(hb)
            assert (inner.expect_seconds, inner.expect_reason) == (2.5, "load shard")
            assert inner.expect_since_ns >= outer.expect_since_ns
        restored = read(hb)
        assert (restored.expect_seconds, restored.expect_since_ns, restored.expect_reason) == (
            outer.expect_seconds, outer.expect_since_ns, outer.expect_reason)
    rec = read(hb)
    assert (rec.expect_seconds, rec.expect_since_ns, rec.expect_reason) == (0.0, 0, "")


def test_expect_and_idle_end_when_the_block_raises(hb: watchdog.Heartbeat) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with hb.expect(60, "x"), hb.idle():
            assert read(hb).phase is Phase.IDLE
            raise Boom
    rec = read(hb)
    assert rec.phase is Phase.RUNNING
    assert (rec.expect_seconds, rec.expect_reason) == (0.0, "")


# -- uninstall ---------------------------------------------------------------------------------


def test_uninstall_restores_every_patched_function(record_dir: Path) -> None:
    assert unpatched() == list(PATCHED)
    beat = watchdog.install(str(record_dir))
    assert sorted(patched()) == sorted(PATCHED), "some function the design lists is not patched"
    mx.eval(mx.ones(1))
    path = beat.path
    assert path is not None and os.path.exists(path)
    watchdog.uninstall()
    assert unpatched() == list(PATCHED)
    assert not os.path.exists(path)
    assert os.listdir(record_dir) == []  # the empty .stacks file goes too
    assert watchdog.current() is None
    assert not beat.active
    # The restored functions work and no longer count.
    a = mx.arange(3)
    mx.eval(a)
    assert (a[2].item(), a.tolist(), bool(a[1]), int(a[2]), float(a[2])) == (2, [0, 1, 2], True,
                                                                           2, 2.0)
    assert (str(a), f"{a}", f"{a[1]:.1f}", [7, 8][a[1]], complex(a[1])) == (
        "array([0, 1, 2], dtype=int32)", "array([0, 1, 2], dtype=int32)", "1.0", 8, 1 + 0j)
    watchdog.uninstall()  # twice is harmless


def test_install_again_after_uninstall(record_dir: Path) -> None:
    first = watchdog.install(str(record_dir))
    watchdog.uninstall()
    second = watchdog.install(str(record_dir))
    assert second is not first and second.active
    mx.eval(mx.ones(1))
    assert read(second).waits_entered == 1
    assert sorted(patched()) == sorted(PATCHED)


def test_uninstall_leaves_a_function_someone_else_patched_later(
        hb: watchdog.Heartbeat, capsys: pytest.CaptureFixture[str]) -> None:
    ours = mx.eval

    def theirs(*args: object) -> None:
        ours(*args)

    mx.eval = theirs
    try:
        watchdog.uninstall()
        assert mx.eval is theirs
        assert any("re-patched" in w for w in warnings_in(capsys.readouterr().err))
        assert "mx.eval" not in unpatched()
        assert sorted(unpatched()) == sorted(set(PATCHED) - {"mx.eval"})
    finally:
        mx.eval = ORIGINALS["mx.eval"]


# -- the dump signal ---------------------------------------------------------------------------


def test_the_dump_signal_writes_every_thread_stack_next_to_the_record(
        hb: watchdog.Heartbeat, record_dir: Path) -> None:
    stacks = record_dir / f"{os.getpid()}.stacks"
    assert read(hb).dump_signal == signal.SIGUSR2
    os.kill(os.getpid(), signal.SIGUSR2)
    text = wait_for_text(stacks)
    assert "test_hook.py" in text and "most recent call first" in text
    watchdog.uninstall()
    assert stacks.exists(), "a dump is evidence and must outlive the record"


def wait_for_text(path: Path, timeout: float = 5) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            time.sleep(0.05)
            return path.read_text(errors="replace")
        time.sleep(0.02)
    raise AssertionError(f"nothing written to {path}")


@pytest.mark.parametrize("value, expected", [("0", 0), ("SIGUSR1", signal.SIGUSR1),
                                             ("USR1", signal.SIGUSR1),
                                             (str(int(signal.SIGUSR1)), signal.SIGUSR1)])
def test_the_dump_signal_is_configurable(record_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                         value: str, expected: int) -> None:
    monkeypatch.setenv("MLX_WATCHDOG_DUMP_SIGNAL", value)
    beat = watchdog.install(str(record_dir))
    assert read(beat).dump_signal == expected
    assert (record_dir / f"{os.getpid()}.stacks").exists() == bool(expected)
    watchdog.uninstall()
    if expected:
        assert faulthandler.unregister(expected) is False


def test_a_taken_dump_signal_only_turns_dumps_off(
        record_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    previous = signal.signal(signal.SIGUSR2, lambda *a: None)
    try:
        beat = watchdog.install(str(record_dir))
        assert beat.active and read(beat).dump_signal == 0
        assert len(warnings_in(capsys.readouterr().err)) == 1
        assert sorted(patched()) == sorted(PATCHED)
    finally:
        watchdog.uninstall()
        signal.signal(signal.SIGUSR2, previous)


@pytest.mark.parametrize("value", ["SIGKILL", "SIGSEGV", "99"])
def test_an_unusable_dump_signal_only_turns_dumps_off(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    # A bad MLX_WATCHDOG_DUMP_SIGNAL costs the stack dumps, not the whole instrumentation.
    monkeypatch.setenv("MLX_WATCHDOG_DUMP_SIGNAL", value)
    beat = watchdog.install(str(record_dir))
    assert beat.active, "a bad dump signal turned the whole hook off"
    assert read(beat).dump_signal == 0


@pytest.mark.slow
def test_a_planted_stacks_symlink_is_not_followed(record_dir: Path, tmp_path: Path) -> None:
    # The record directory is shared by every user's ranks: a symlink planted at
    # <pid>.stacks must not make the dump handler append to its target.
    victim = tmp_path / "victim"
    victim.write_text("")
    (record_dir / f"{os.getpid()}.stacks").symlink_to(victim)
    beat = watchdog.install(str(record_dir))
    assert beat.active
    if read(beat).dump_signal:
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.2)
    watchdog.uninstall()
    assert victim.read_text() == "", "the stack dump followed a planted symlink"


# -- fail-soft ---------------------------------------------------------------------------------


def user_code(beat: watchdog.Heartbeat) -> list[object]:
    """What a rank does; must behave the same whatever happened to the watchdog."""
    out: list[object] = []
    with beat.expect(10, "warm-up"), beat.idle():
        a = mx.arange(4) * 3
        mx.eval(a)
        out += [a[1].item(), a.tolist(), bool(a[1]), int(a[2]), float(a[3])]
    mx.synchronize()
    out.append(mx.distributed.all_sum(mx.ones(2)).tolist())
    beat.step()
    return out


USER_RESULT = [3, [0, 3, 6, 9], True, 6, 9.0, [1.0, 1.0]]


def unusable_dirs(tmp_path: Path) -> dict[str, Path]:
    regular = tmp_path / "a-file"
    regular.write_text("not a directory")
    return {"missing": tmp_path / "missing", "under a regular file": regular / "records",
            "a regular file": regular}


@pytest.mark.parametrize("kind", ["missing", "under a regular file", "a regular file"])
def test_an_unusable_directory_warns_once_and_patches_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    directory = unusable_dirs(tmp_path)[kind]
    beat = watchdog.install(str(directory))
    assert isinstance(beat, watchdog.Heartbeat) and not beat.active and beat.path is None
    assert watchdog.install(str(directory)) is beat
    assert unpatched() == list(PATCHED)
    assert user_code(beat) == USER_RESULT
    err = capsys.readouterr().err
    assert len(warnings_in(err)) == 1, err
    assert str(directory) in err or "Not a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


READ_ONLY = """
    import json, os, sys
    import mlx.core as mx
    import psutil  # install() imports it; after dropping root we may not reach site-packages
    import watchdog
    import watchdog.rank.hook  # likewise, in case the package imports it lazily

    directory = sys.argv[1]
    if os.getuid() == 0:
        os.setgid(65534)
        os.setuid(65534)
    assert not os.access(directory, os.W_OK), "the directory is writable: the test proves nothing"
    functions = [mx.eval, mx.array.__dict__["item"], mx.distributed.all_sum, mx.distributed.init]
    hb = watchdog.install(directory)
    again = watchdog.install(directory)
    with hb.expect(5, "x"), hb.idle():
        a = mx.arange(4) * 2
        mx.eval(a)
        values = [a[1].item(), a.tolist(), bool(a[1]), int(a[2]), float(a[3])]
    hb.step()
    group = mx.distributed.init()
    values.append(mx.distributed.all_sum(mx.ones(2)).tolist())
    now = [mx.eval, mx.array.__dict__["item"], mx.distributed.all_sum, mx.distributed.init]
    print(json.dumps(dict(uid=os.getuid(), active=hb.active, same=again is hb, values=values,
                          unpatched=all(x is y for x, y in zip(functions, now)),
                          files=os.listdir(directory))))
"""


@pytest.mark.slow
@pytest.mark.parametrize("dump_signal", ["SIGUSR2", "0"])
def test_a_read_only_directory_warns_once_and_the_rank_runs_normally(dump_signal: str) -> None:
    # As root every directory is writable, so the rank drops to uid 65534 first (and the
    # script checks os.access really fails). The directory lives under /tmp, which that
    # user can traverse; pytest's tmp_path cannot be.
    directory = tempfile.mkdtemp(prefix="mlxwd-ro-")
    try:
        os.chmod(directory, 0o755 if os.getuid() == 0 else 0o555)
        done = run_python(READ_ONLY, directory,
                          env=subprocess_env(MLX_WATCHDOG_DUMP_SIGNAL=dump_signal))
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["uid"] != 0
        assert result == dict(result, active=False, same=True, unpatched=True, files=[],
                              values=[2, [0, 2, 4, 6], True, 4, 6.0, [1.0, 1.0]])
        assert len(warnings_in(done.stderr)) == 1, done.stderr
        assert os.listdir(directory) == []
    finally:
        os.chmod(directory, 0o700)
        shutil.rmtree(directory)


FULL_DISK = """
    import json, os, sys
    import mlx.core as mx
    import watchdog

    directory = sys.argv[1]
    try:
        with open(os.path.join(directory, "filler"), "wb") as f:
            while True:
                f.write(b"x" * 4096)
                f.flush()
    except OSError:
        pass
    hb = watchdog.install(directory)
    a = mx.arange(4) * 2
    mx.eval(a)
    print(json.dumps(dict(active=hb.active, values=[a[1].item(), a.tolist()])), flush=True)
"""


def mount_tiny_tmpfs_and_run(mountpoint: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` with a full 64 KiB tmpfs at `mountpoint`, in a private mount namespace."""
    script = 'mount -t tmpfs -o size=64k mlxwd-full "$0" && exec "$1" -c "$2" "$0"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(mountpoint),
         sys.executable, textwrap.dedent(code)],
        env=subprocess_env(), capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_a_full_disk_never_reaches_the_rank(tmp_path: Path) -> None:
    # A record file that cannot get its blocks must fail install() (and warn), not kill
    # the rank with SIGBUS at its first write through the map.
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        pytest.skip("needs Linux mount namespaces")
    mountpoint = tmp_path / "full"
    mountpoint.mkdir()
    probe = mount_tiny_tmpfs_and_run(mountpoint, "pass")
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.strip()}")
    done = mount_tiny_tmpfs_and_run(mountpoint, FULL_DISK)
    assert done.returncode == 0, (
        f"the rank died (returncode {done.returncode}, -7/135 is SIGBUS): {done.stderr}")
    result = json.loads(done.stdout)
    assert result == dict(active=False, values=[2, [0, 2, 4, 6]])
    assert len(warnings_in(done.stderr)) == 1, done.stderr


FILE_SIZE_LIMITED = """
    import json, os, resource, signal, sys
    import mlx.core as mx
    import watchdog

    # Writes past 2 KiB now fail with EFBIG (SIGXFSZ ignored, as a shell or a
    # batch system may set it): the record's 4 KiB cannot get its blocks.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    hb = watchdog.install(sys.argv[1])
    a = mx.arange(4) * 2
    mx.eval(a)
    print(json.dumps(dict(active=hb.active, files=sorted(os.listdir(sys.argv[1])),
                          values=[a[1].item(), a.tolist()])), flush=True)
"""


@pytest.mark.slow
def test_a_record_that_cannot_get_its_blocks_never_reaches_the_rank(tmp_path: Path) -> None:
    # The same path as a full disk, on any POSIX machine: the allocation fails, install()
    # warns once and leaves no half-made file behind; the rank runs on uninstrumented.
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(FILE_SIZE_LIMITED),
                           str(tmp_path)], env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == dict(active=False, files=[], values=[2, [0, 2, 4, 6]])
    assert len(warnings_in(done.stderr)) == 1, done.stderr


def test_a_deleted_record_file_never_reaches_user_code(
        hb: watchdog.Heartbeat, capsys: pytest.CaptureFixture[str]) -> None:
    assert hb.path is not None
    os.unlink(hb.path)
    assert user_code(hb) == USER_RESULT
    watchdog.uninstall()
    assert unpatched() == list(PATCHED)
    assert warnings_in(capsys.readouterr().err) == []


def break_map(beat: watchdog.Heartbeat) -> None:
    writer = beat._writer
    assert writer is not None
    for view in writer._views:
        view.release()
    writer.words.release()


def test_a_broken_map_disables_the_record_with_one_warning(
        hb: watchdog.Heartbeat, capsys: pytest.CaptureFixture[str]) -> None:
    if hb.compiled:
        # The compiled path holds the map's buffer until it retires: the map cannot go
        # away under it, and the hook goes on recording.
        with pytest.raises(BufferError):
            break_map(hb)
        assert user_code(hb) == USER_RESULT
        assert hb.active and read(hb).waits_completed == hb.waits_completed > 0
        path = hb.path
        assert path is not None
        watchdog.uninstall()  # retires: lets go of the map, which closes; the record goes
        assert not os.path.exists(path)
        assert warnings_in(capsys.readouterr().err) == []
        return
    # What a map that went away looks like from Python: every store into it raises.
    break_map(hb)
    assert user_code(hb) == USER_RESULT
    assert user_code(hb) == USER_RESULT
    assert mx.distributed.all_sum(mx.ones(3)).tolist() == [1.0, 1.0, 1.0]
    assert not hb.active
    err = capsys.readouterr().err
    assert len(warnings_in(err)) == 1, err
    watchdog.uninstall()
    assert unpatched() == list(PATCHED)


@pytest.mark.parametrize("first", ["wait", "collective", "step", "idle"])
def test_a_failing_hot_path_never_reaches_user_code(
        hb: watchdog.Heartbeat, capsys: pytest.CaptureFixture[str], first: str) -> None:
    path = hb.path
    assert path is not None

    def broken_clock() -> int:
        raise OSError(5, "Input/output error")

    # The hot path binds the clock when it is built: rebuild it, and wrap MLX again.
    hb._clock = broken_clock  # type: ignore[method-assign]
    hb._build()
    patches.restore()
    patches.instrument(hb, mx)
    if first == "wait":
        assert (mx.arange(3) * 2).tolist() == [0, 2, 4]
    elif first == "collective":
        assert mx.distributed.all_sum(mx.ones(2)).tolist() == [1.0, 1.0]
    elif first == "step":
        hb.step()
    else:
        with hb.idle():
            pass
    assert user_code(hb) == USER_RESULT
    assert user_code(hb) == USER_RESULT
    err = capsys.readouterr().err
    if first != "step":  # step() needs no clock: the first failure comes with user_code
        assert not hb.active and hb.path is None
        assert len(warnings_in(err)) == 1, err
        # The record stays, saying the hook gave up, so no reader trusts its frozen counters.
        assert record.read_path(path).status == record.STATUS_ABANDONED
    watchdog.uninstall()
    assert unpatched() == list(PATCHED)


INTERRUPT = """
    import faulthandler, json, os, signal, sys
    import mlx.core as mx
    import watchdog
    from watchdog import record
    from watchdog.rank import hook

    directory, mode, budget = sys.argv[1], sys.argv[2], float(sys.argv[3])
    # A deadlock (the old lock) ends this process with every thread's stack.
    faulthandler.dump_traceback_later(budget, exit=True)
    hb = watchdog.install(directory)
    a = mx.ones(4)
    mx.eval(a)
    # The hot path's functions (and the v1 hook's, so the test can be run against it).
    # The wrappers of the waits below carry their entry point's name.
    HOT = {"wait", "collective", "init", "enter", "count", "enter_wait", "exit_wait", "step",
           "claim", "claim_index", "_update", "_set_words", "<lambda>", "eval", "item",
           "__bool__"}
    calls = {"all_sum": 0}

    def handler(signum, frame):
        if mode == "raise":
            raise KeyboardInterrupt  # what SIGINT's default handler does
        # A handler that calls into MLX while the rank is inside the hook.
        mx.eval(a)
        a[0].item()
        mx.distributed.all_sum(a)
        calls["all_sum"] += 1
        hb.step()
        with hb.idle(), hb.expect(1, "handler"):
            mx.eval(a)

    signal.signal(signal.SIGUSR1, handler)

    def work():
        mx.eval(a)
        a[1].item()
        mx.distributed.all_sum(a)
        calls["all_sum"] += 1
        hb.step()
        with hb.expect(5, "x"):
            mx.eval(a)
        with hb.idle():
            bool(a[2])

    class Inject:
        # The points where CPython delivers a signal to Python code: a function's
        # start (the "call" event) and the return of a C function ("c_return").
        # In "raise" mode only the hot path's points count; "nested" takes every
        # point of the hook and the record writer.
        def __init__(self, at):
            self.at, self.seen, self.where = at, 0, None

        def __call__(self, frame, event, arg):
            code = frame.f_code
            if event not in ("call", "c_return") or not code.co_filename.endswith(
                    ("watchdog/rank/hook.py", "watchdog/rank/hotpath.py",
                     "watchdog/rank/heartbeat.py", "watchdog/rank/slots.py",
                     "watchdog/rank/patches.py",
                     "watchdog/record/writer.py")):
                return
            if mode == "raise" and code.co_name not in HOT:
                return
            self.seen += 1
            if self.seen == self.at:
                self.where = f"{code.co_name}:{frame.f_lineno}:{event}"
                signal.raise_signal(signal.SIGUSR1)

    runs = interrupted = 0
    where = []
    while True:
        inject = Inject(runs + 1)
        sys.setprofile(inject)
        try:
            work()
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            sys.setprofile(None)
        if inject.where is None:
            break
        runs += 1
        where.append(inject.where)
        rec = record.read_path(hb.path)  # RecordBusy here: left mid-write
        bad = []
        if rec.phase.label != "running" or rec.wait_since_ns:
            bad.append(f"left {rec.phase.label} (wait since {rec.wait_since_ns})")
        if rec.waits_entered != rec.waits_completed:
            bad.append(f"entered {rec.waits_entered} != completed {rec.waits_completed}")
        if mode == "nested" and rec.collectives != calls["all_sum"]:
            bad.append(f"collectives {rec.collectives} != {calls['all_sum']}")
        # The next wait is seen, and closed.
        started = hb.enter_wait(record.OP_CODE["eval"])
        inside = record.read_path(hb.path)
        hb.exit_wait(started, record.OP_CODE["eval"])
        after = record.read_path(hb.path)
        if inside.phase.label != "wait" or inside.wait_since_ns != started:
            bad.append(f"next wait not seen: {inside.phase.label}")
        if after.phase.label != "running" or after.wait_since_ns:
            bad.append("next wait not closed")
        if bad:
            print(json.dumps(dict(error=bad, where=inject.where)), flush=True)
            sys.exit(1)
    print(json.dumps(dict(runs=runs, interrupted=interrupted, where=where)), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "nested"])
def test_a_signal_at_any_point_of_the_hook_never_blocks_or_corrupts_the_record(
        record_dir: Path, mode: str) -> None:
    # Why: with a lock on the hot path, KeyboardInterrupt right after acquire()
    # leaked the lock (the next wrapped call blocked forever), and a signal handler that
    # called into MLX while the hook held the lock deadlocked. Here a signal is delivered
    # at every point of the hook where CPython can deliver one, one point per run of a
    # rank's usual calls: the handler raises KeyboardInterrupt ("raise") or calls MLX and
    # the hook's API ("nested"). After each run the record must read, no wait may be left
    # open, and the next wait must be seen and closed.
    done = run_python(INTERRUPT, str(record_dir), mode, "30", timeout=90)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["runs"] >= 10, result  # every delivery point of one pass was tried
    if mode == "raise":
        assert result["interrupted"] == result["runs"]
    assert warnings_in(done.stderr) == [], done.stderr


# -- lazy install (zero-code activation): a process is published at its first wait ---------


def test_a_lazy_install_patches_now_and_publishes_at_the_first_wait(record_dir: Path) -> None:
    beat = watchdog.install(str(record_dir), lazy=True)
    assert beat.active and not beat.published and beat.path is None
    assert sorted(patched()) == sorted(PATCHED)
    assert os.listdir(record_dir) == []  # no record, no stack-dump file: not a rank yet
    a = mx.arange(3)
    assert a.tolist() == [0, 1, 2]
    assert beat.published and beat.path == str(record_dir / f"{os.getpid()}.rec")
    rec = read(beat)
    assert (rec.waits_entered, rec.waits_completed, rec.collectives) == (1, 1, 0)
    assert (rec.pid, rec.rank, rec.world_size) == (os.getpid(), -1, 0)
    assert sorted(os.listdir(record_dir)) == [f"{os.getpid()}.rec", f"{os.getpid()}.stacks"]


def test_a_lazy_open_rewraps_mlx_over_the_real_hot_path(record_dir: Path) -> None:
    """The opening functions cost an extra call; once open, MLX is wrapped anew."""
    beat = watchdog.install(str(record_dir), lazy=True)
    before = mx.eval
    opening = beat._wait
    mx.eval(mx.array(1))
    assert beat.published and beat._wait is not opening
    assert mx.eval is not before and sorted(patched()) == sorted(PATCHED)
    free_vars = dict(zip(mx.eval.__code__.co_freevars,
                         (c.cell_contents for c in mx.eval.__closure__ or ()), strict=True))
    assert free_vars["bracket"] is beat._wait  # bound to the real hot path
    mx.eval(mx.array(2))
    assert read(beat).waits_completed == 2
    watchdog.uninstall()
    assert not patched()  # the re-wrapped functions come off like the first ones


@pytest.mark.parametrize("first", ["collective", "step", "idle", "expect"])
def test_a_lazy_record_opens_on_any_sign_of_a_rank(record_dir: Path, first: str) -> None:
    beat = watchdog.install(str(record_dir), lazy=True)
    if first == "collective":
        mx.distributed.all_sum(mx.ones(2))
    elif first == "step":
        beat.step()
    elif first == "idle":
        with beat.idle():
            assert read(beat).phase is Phase.IDLE
    else:
        with beat.expect(30, "checkpoint"):
            assert read(beat).expect_reason == "checkpoint"
    rec = read(beat)
    assert (rec.collectives, rec.steps) == (int(first == "collective"), int(first == "step"))
    assert rec.phase is Phase.RUNNING


def test_an_explicit_install_opens_a_lazy_record(record_dir: Path) -> None:
    lazy = watchdog.install(str(record_dir), lazy=True)
    assert watchdog.install(str(record_dir)) is lazy
    assert lazy.published and os.path.exists(str(lazy.path))
    assert read(lazy).waits_entered == 0


def test_a_lazy_install_that_never_waits_leaves_nothing(record_dir: Path) -> None:
    beat = watchdog.install(str(record_dir), lazy=True)
    watchdog.uninstall()
    assert unpatched() == list(PATCHED)
    assert not beat.active and not beat.published
    beat.step()  # after uninstall: still nothing opens
    assert os.listdir(record_dir) == []


def test_a_lazy_record_that_cannot_open_warns_once_and_the_rank_runs(
        record_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    beat = watchdog.install(str(record_dir), lazy=True)
    record_dir.rmdir()  # gone between install and the first wait
    a = mx.arange(3)
    assert (a.tolist(), a[1].item(), f"{a[2]}") == ([0, 1, 2], 1, "2")
    beat.step()
    warnings = warnings_in(capsys.readouterr().err)
    assert len(warnings) == 1 and "not instrumenting" in warnings[0], warnings
    assert not beat.published and beat.path is None
    record_dir.mkdir()


def test_a_no_op_heartbeat_runs_user_code() -> None:
    beat = watchdog.Heartbeat(None)
    assert not beat.active and beat.path is None
    assert user_code(beat) == USER_RESULT
    beat.close()


# -- the process boundary ----------------------------------------------------------------------

EXIT = """
    import os, sys
    import mlx.core as mx
    import watchdog

    hb = watchdog.install(sys.argv[1])
    mx.eval(mx.ones(2))
    print(hb.path, flush=True)
    if sys.argv[2] == "os._exit":
        os._exit(0)
"""


@pytest.mark.slow
def test_a_clean_exit_removes_the_record(record_dir: Path) -> None:
    done = run_python(EXIT, str(record_dir), "return")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(".rec")
    assert os.listdir(record_dir) == []


@pytest.mark.slow
def test_an_exit_without_cleanup_leaves_the_record_open(record_dir: Path) -> None:
    done = run_python(EXIT, str(record_dir), "os._exit")
    assert done.returncode == 0, done.stderr
    rec = record.read_path(done.stdout.strip())
    assert rec.status == record.STATUS_OPEN and rec.waits_completed == 1


ZERO = """
    import json, os, sys
    import mlx.core as mx

    mx.eval(mx.ones(2))
    hook = sys.modules.get("watchdog.rank.hook")
    hb = hook.current() if hook else None
    print(json.dumps(dict(
        watchdog=sorted(m for m in sys.modules if m == "watchdog" or m.startswith("watchdog.")),
        active=bool(hb and hb.active), path=hb.path if hb else None,
        records=sorted(os.listdir(sys.argv[1])))))
"""


@pytest.mark.slow
def test_zero_code_activation_instruments_a_script_that_never_imports_watchdog(
        record_dir: Path) -> None:
    done = run_python(ZERO, str(record_dir), env=subprocess_env(
        MLX_WATCHDOG="1", MLX_WATCHDOG_DIR=str(record_dir)))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["active"] and Path(result["path"]).parent == record_dir
    assert Path(result["path"]).name in result["records"]
    assert warnings_in(done.stderr) == []
    assert os.listdir(record_dir) == []  # and the exit removed it


@pytest.mark.slow
@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_mlx_watchdog_nothing_is_loaded(record_dir: Path, value: str | None) -> None:
    extra = {"MLX_WATCHDOG_DIR": str(record_dir)}
    if value is not None:
        extra["MLX_WATCHDOG"] = value
    done = run_python(ZERO, str(record_dir), env=subprocess_env(**extra))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == dict(watchdog=[], active=False, path=None, records=[])
    assert done.stderr == ""


def test_mlx_watchdog_costs_a_process_without_mlx_nothing_but_a_finder(
        record_dir: Path) -> None:
    # `_autoload` promises processes that never import mlx "one finder lookup"; importing
    # `watchdog/__init__` eagerly pulls in the hook (hashlib, json, socket, ...: ~20 ms here).
    done = run_python("""
        import sys
        print(sorted(m for m in sys.modules if m.startswith(("watchdog", "mlx", "psutil"))))
    """, env=subprocess_env(MLX_WATCHDOG="1", MLX_WATCHDOG_DIR=str(record_dir)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['watchdog', 'watchdog._autoload']"
    assert os.listdir(record_dir) == []


@pytest.mark.slow
def test_zero_code_activation_with_an_unusable_directory_only_warns(tmp_path: Path) -> None:
    done = run_python(ZERO, str(tmp_path), env=subprocess_env(
        MLX_WATCHDOG="1", MLX_WATCHDOG_DIR=str(tmp_path / "missing")))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["active"] is False
    assert len(warnings_in(done.stderr)) == 1, done.stderr



def test_waits_inside_idle_or_expect_do_not_stretch_the_learned_deadline(
        hb: watchdog.Heartbeat) -> None:
    x = mx.ones(4)
    mx.eval(x)
    usual = read(hb).max_wait_ns
    for stretch in (hb.idle(), hb.expect(60, "checkpoint")):
        with stretch:
            started = hb.enter_wait(record.OP_CODE["eval"])
            hb.exit_wait(started - 5 * 10**9, record.OP_CODE["eval"])  # it "took" 5 s
    assert read(hb).max_wait_ns == usual
    started = hb.enter_wait(record.OP_CODE["eval"])
    hb.exit_wait(started - 5 * 10**9, record.OP_CODE["eval"])
    assert read(hb).max_wait_ns >= 5 * 10**9  # outside them it counts


def test_every_completed_wait_is_counted_in_the_pace_table_by_op(
        hb: watchdog.Heartbeat) -> None:
    """The daemon learns a job's pace from these counts: every wait, however short."""
    def pace() -> dict[str, tuple[int, int]]:
        got = read(hb).pace
        assert got is not None, "a v3 record publishes its pace"
        return {p.op: (p.waits, p.longest_ns) for p in got}

    before = pace()
    x = mx.ones(4)
    for _ in range(25):
        mx.eval(x + 1)
    (x[0] + 2).item()
    after = pace()
    assert after["eval"][0] - before.get("eval", (0, 0))[0] == 25
    assert after["item"][0] - before.get("item", (0, 0))[0] == 1
    assert 0 < after["eval"][1] < 10**9  # the longest: a real duration, in ns
    started = hb.enter_wait(record.OP_CODE["tolist"])
    hb.exit_wait(started - 3 * 10**9, record.OP_CODE["tolist"])  # it "took" 3 s
    assert pace()["tolist"] == (1 + before.get("tolist", (0, 0))[0], pytest.approx(
        3 * 10**9, abs=10**8))
    # Waits of init, idle() and expect() are not the pace: nothing counted.
    counted = pace()
    with hb.idle():
        mx.eval(x + 3)
    with hb.expect(60, "checkpoint"):
        mx.eval(x + 4)
    started = hb.enter_wait(record.OP_CODE["init"])
    hb.exit_wait(started, record.OP_CODE["init"])
    assert pace() == counted
    # A wait nested in another on the same thread is part of it: only the outer counts.
    outer = hb.enter_wait(record.OP_CODE["eval"])
    inner = hb.enter_wait(record.OP_CODE["item"])
    hb.exit_wait(inner, record.OP_CODE["item"])
    hb.exit_wait(outer, record.OP_CODE["eval"])
    assert pace()["eval"][0] == counted["eval"][0] + 1
    assert pace()["item"] == counted["item"]


# -- threads -----------------------------------------------------------------------------------


def test_a_wait_on_one_thread_is_judged_while_another_thread_makes_progress(
        hb: watchdog.Heartbeat) -> None:
    # Record v2: each thread has its slot. The wait clock is the oldest open wait's, and a
    # completion on any thread counts as progress. (v1 restarted the wait clock on every
    # completion of any thread, so a thread hung next to a busy one was never judged.)
    a = mx.ones(4)
    mx.eval(a)
    started, waiting, release = [0], threading.Event(), threading.Event()

    def hung() -> None:
        started[0] = hb.enter_wait(record.OP_CODE["recv"])  # as a collective's wait would
        waiting.set()
        release.wait(30)
        hb.exit_wait(started[0], record.OP_CODE["recv"])

    thread = threading.Thread(target=hung)
    thread.start()
    try:
        assert waiting.wait(30)
        before = read(hb)
        for _ in range(20):  # the main thread keeps completing waits
            mx.eval(a)
            assert a[0].item() == 1.0
        during = read(hb)
        assert during.phase is Phase.WAIT and during.op == "recv"
        assert during.wait_since_ns == started[0] == before.wait_since_ns
        assert during.waiting_threads == 1
        assert during.waits_completed == before.waits_completed + 40  # progress counts
        assert during.last_progress_ns > before.last_progress_ns
        # A wait on the main thread now is younger: the oldest one is still judged.
        outer = hb.enter_wait(record.OP_CODE["eval"])
        both = read(hb)
        assert both.waiting_threads == 2 and both.wait_since_ns == started[0] < outer
        hb.exit_wait(outer, record.OP_CODE["eval"])
    finally:
        release.set()
        thread.join()
    after = read(hb)
    assert after.phase is Phase.RUNNING and after.wait_since_ns == 0
    assert after.waits_entered == after.waits_completed


def test_a_thread_gets_its_own_slot_and_gives_it_back_when_it_ends(
        hb: watchdog.Heartbeat) -> None:
    mx.eval(mx.ones(1))  # the main thread's slot
    owners: list[int] = []

    def work() -> None:
        mx.eval(mx.ones(2))
        mx.distributed.all_sum(mx.ones(2))
        owners.append(threading.get_native_id())

    for _ in range(3 * layout.THREAD_SLOTS):  # more threads than slots, one after another
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    rec = read(hb)
    assert rec.waits_completed == 1 + 3 * layout.THREAD_SLOTS
    assert rec.collectives == 3 * layout.THREAD_SLOTS
    assert len(rec.flight) == min(64, rec.collectives)
    assert hb._threads.free, "an ended thread's slot was not given back"
    raw = Path(hb.path or "").read_bytes()
    slot_owner = [int.from_bytes(raw[layout.SLOTS_OFFSET + k * layout.SLOT_SIZE:][:8], "little")
                  for k in range(layout.THREAD_SLOTS)]
    assert slot_owner[0] == threading.get_native_id()
    assert slot_owner[1] == owners[-1]  # the one free slot, taken again and again
    assert set(slot_owner[2:]) == {0}


def test_more_threads_than_slots_at_once_warn_once_and_never_break(
        hb: watchdog.Heartbeat, capsys: pytest.CaptureFixture[str]) -> None:
    count = layout.THREAD_SLOTS + 3
    inside, release = threading.Barrier(count + 1), threading.Event()

    def work() -> None:
        started = hb.enter_wait(record.OP_CODE["eval"])
        inside.wait(30)
        release.wait(30)
        hb.exit_wait(started, record.OP_CODE["eval"])
        assert (mx.arange(3) * 2).tolist() == [0, 2, 4]

    threads = [threading.Thread(target=work) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        inside.wait(30)
        rec = read(hb)
        assert rec.waiting_threads == layout.THREAD_SLOTS  # the others are not recorded
    finally:
        release.set()
        for thread in threads:
            thread.join()
    rec = read(hb)
    assert rec.phase is Phase.RUNNING and hb.active
    assert len(warnings_in(capsys.readouterr().err)) == 1
