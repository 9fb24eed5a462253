"""Identity fails closed, and a stepped wall clock does not blind it.

Real processes (a sleeping child that reports every signal it gets); the probe
is the real Linux one, or a probe that fails, or the real one with its boot
time moved through its seam, as a clock step moves it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.fakes import FakeClock, target
from tests.support.ladders import respond
from tests.support.users import UserProc, publish
from watchdog.daemon.act.enforcer import Enforcer
from watchdog.daemon.act.ladder import Ladder, Outcome, Step
from watchdog.daemon.config import Settings
from watchdog.daemon.lifecycle import Edge, transition
from watchdog.daemon.loop import Daemon
from watchdog.daemon.probes import Probe, ProbeError, ProcessSample
from watchdog.daemon.signaller import Result, Signaller
from watchdog.daemon.store import journal
from watchdog.states import State
from watchdog.status import Incident

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

from watchdog.daemon.probes.linux import LinuxProbe  # noqa: E402
from watchdog.procstat import read_start_ticks  # noqa: E402


class FailingProbe(Probe):
    """Every sample fails, as on an access-denied or half-read /proc."""

    def sample(self, pid: int) -> ProcessSample | None:
        raise ProbeError(f"access denied reading pid {pid}")


class FailingAfter(LinuxProbe):
    """The real probe, until `fail` is set."""

    fail = False

    def sample(self, pid: int) -> ProcessSample | None:
        if self.fail:
            raise ProbeError("EMFILE")
        return super().sample(pid)


def test_a_probe_error_never_lets_a_signal_through():
    """A sleeper whose recorded start time and uid are both wrong: on main the
    failed probe read as "alive" and the sleeper got SIGTERM."""
    with UserProc(0) as sleeper:
        forged = target(sleeper.pid, start_time=time.time() - 3600, uid=4242)
        signaller = Signaller(FailingProbe())
        assert signaller.identify(forged) == Result.UNKNOWN
        assert signaller.alive(forged) is False
        assert signaller.send(forged, signal.SIGTERM) == Result.UNKNOWN
        time.sleep(0.1)
        assert sleeper.poll() is None and sleeper.signals() == []


def test_a_probe_error_raises_no_false_unkillable_nor_a_reboot_flag(state_dir: Path):
    settings = Settings(dir=str(state_dir.parent / "records"), state_dir=str(state_dir),
                        grace=1.0, kill_timeout=1.0, settle=1.0, evidence_timeout=1.0)
    clock = FakeClock()
    probe = FailingAfter()
    with UserProc(0) as rank:
        p = psutil.Process(rank.pid)
        real = dataclasses.replace(target(rank.pid, start_time=p.create_time(), uid=0),
                                   start_ticks=read_start_ticks(rank.pid))
        signaller = Signaller(probe)
        assert signaller.identify(real) == Result.OURS
        probe.fail = True  # from here on the probe cannot tell
        enf = Enforcer(settings, signaller, probe, clock=clock.now, sleep=clock.sleep,
                       wall=clock.wall)
        incident = respond(enf, Incident(id="i1", job="j"), [real], evidence=False).incident
        incident = incident.to_json()
        assert incident["outcome"] == {str(rank.pid): "unknown"}
        assert incident["reboot_required"] is False
        assert journal.reboot_flag(str(state_dir)) is None
        assert rank.signals() == []  # nothing sent without a positive match


def test_a_stepped_wall_clock_does_not_make_live_ranks_read_as_forged(tmp_path):
    """psutil's create_time is start ticks + the *current* boot time: after a
    clock step every live rank's start time moves. The daemon compares the
    ticks, which do not."""
    records = tmp_path / "records"
    records.mkdir()
    settings = Settings(dir=str(records), state_dir=str(tmp_path / "state"), deadline=60.0)
    os.makedirs(settings.state_dir)
    stepped = LinuxProbe(boot_time=lambda: psutil.boot_time() + 3600.0)  # clock stepped 1 h
    with UserProc(0) as rank:
        publish(records, rank.pid, 0, "j", hung=False)
        assert abs(stepped.sample(rank.pid).start_time
                   - psutil.Process(rank.pid).create_time() - 3600.0) < 0.1
        daemon = Daemon(settings, stepped)
        try:
            for _ in range(3):
                daemon.scan()
            ((key, watched),) = daemon.ranks.items()
            assert watched.record.pid == rank.pid and watched.state == State.RUNNING
            assert daemon.table.invalid == {} and daemon.table.records.bad == {}
            assert Signaller(stepped).identify(watched.target()) == Result.OURS
        finally:
            daemon.executor.shutdown()


def test_a_rank_left_alone_for_a_probe_error_is_judged_again(tmp_path):
    """Failing closed must not give a hang up: an escalation whose target could
    not be identified ("unknown") leaves the rank to be judged afresh."""

    records = tmp_path / "records"
    records.mkdir()
    settings = Settings(dir=str(records), state_dir=str(tmp_path / "state"), deadline=60.0)
    os.makedirs(settings.state_dir)
    with UserProc(0) as rank:
        publish(records, rank.pid, 0, "j", hung=True)
        daemon = Daemon(settings)
        try:
            daemon.scan()
            (watched,) = daemon.ranks.values()
            assert transition(watched, Edge.ESCALATED, 0.0, wait=(1, 0))
            incident = Incident.from_json({
                "id": "i", "job": "j", "uid": 0, "verdict": "blocked",
                "outcome": {str(rank.pid): Result.UNKNOWN}, "signals": []})
            done = Ladder(incident, [], None, lambda: False, step=Step.DONE,
                          result=Outcome(incident, {rank.pid: Result.UNKNOWN}))
            daemon.responses.adopt(done, [watched.key], 0.0)
            daemon._collect_finished()
            assert not watched.escalating and watched.acted_on is None
            assert watched.state not in (State.KILLED, State.UNKILLABLE)
        finally:
            daemon.executor.shutdown()


def test_a_process_wall_start_is_read_to_a_tick_not_to_psutils_whole_second():
    """The fence's "started before the job was found dead" (fences.py): psutil's start
    is /proc/stat's whole-second btime plus ticks, up to 1 s early; `wall_start` takes
    the boot time from CLOCK_BOOTTIME. A relaunch 0.2 s after a cutoff reads as after."""
    from watchdog import procstat

    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        exact = procstat.wall_start(procstat.read_start_ticks(child.pid))
        assert exact is not None
        assert before - 0.02 <= exact <= time.time() + 0.02
        assert 0 <= exact - psutil.Process(child.pid).create_time() < 1.02
    finally:
        child.kill()
        child.wait()
    assert procstat.wall_start(0) is None
