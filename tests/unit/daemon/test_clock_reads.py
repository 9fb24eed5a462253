"""Time read through the daemon's one clock (daemon/clock.py), never around it: what the
auto deadline learned is written at most every SAVE_EVERY of the loop's clock, a fence's
`since` is the loop's wall time, old evidence is pruned by it. The one exception: a
native sampler, a real process, is waited on in real time (a test's fake clock would
never end its time box)."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.support.fakes import FakeClock, FakeProbe, FakeSignaller
from watchdog.daemon import roomkeeper
from watchdog.daemon.act import evidence, peers, responses
from watchdog.daemon.config import Settings
from watchdog.daemon.judge.deadlines import Learned
from watchdog.daemon.store import learning

READERS = (peers, learning, evidence, responses, roomkeeper)
CLOCK_CALLS = {"time", "monotonic", "monotonic_ns", "sleep", "perf_counter"}


def test_the_clock_is_never_read_around_the_injected_one():
    """`time.time()` and friends are only defaults of a `clock`/`wall`/`sleep` parameter,
    never called: the loop's clock (a fake in tests) is the one these modules read."""
    called = []
    for module in READERS:
        path = Path(module.__file__ or "")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "time" \
                    and node.func.attr in CLOCK_CALLS:
                called.append(f"{path.name}:{node.lineno}: time.{node.func.attr}()")
    assert called == []


def test_what_was_learned_is_written_by_the_loops_clock(tmp_path):
    clock = FakeClock()
    keeper = learning.Keeper(str(tmp_path), clock.wall(), clock=clock.now)
    detector = SimpleNamespace(changed={"j1"}, learned={"j1": {"eval": Learned(5.0, 3)}})
    path = tmp_path / learning.FILE
    keeper.keep(detector, clock.wall())
    assert path.exists()  # the first thing learned is written at once
    path.unlink()
    detector.changed, detector.learned["j1"]["eval"] = {"j1"}, Learned(6.0, 4)
    clock.advance(learning.SAVE_EVERY - 1)
    keeper.keep(detector, clock.wall())
    assert not path.exists()  # within SAVE_EVERY of the fake clock: not yet
    clock.advance(1)
    keeper.keep(detector, clock.wall())
    assert "j1" in json.loads(path.read_text())["jobs"]


def test_a_fences_since_is_the_loops_wall_time(tmp_path, monkeypatch):
    from watchdog.net import fence

    monkeypatch.setattr(fence, "send", lambda *args: [])
    clock = FakeClock(start=50.0, wall_origin=1.8e9)
    settings = Settings(state_dir=str(tmp_path), peers=("mac-2:9753",), secret="s" * 24)
    asked = peers.Peers(settings, "mac-1", None, 0.0,  # type: ignore[arg-type]
                        clock=clock.now, wall=clock.wall)
    future = asked.fence(501, "j1", "stalled: in all_sum", None)
    assert future is not None and future.result(timeout=10) == []
    assert asked.fenced_since(501, "j1") == 1.8e9 + 50.0


def test_evidence_is_pruned_by_the_loops_wall_time(tmp_path):
    """An incident folder 40 days old by the fake wall clock is removed at the next capture
    (the real clock would keep it: its files were just written)."""
    clock = FakeClock(wall_origin=1.7e9 + 40 * 86400)
    old = tmp_path / "evidence" / "20260101T000000-abcdef"
    old.mkdir(parents=True)
    (old / "rank0-pid1-python.txt").write_text("x")
    now = clock.wall() - 40 * 86400
    os.utime(old / "rank0-pid1-python.txt", (now, now))
    os.utime(old, (now, now))
    taker = evidence.Evidence(str(tmp_path), 1.0, FakeSignaller(), FakeProbe(),
                              clock=clock.now, sleep=clock.sleep, wall=clock.wall)
    taker.capture("20260201T000000-fedcba", [])
    assert not old.exists()
    assert (tmp_path / "evidence" / "20260201T000000-fedcba").is_dir()


def test_the_samplers_output_is_drained_for_its_seconds_by_the_given_clock(tmp_path):
    """The time box on the given clock: already past there, nothing is read, time ran
    out (the real clock says there is a minute left)."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "print('frames')"], stdout=subprocess.PIPE)
    try:
        with open(tmp_path / "out", "wb") as dst:
            assert not evidence._drain(proc, dst, 1 << 20, 60,
                                       clock=iter([0.0, 120.0, 240.0]).__next__)
    finally:
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert (tmp_path / "out").read_bytes() == b""
