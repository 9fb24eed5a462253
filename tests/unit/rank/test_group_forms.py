"""The job, rank and size a record publishes are settled when the group forms: exo sets
MLX_HOSTFILE and MLX_RANK in os.environ right before `mx.distributed.init`, in a file it
deletes right after, long after the hook opened the record. The init wrapper is run over
a stand-in for MLX's init (the group it would form), on a real record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from watchdog import record
from watchdog.rank import patches
from watchdog.rank.env import workload
from watchdog.rank.heartbeat import Heartbeat
from watchdog.record import RecordWriter

INSTANCE = "9d0e5c1a-1111-4222-8333-444455556666"


class Group:
    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


@pytest.fixture
def beat(tmp_path):
    path = str(tmp_path / "4242.rec")
    writer = RecordWriter(path, pid=os.getpid(), start_time=1.7e9, uid=os.getuid(),
                          host="mac-1", job=f"pid{os.getpid()}", rank=-1, world_size=0,
                          backend="", dump_signal=0, workload=workload())
    hb = Heartbeat(writer)
    yield hb, path
    hb.close()


def exo_hostfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What exo's runner does just before init (utils_mlx.mlx_distributed_init)."""
    path = tmp_path / "tmpdir" / f"hosts_{INSTANCE}_1.json"
    path.parent.mkdir()
    path.write_text(json.dumps(["10.77.0.1:52417", "0.0.0.0:52417"]))
    monkeypatch.setenv("MLX_HOSTFILE", str(path))
    monkeypatch.setenv("MLX_RANK", "1")
    return path


def test_the_launch_exo_sets_at_init_is_the_job_while_init_connects_and_after(
        beat, tmp_path, monkeypatch):
    hb, path = beat
    monkeypatch.delenv("MLX_WATCHDOG_JOB", raising=False)
    before = record.read_path(path)
    assert before.job == f"pid{os.getpid()}" and before.rank == -1
    during = {}

    def init(strict: bool = False, backend: str = "any") -> Group:
        during["record"] = record.read_path(path)  # what the daemon sees if init hangs
        return Group(1, 2)

    hostfile = exo_hostfile(tmp_path, monkeypatch)
    group = patches._wrap_init(hb, init)(backend="ring", strict=True)
    hostfile.unlink()  # exo's temporary directory goes right after init
    after = record.read_path(path)
    seen = during["record"]
    assert (seen.job, seen.rank, seen.world_size, seen.backend) == (
        f"exo-{INSTANCE}", 1, 2, "ring")
    assert seen.phase.label == "init"
    assert (after.job, after.rank, after.world_size, after.backend) == (
        f"exo-{INSTANCE}", group.rank(), group.size(), "ring")
    assert after.workload == workload() and after.workload.startswith("w")


def test_the_group_corrects_what_the_environment_said(beat, tmp_path, monkeypatch):
    hb, path = beat
    exo_hostfile(tmp_path, monkeypatch)  # says rank 1 of 2
    patches._wrap_init(hb, lambda **kw: Group(0, 4))(backend="any")
    after = record.read_path(path)
    assert (after.rank, after.world_size) == (0, 4)


def test_a_job_the_user_named_stays(beat, tmp_path, monkeypatch):
    hb, path = beat
    exo_hostfile(tmp_path, monkeypatch)
    monkeypatch.setenv("MLX_WATCHDOG_JOB", "serve-llama")
    patches._wrap_init(hb, lambda **kw: Group(1, 2))()
    assert record.read_path(path).job == "serve-llama"
    monkeypatch.delenv("MLX_WATCHDOG_JOB")
    hb.pinned_job = "named-by-install"  # watchdog.install(job=...)
    patches._wrap_init(hb, lambda **kw: Group(1, 2))()
    assert record.read_path(path).job == "named-by-install"


def test_an_init_that_raises_still_leaves_the_launch_s_job_and_raises_unchanged(
        beat, tmp_path, monkeypatch):
    hb, path = beat
    monkeypatch.delenv("MLX_WATCHDOG_JOB", raising=False)
    exo_hostfile(tmp_path, monkeypatch)

    def init(**kw: object) -> Group:
        raise RuntimeError("[ring] couldn't connect")

    with pytest.raises(RuntimeError, match="couldn't connect"):
        patches._wrap_init(hb, init)(backend="ring")
    assert record.read_path(path).job == f"exo-{INSTANCE}"


def test_what_another_thread_queued_is_written_before_init_may_hold_the_gil(
        beat, monkeypatch):
    """exo's runner puts `RunnerConnecting` on a multiprocessing.Queue just before init;
    its feeder thread writes it to the pipe only when it gets the GIL, which MLX's ring
    init keeps while rank 0 blocks in accept(): the wrapper yields the GIL first, then
    calls MLX's (the report is out of the process when init begins)."""
    import multiprocessing

    hb, _ = beat
    # The yield made long here so the feeder gets its turn on a loaded machine too.
    monkeypatch.setattr(patches, "INIT_YIELD", 0.5)
    calls = []
    real_sleep = patches.time.sleep
    monkeypatch.setattr(patches.time, "sleep",
                        lambda s: calls.append(("yield", s)) or real_sleep(s))
    queue: multiprocessing.Queue = multiprocessing.Queue()
    queue.put("warm")  # the feeder thread running, as exo's channel's is
    assert queue.get(timeout=5) == "warm"

    def init(**kwargs) -> Group:  # MLX's: from here the GIL may be held for ever
        calls.append(("init", queue._reader.poll(0)))
        return Group(0, 2)

    queue.put("RunnerConnecting")
    patches._wrap_init(hb, init)(backend="ring")
    assert calls == [("yield", patches.INIT_YIELD), ("init", True)], calls
    queue.close()
    queue.join_thread()
