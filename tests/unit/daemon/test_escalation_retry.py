"""A failed or stuck escalation must not leave a hang unhandled (pure: fakes for the
process, the signals and the clock; the real Daemon, record files and threads)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from tests.support.fakes import (
    DIES_ON_KILL,
    DIES_ON_TERM,
    FakeClock,
    FakeProbe,
    FakeSignaller,
    process_sample,
)
from tests.support.records import SyntheticWriter
from watchdog.daemon.act.ladder import EVIDENCE_SLACK, Step
from watchdog.daemon.clock import Clock
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.daemon.store import journal
from watchdog.record import OP_CODE
from watchdog.states import Phase, State

PID, START = 4242, 1.7e9


def hung_rank(record_dir: Path, clock: FakeClock) -> SyntheticWriter:
    """A rank in an all_sum wait since the fake clock's start."""
    since = int(clock.now() * 1e9)
    w = SyntheticWriter(str(record_dir / f"{PID}.rec"), pid=PID, start_time=START,
                     uid=os.getuid(), host="h", job="j", rank=0, world_size=1,
                     backend="ring", dump_signal=0)
    w.begin()
    w.write_hot(5, 5, 4, 0, Phase.WAIT, OP_CODE["eval"], since, since, since, 0, 0)
    w.end()
    return w


def node(tmp_path: Path, behaviour: str, **settings: float
         ) -> tuple[Daemon, FakeSignaller, FakeClock, FakeProbe, SyntheticWriter]:
    """A daemon on fakes of the process, the signals and the clock, and its hung rank."""
    record_dir, state_dir = tmp_path / "rec", tmp_path / "state"
    record_dir.mkdir()
    state_dir.mkdir(mode=0o700)
    clock = FakeClock()
    probe = FakeProbe(wired=None)
    signaller = FakeSignaller({PID: behaviour})
    daemon = Daemon(Settings(dir=str(record_dir), state_dir=str(state_dir), deadline=2.0,
                             evidence_timeout=0.2, settle=0.0, **settings),
                    probe, signaller, clock=Clock(lambda: int(clock.now() * 1e9), clock.wall))
    return daemon, signaller, clock, probe, hung_rank(record_dir, clock)


@pytest.fixture
def setup(tmp_path: Path):
    daemon, signaller, clock, probe, writer = node(tmp_path, DIES_ON_TERM, grace=0.2,
                                                   kill_timeout=0.2)
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
    # The last signal that ends (the SIGCONT after a SIGTERM only resumes it to act on it).
    assert [s for s in signaller.signals_to(PID) if s != "SIGCONT"][-1] in ("SIGTERM", "SIGKILL")
    assert PID not in signaller.alive_pids


def test_a_stuck_capture_does_not_hold_the_kill(setup, monkeypatch) -> None:
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
        until = time.monotonic() + 10  # the capture starts on an evidence worker
        while not release and time.monotonic() < until:
            time.sleep(0.01)
        assert release and PID in signaller.alive_pids  # stuck in the first escalation
        # Issue 30, item 1: past the evidence's time box from the verdict (real time:
        # the enforcer's clock), the ladder goes on without it.
        time.sleep(daemon.settings.evidence_timeout + EVIDENCE_SLACK + 0.1)
        for _ in range(10):  # a few ticks (more on a loaded machine)
            tick()
            settle(daemon)
            if PID not in signaller.alive_pids:
                break
        assert PID not in signaller.alive_pids, "the stuck escalation blocked the kill"
        # Issue 30, item 1: acted on without the evidence once its time box from the
        # verdict ran out, and journaled, not dropped and begun again.
        for _ in range(20):
            if journal.read_incidents(daemon.settings.state_dir)[0]:
                break
            tick()
            settle(daemon)
        (incident,) = journal.read_incidents(daemon.settings.state_dir)[0]
        assert "not gathered within" in incident.evidence_error
        assert incident.outcome == {str(PID): "killed"}
    finally:
        release.append(2)


# -- the ladder is steps the loop takes -------------------------------------------------


@pytest.fixture
def stubborn(tmp_path: Path):
    """A hung rank that ignores SIGTERM, a daemon with a half-second grace."""
    daemon, signaller, clock, probe, writer = node(tmp_path, DIES_ON_KILL, grace=0.5,
                                                   kill_timeout=0.5, interval=0.2)
    probe.set_sample(process_sample(PID, START, os.getuid(), "running",
                                    ((PID, 0.01), (PID + 1, 100.0))))
    yield daemon, signaller, clock, probe, writer
    writer.close(0, remove=False)
    daemon.executor.shutdown(wait=True)


