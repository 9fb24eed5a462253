"""A failed or stuck escalation must not leave a hang unhandled (pure: fakes for the
process, the signals and the clock; the real Daemon, record files and threads)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.fakes import DIES_ON_TERM, FakeClock, FakeProbe, FakeSignaller, process_sample
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.record import OP_CODE, RecordWriter
from watchdog.states import Phase

PID, START = 4242, 1.7e9


def hung_rank(record_dir: Path, clock: FakeClock) -> RecordWriter:
    """A rank in an all_sum wait since the fake clock's start."""
    since = int(clock.now() * 1e9)
    w = RecordWriter(str(record_dir / f"{PID}.rec"), pid=PID, start_time=START,
                     uid=os.getuid(), host="h", job="j", rank=0, world_size=1,
                     backend="ring", dump_signal=0)
    w.begin()
    w.write_hot(5, 5, 4, 0, Phase.WAIT, OP_CODE["eval"], since, since, since, 0, 0)
    w.end()
    return w


@pytest.fixture
def setup(tmp_path: Path):
    record_dir, state_dir = tmp_path / "rec", tmp_path / "state"
    record_dir.mkdir()
    state_dir.mkdir(mode=0o700)
    clock = FakeClock()
    probe = FakeProbe(wired=None)
    signaller = FakeSignaller({PID: DIES_ON_TERM})
    settings = Settings(dir=str(record_dir), state_dir=str(state_dir), deadline=2.0,
                        grace=0.2, kill_timeout=0.2, evidence_timeout=0.2, settle=0.0)
    daemon = Daemon(settings, probe, signaller, clock_ns=lambda: int(clock.now() * 1e9),
                    wall=clock.wall)
    writer = hung_rank(record_dir, clock)
    cpu = [0.0]

    def tick(seconds: float = 1.0) -> None:
        """The rank's polling thread spins for `seconds`, then the daemon scans."""
        clock.advance(seconds)
        cpu[0] += seconds
        if signaller.alive_pids:
            probe.set_sample(process_sample(PID, START, os.getuid(), "running",
                                            ((PID, 0.01), (PID + 1, cpu[0]))))
        else:
            probe.remove(PID)
        daemon.scan()

    yield daemon, signaller, tick
    writer.close(0, remove=False)
    daemon.executor.shutdown(wait=True)


def settle(daemon: Daemon) -> None:
    deadline = time.monotonic() + 10
    while any(r.working for r in daemon.pending) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_failed_escalation_is_tried_again(setup, monkeypatch) -> None:
    daemon, signaller, tick = setup
    real = daemon.enforcer.begin
    calls = []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(daemon.enforcer, "begin", fails_once)
    for _ in range(6):
        tick()
        settle(daemon)
    assert len(calls) >= 2, "the hang was given up after one failed escalation"
    assert signaller.signals_to(PID)[-1] in ("SIGTERM", "SIGKILL")
    assert PID not in signaller.alive_pids


def test_a_stuck_escalation_is_tried_again_beside_it(setup, monkeypatch) -> None:
    daemon, signaller, tick = setup
    real = daemon.enforcer.capture
    release = []

    def stuck_once(*args, **kwargs):
        if not release:
            release.append(1)
            while len(release) < 2:  # until the test ends: a sampler that never returns
                time.sleep(0.01)
            return []
        return real(*args, **kwargs)

    monkeypatch.setattr(daemon.enforcer, "capture", stuck_once)
    try:
        for _ in range(4):
            tick()
        assert release and PID in signaller.alive_pids  # stuck in the first escalation
        tick(daemon._escalation_bound() + 1)  # long past any escalation's own bounds
        for _ in range(3):
            tick()
            settle(daemon)
        assert PID not in signaller.alive_pids, "the stuck escalation blocked the kill"
    finally:
        release.append(2)