def verdict(daemon: Daemon, clock: FakeClock, probe: FakeProbe) -> None:
    """Scans, the rank's thread spinning, until its response has begun."""
    spun = 100.0
    for _ in range(6):
        clock.advance(1.0)
        spun += 1.0
        probe.set_sample(process_sample(PID, START, os.getuid(), "running",
                                        ((PID, 0.01), (PID + 1, spun))))
        daemon.scan()
    assert daemon.pending, "no response began"


@pytest.mark.slow
def test_the_grace_is_a_step_the_loop_takes_not_a_sleeping_worker(stubborn) -> None:
    daemon, signaller, clock, probe, _ = stubborn
    verdict(daemon, clock, probe)
    until = time.monotonic() + 10
    while "SIGTERM" not in signaller.signals_to(PID) and time.monotonic() < until:
        daemon.step_responses()  # the evidence's worker, then SIGCONT and SIGTERM
        time.sleep(0.01)
    assert signaller.signals_to(PID) == ["SIGSTOP", "SIGTERM", "SIGCONT"]
    (response,) = daemon.pending
    assert response.ladder is not None and response.ladder.step is Step.TERM
    assert not response.working, "a worker sleeps through the grace"
    time.sleep(0.2)
    daemon.step_responses()
    assert signaller.signals_to(PID) == ["SIGSTOP", "SIGTERM", "SIGCONT"], \
        "SIGKILL before the grace"
    time.sleep(0.4)  # the grace is out: the next step sends SIGKILL
    daemon.step_responses()
    assert signaller.signals_to(PID)[-1] == "SIGKILL" and PID not in signaller.alive_pids
    until = time.monotonic() + 10
    while daemon.pending and time.monotonic() < until:
        daemon.step_responses()
        time.sleep(0.01)
    assert not daemon.pending
    (rank,) = daemon.ranks.values()
    assert rank.state is State.KILLED
    # Published as the response finished, not at the next scan: a reader (a peer,
    # `cluster status`) never sees the rank still in its wait once it has ended.
    (shown,) = daemon.snapshot.ranks
    assert shown.state == State.KILLED.value, shown


@pytest.mark.slow
def test_a_stopping_daemon_steps_its_ladders_to_their_end(stubborn) -> None:
    daemon, signaller, clock, probe, _ = stubborn
    daemon.live.settings = dataclasses.replace(daemon.settings, grace=3.0)  # every part reads it
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        spun, until = 100.0, time.monotonic() + 20
        while "SIGTERM" not in signaller.signals_to(PID) and time.monotonic() < until:
            clock.advance(1.0)  # the rank's wait grows, its thread spinning
            spun += 1.0
            probe.set_sample(process_sample(PID, START, os.getuid(), "running",
                                            ((PID, 0.01), (PID + 1, spun))))
            time.sleep(0.25)
        assert signaller.signals_to(PID) == ["SIGSTOP", "SIGTERM", "SIGCONT"]
    finally:
        daemon.stop()  # well within the 3 s grace
        runner.join(30)
    assert not runner.is_alive()
    assert signaller.signals_to(PID) == ["SIGSTOP", "SIGTERM", "SIGCONT", "SIGKILL"]
    assert not daemon.pending
    (line,) = journal.read_incidents(daemon.settings.state_dir)[0]
    assert line.outcome == {str(PID): "killed"}


def test_a_wait_the_rank_ends_under_its_response_is_not_learned(stubborn) -> None:
    """The response's SIGCONT to a frozen peer lets the rank's all_sum return before
    SIGTERM lands: the wait lasted as long as the hang, and the job (or its relaunch,
    through its workload) must not learn that as its pace."""
    daemon, signaller, clock, probe, writer = stubborn
    verdict(daemon, clock, probe)
    now = int(clock.now() * 1e9)
    writer.begin()
    writer.write_hot(5, 5, 5, 0, Phase.RUNNING, 0, now, 0, now, 6 * 10**9, 6 * 10**9)
    writer.write_pace(OP_CODE["eval"], 5, 6 * 10**9)
    writer.end()
    clock.advance(1.0)
    daemon.scan()
    (rank,) = daemon.ranks.values()
    assert rank.escalating and rank.record.waits_completed == 5
    learned = daemon.jobs.detector.auto.learned[f"{os.getuid()}:j"]["eval"]
    assert learned.count == 5 and learned.longest < 6.0, learned


# -- issue 38, item 1: observe -> enforce by a reload ends a hang already observed -------


def spinning(daemon: Daemon, clock: FakeClock, probe: FakeProbe):
    """A tick: a second of the fake clock, the rank's thread spinning, a scan."""
    spun = [100.0]

    def tick() -> None:
        clock.advance(1.0)
        spun[0] += 1.0
        probe.set_sample(process_sample(PID, START, os.getuid(), "running",
                                        ((PID, 0.01), (PID + 1, spun[0]))))
        daemon.scan()
        settle(daemon)

    return tick


def test_a_reload_to_enforce_ends_a_hang_already_observed(tmp_path: Path) -> None:
    daemon, signaller, clock, probe, writer = node(tmp_path, DIES_ON_TERM, grace=0.2,
                                                   kill_timeout=0.2, mode="observe")
    try:
        tick = spinning(daemon, clock, probe)
        for _ in range(8):  # the observed incident, closed at once
            tick()
        (observed,) = journal.read_incidents(daemon.settings.state_dir)[0]
        assert observed.mode == "observe" and signaller.sent == []
        rank = daemon.ranks[(PID, START)]
        assert rank.acted_on is not None and not rank.escalating  # one incident per wait
        daemon.apply_settings(dataclasses.replace(daemon.settings, mode="enforce"))
        assert rank.acted_on is None, "the wait only observed is still marked acted on"
        for _ in range(6):
            tick()
            daemon.step_responses()
            if PID not in signaller.alive_pids:
                break
        assert signaller.signals_to(PID) == ["SIGSTOP", "SIGTERM", "SIGCONT"]
        assert PID not in signaller.alive_pids, "the hang observed was not ended"
    finally:
        writer.close(0, remove=False)
        daemon.executor.shutdown(wait=True)


def test_an_observed_response_under_way_at_the_reload_is_judged_again(tmp_path: Path) -> None:
    """The peers asked (observe mode) when the reload comes: its observed outcome does
    not keep the wait marked; the next scan ends it."""
    daemon, signaller, clock, probe, writer = node(tmp_path, DIES_ON_TERM, grace=0.2,
                                                   kill_timeout=0.2, mode="observe")
    try:
        tick = spinning(daemon, clock, probe)
        for _ in range(8):
            tick()
            if daemon.pending:
                break
        rank = daemon.ranks[(PID, START)]
        (observing,) = daemon.pending
        assert rank.escalating and observing.incident.mode == "observe"
        # The reload lands while the observed response is still to be collected.
        daemon.apply_settings(dataclasses.replace(daemon.settings, mode="enforce"))
        # Its observed outcome collected under enforce: the wait is judged again at once
        # (the scan that follows a finished response), and a response to end it begins.
        daemon.step_responses()
        (ending,) = daemon.pending
        assert ending is not observing and ending.incident.mode == "enforce"
        assert rank.escalating
    finally:
        writer.close(0, remove=False)
        daemon.executor.shutdown(wait=True)


def test_a_reload_that_lowers_the_deadline_ends_a_wait_past_it_at_once(tmp_path: Path) -> None:
    daemon, signaller, clock, probe, writer = node(tmp_path, DIES_ON_TERM, grace=0.2,
                                                   kill_timeout=0.2)
    try:
        daemon.apply_settings(dataclasses.replace(daemon.settings, deadline=60.0))
        tick = spinning(daemon, clock, probe)
        for _ in range(10):  # ten seconds in its wait: inside the 60 s deadline
            tick()
        assert not daemon.pending and signaller.sent == []
        daemon.apply_settings(dataclasses.replace(daemon.settings, deadline=5.0))
        assert daemon.wake.is_set(), "the loop does not scan at once after a reload"
        for _ in range(3):  # the scans the verdict's confirmation takes
            tick()
            daemon.step_responses()
        assert signaller.signals_to(PID) == ["SIGSTOP", "SIGTERM", "SIGCONT"]
    finally:
        writer.close(0, remove=False)
        daemon.executor.shutdown(wait=True)
