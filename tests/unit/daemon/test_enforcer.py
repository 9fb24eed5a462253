"""The escalation ladder with a fake clock and a fake signaller; identity with real processes.

The ladder tests run instantly: the fake clock moves only when the enforcer
sleeps. The `Signaller` tests use real child processes (`sleep`, a Python
with faulthandler) because the identity check is the point.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.fakes import (
    DIES_ON_KILL,
    DIES_ON_TERM,
    STOPPED,
    UNKILLABLE,
    FakeClock,
    FakeProbe,
    FakeSignaller,
    process_sample,
    target,
)
from tests.support.ladders import end, respond
from watchdog.daemon.act.enforcer import Enforcer
from watchdog.daemon.config import Settings
from watchdog.daemon.probes import Probe
from watchdog.daemon.signaller import Result, Signaller, Target
from watchdog.daemon.store import journal
from watchdog.status import ABSENT, Incident

GiB = 1 << 30


def settings(state_dir: Path, **kw) -> Settings:
    base = Settings(dir=str(state_dir.parent / "records"), state_dir=str(state_dir),
                    grace=10.0, kill_timeout=10.0, settle=30.0, evidence_timeout=10.0,
                    wired_threshold=GiB)
    return dataclasses.replace(base, **kw)


def enforcer(state_dir: Path, signaller, probe: FakeProbe | None = None,
             clock: FakeClock | None = None, **kw) -> tuple[Enforcer, FakeClock]:
    clock = clock or FakeClock()
    enf = Enforcer(settings(state_dir, **kw), signaller, probe or FakeProbe(),
                   clock=clock.now, sleep=clock.sleep, wall=clock.wall)
    return enf, clock


def incident(job: str = "job-1", targets: list[Target] = ()) -> Incident:
    """What the daemon hands the enforcer (daemon._escalate builds the same keys)."""
    return Incident.from_json({
        "id": "20250101T000000-abc123", "time": 1.7e9, "host": "node-a", "job": job,
        "verdict": "stalled", "mode": "enforce", "kill_scope": "job",
        "reason": "in all_sum for 12.0s, past the 10s deadline, one thread spinning",
        "ranks": [{"pid": t.pid, "rank": t.rank, "state": "stalled"} for t in targets],
        "pids": [t.pid for t in targets],
        "seconds_without_progress": 12.0, "busiest_thread_cpu": 0.98,
        "flight_recorder_tail": {"0": [{"number": 7, "op": "all_sum", "dtype": "float32",
                                        "bytes": 4096}]},
        "culprit": None,
    })


# -- the ladder ----------------------------------------------------------------------


def test_ladder_order_sigstop_sigterm_sigcont_then_sigkill_for_survivors_only(
        state_dir: Path) -> None:
    fake = FakeSignaller({101: DIES_ON_TERM, 102: DIES_ON_KILL, 103: STOPPED})
    enf, clock = enforcer(state_dir, fake)
    targets = [target(101, rank=0), target(102, rank=1), target(103, rank=2)]
    start = clock.now()
    ended, outcome = end(enf, targets)
    inc = ended.to_json()

    assert outcome == {101: "killed", 102: "killed", 103: "killed"}
    # Frozen first; SIGTERM while frozen, then resumed: it acts on the SIGTERM at once.
    assert fake.signals_to(101) == ["SIGSTOP", "SIGTERM", "SIGCONT"]  # no SIGKILL
    assert fake.signals_to(102) == ["SIGSTOP", "SIGTERM", "SIGCONT", "SIGKILL"]
    assert fake.signals_to(103) == ["SIGSTOP", "SIGTERM", "SIGCONT"]
    # Every rank frozen before any SIGTERM; every SIGTERM before any SIGCONT (no rank
    # resumed while a peer may still be running); the SIGKILL last.
    assert fake.names() == ["SIGSTOP"] * 3 + ["SIGTERM"] * 3 + ["SIGCONT"] * 3 + ["SIGKILL"]
    # SIGKILL only after the grace period, by the (fake) clock.
    sent_at = {(s["pid"], s["signal"]): s["time"] for s in inc["signals"]}
    assert sent_at[(102, "SIGKILL")] - sent_at[(102, "SIGTERM")] >= 10.0
    assert clock.now() - start < 10.0 + 1.0  # the kill took effect at once
    assert all(s["result"] == Result.SENT for s in inc["signals"])


def test_ranks_dying_on_sigterm_are_not_sigkilled_and_no_grace_is_spent(state_dir: Path) -> None:
    fake = FakeSignaller({201: DIES_ON_TERM, 202: DIES_ON_TERM})
    enf, clock = enforcer(state_dir, fake)
    start = clock.now()
    outcome = end(enf, [target(201), target(202, rank=1)])[1]
    assert outcome == {201: "killed", 202: "killed"}
    assert signal.SIGKILL not in [s for _, s in fake.sent]
    assert clock.now() - start < 1.0


def test_unkillable_flags_the_node(state_dir: Path) -> None:
    fake = FakeSignaller({301: UNKILLABLE, 302: DIES_ON_TERM})
    enf, clock = enforcer(state_dir, fake, FakeProbe(wired=None))
    targets = [target(301), target(302, rank=1)]
    start = clock.now()
    outcome = respond(enf, incident(targets=targets), targets)
    inc = outcome.incident.to_json()

    assert inc["outcome"] == {"301": "unkillable", "302": "killed"}
    assert outcome.results == {301: "unkillable", 302: "killed"}  # typed, for the daemon
    assert outcome.signals_sent.count("SIGKILL") == 1 and "SIGTERM" in outcome.signals_sent
    assert fake.signals_to(301) == ["SIGSTOP", "SIGTERM", "SIGCONT", "SIGKILL"]
    assert clock.now() - start >= 10.0 + 10.0  # grace, then the kill timeout
    flag = journal.reboot_flag(str(state_dir))
    assert flag is not None
    assert "301" in flag.reason and "SIGKILL" in flag.reason
    assert flag.reasons[0].incident == inc["id"]
    assert inc["reboot_required"] == flag.reason
    journaled, bad = journal.read_incidents(str(state_dir))
    assert bad == 0 and journaled[-1].reboot_required == flag.reason


def test_a_target_already_gone_is_a_result(state_dir: Path) -> None:
    fake = FakeSignaller({401: DIES_ON_TERM})
    enf, _ = enforcer(state_dir, fake)
    outcome = end(enf, [target(400), target(401, rank=1)])[1]  # 400 never existed
    assert outcome == {400: Result.GONE, 401: "killed"}
    assert fake.signals_to(400) == ["SIGSTOP", "SIGTERM"]  # nothing more once known gone


def test_observe_mode_signals_nothing_and_still_journals(state_dir: Path) -> None:
    fake = FakeSignaller({501: DIES_ON_KILL, 502: UNKILLABLE})
    probe = FakeProbe(wired=5 * GiB)
    enf, _ = enforcer(state_dir, fake, probe, mode="observe")
    targets = [target(501), target(502, rank=1)]
    inc = respond(enf, incident(targets=targets), targets, baseline=1 * GiB).incident.to_json()

    assert fake.sent == []
    assert fake.alive_pids == {501, 502}
    assert inc["outcome"] == {} and inc["reboot_required"] is False
    assert "observe" in inc["action"]
    assert journal.reboot_flag(str(state_dir)) is None  # observing never flags the node
    journaled, bad = journal.read_incidents(str(state_dir))
    assert bad == 0 and [i.id for i in journaled] == [inc["id"]]


def test_observe_mode_signals_nothing_not_even_the_dump_signal(state_dir: Path) -> None:
    """Observe signals nothing (design section 5): no ladder and no stack-dump signal."""
    stacks = state_dir / "rank.stacks"
    stacks.write_text("")
    fake = FakeSignaller({601: DIES_ON_TERM})
    enf, _ = enforcer(state_dir, fake, mode="observe")
    t = target(601, dump_signal=int(signal.SIGUSR2), stacks_path=str(stacks))
    inc = respond(enf, incident(targets=[t]), [t]).incident.to_json()
    assert fake.sent == []
    assert inc["signals"] == [] and inc["evidence"] == []
    assert fake.alive_pids == {601}


def test_a_forged_dump_signal_is_never_sent(state_dir: Path) -> None:
    """A record naming SIGKILL (or SIGTERM) as its dump signal gets no evidence signal."""
    stacks = state_dir / "rank.stacks"
    stacks.write_text("")
    fake = FakeSignaller({701: DIES_ON_KILL})
    enf, _ = enforcer(state_dir, fake, mode="observe")
    for signum in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, 0, 999):
        t = target(701, dump_signal=int(signum), stacks_path=str(stacks))
        assert enf.capture(f"forged-{int(signum)}", [t]) == []
    assert fake.sent == []


def test_python_dump_that_never_arrives_is_time_boxed(state_dir: Path) -> None:
    stacks = state_dir / "rank.stacks"
    stacks.write_text("")
    fake = FakeSignaller({801: DIES_ON_TERM, 802: DIES_ON_TERM})
    probe = FakeProbe({801: process_sample(801), 802: process_sample(802)})
    enf, clock = enforcer(state_dir, fake, probe, evidence_timeout=10.0)
    targets = [target(pid, dump_signal=int(signal.SIGUSR2), stacks_path=str(stacks))
               for pid in (801, 802)]
    start = clock.now()
    assert enf.capture("nodump", targets) == []
    assert fake.names() == ["SIGUSR2", "SIGUSR2"]
    assert clock.now() - start <= 2.0 + 0.2  # 2 s for all ranks together, by the fake clock
    # The gap is said beside the stacks, not left for the reader to guess.
    note = state_dir / "evidence" / "nodump" / f"rank{targets[0].rank}-pid801-python-missing.txt"
    assert "wrote no dump within the evidence time box" in note.read_text()


def test_a_stopped_rank_is_not_asked_for_a_python_dump(state_dir: Path) -> None:
    """Its handler cannot run until it is resumed: asking would only burn the budget."""
    stacks = state_dir / "rank.stacks"
    stacks.write_text("")
    fake = FakeSignaller({803: DIES_ON_TERM})
    probe = FakeProbe({803: process_sample(803, status="stopped")})
    enf, clock = enforcer(state_dir, fake, probe, evidence_timeout=10.0)
    t = target(803, dump_signal=int(signal.SIGUSR2), stacks_path=str(stacks))
    start = clock.now()
    assert enf.capture("stopped", [t]) == []
    assert fake.sent == [] and clock.now() - start < 0.5
    note = state_dir / "evidence" / "stopped" / f"rank{t.rank}-pid803-python-missing.txt"
    said = note.read_text()
    assert said.startswith(f"no Python stack of rank {t.rank} (pid 803): it was stopped "
                           "already when the response began (SIGSTOP: Ctrl-Z, a debugger")
    assert "observe mode" not in said  # observe mode takes no evidence: never its reason


# -- wired memory after a kill ---------------------------------------------------------


def settle_wired(enf: Enforcer, baseline: int | None, others_live=lambda: False) -> Incident:
    """The settle after a kill, through a whole response to one rank that SIGTERM ends
    at once (so the settle starts at the verdict's clock time): the closed incident."""
    assert isinstance(enf.signaller, FakeSignaller)
    enf.signaller.add(SETTLING, DIES_ON_TERM)
    return respond(enf, incident(targets=[target(SETTLING)]), [target(SETTLING)], baseline,
                   others_live, evidence=False).incident


SETTLING = 950


def test_settle_wired_returned(state_dir: Path) -> None:
    # The first reading is the incident's `wired_before`, the rest the settle's.
    probe = FakeProbe(wired=[9 * GiB, 8 * GiB, 4 * GiB, int(1.5 * GiB)])
    enf, _ = enforcer(state_dir, FakeSignaller(), probe)
    result = settle_wired(enf, 1 * GiB)
    assert result.wired_check == "returned"
    assert result.wired_baseline == 1 * GiB and result.wired_after == int(1.5 * GiB)


def test_settle_wired_leaked_within_the_settle_time(state_dir: Path) -> None:
    probe = FakeProbe(wired=5 * GiB)
    enf, clock = enforcer(state_dir, FakeSignaller(), probe)
    start = clock.now()
    result = settle_wired(enf, 1 * GiB)
    assert result.wired_check == "leaked" and result.wired_after == 5 * GiB
    assert 30.0 <= clock.now() - start < 31.0


def test_settle_wired_skipped_while_others_live(state_dir: Path) -> None:
    enf, _ = enforcer(state_dir, FakeSignaller(), FakeProbe(wired=5 * GiB))
    result = settle_wired(enf, 1 * GiB, lambda: True)
    assert result.wired_check is not None and result.wired_check.startswith("skipped")


def test_settle_wired_no_baseline(state_dir: Path) -> None:
    probe = FakeProbe(wired=5 * GiB)
    enf, _ = enforcer(state_dir, FakeSignaller(), probe)
    result = settle_wired(enf, None)
    assert result.wired_check == "no baseline" and result.wired_after is ABSENT


def test_settle_wired_probe_failure_is_not_a_leak(state_dir: Path) -> None:
    probe = FakeProbe(wired=5 * GiB)
    probe.wired_error = "meminfo unreadable"
    enf, _ = enforcer(state_dir, FakeSignaller(), probe)
    assert settle_wired(enf, 1 * GiB).wired_check == "probe failed"


def test_a_wired_leak_flags_the_node(state_dir: Path) -> None:
    fake = FakeSignaller({901: DIES_ON_TERM})
    enf, _ = enforcer(state_dir, fake, FakeProbe(wired=5 * GiB))
    t = target(901)
    inc = respond(enf, incident(targets=[t]), [t], baseline=1 * GiB).incident.to_json()
    assert inc["wired_check"] == "leaked"
    flag = journal.reboot_flag(str(state_dir))
    assert flag is not None and "wired" in flag.reason
    assert flag.reasons[0].wired_after == 5 * GiB
    assert flag.reasons[0].wired_baseline == 1 * GiB
    assert inc["reboot_required"] == flag.reason


def test_a_wired_rise_while_others_live_does_not_flag(state_dir: Path) -> None:
    fake = FakeSignaller({902: DIES_ON_TERM})
    enf, _ = enforcer(state_dir, fake, FakeProbe(wired=5 * GiB))
    t = target(902)
    inc = respond(enf, incident(targets=[t]), [t], baseline=1 * GiB,
                     others_live=lambda: True).incident.to_json()
    assert inc["wired_check"].startswith("skipped")
    assert journal.reboot_flag(str(state_dir)) is None
    assert inc["reboot_required"] is False


# -- the journaled incident --------------------------------------------------------------


def test_the_incident_is_one_json_line_with_the_design_fields(state_dir: Path) -> None:
    fake = FakeSignaller({1001: DIES_ON_TERM, 1002: DIES_ON_KILL})
    probe = FakeProbe(wired=[3 * GiB, 3 * GiB, int(1.2 * GiB)])
    enf, _ = enforcer(state_dir, fake, probe)
    targets = [target(1001), target(1002, rank=1)]
    respond(enf, incident(targets=targets), targets, baseline=1 * GiB)

    raw = (state_dir / journal.INCIDENTS).read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    inc = json.loads(raw)
    for key in ("time", "host", "job", "ranks", "pids", "verdict", "seconds_without_progress",
                "busiest_thread_cpu", "flight_recorder_tail", "evidence", "signals",
                "wired_before", "wired_after", "reboot_required"):
        assert key in inc, key
    assert inc["host"] == "node-a" and inc["job"] == "job-1" and inc["pids"] == [1001, 1002]
    assert inc["wired_before"] == 3 * GiB and inc["wired_after"] == int(1.2 * GiB)
    assert inc["wired_check"] == "returned" and inc["reboot_required"] is False
    assert isinstance(inc["evidence"], list)
    assert [(s["pid"], s["signal"]) for s in inc["signals"]] == [
        (1001, "SIGSTOP"), (1002, "SIGSTOP"), (1001, "SIGTERM"), (1002, "SIGTERM"),
        (1001, "SIGCONT"), (1002, "SIGCONT"), (1002, "SIGKILL")]
    assert inc["freeze"] == "2 ranks frozen"
    for s in inc["signals"]:
        assert isinstance(s["time"], float) and s["result"] == Result.SENT
    assert inc["outcome"] == {"1001": "killed", "1002": "killed"}
    assert inc["closed_at"] >= inc["signals"][-1]["time"]


# -- the real Signaller: identity before every signal ------------------------------------


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def identity(proc: subprocess.Popen) -> tuple[float, int]:
    p = psutil.Process(proc.pid)
    return p.create_time(), p.uids().real


@pytest.mark.parametrize("change", ["start_time", "uid"])
def test_signaller_never_signals_a_process_whose_identity_changed(
        sleeper: subprocess.Popen, change: str) -> None:
    start, uid = identity(sleeper)
    probe = FakeProbe()  # the probe reports the live process as it really is
    probe.set_sample(process_sample(sleeper.pid, start_time=start, uid=uid))
    recorded = target(sleeper.pid, start_time=start + 100.0 if change == "start_time" else start,
                      uid=uid + 1 if change == "uid" else uid)
    signaller = Signaller(probe)
    assert signaller.alive(recorded) is False
    assert signaller.send(recorded, signal.SIGKILL) == Result.NOT_OURS
    time.sleep(0.05)
    assert sleeper.poll() is None  # still alive


def test_signaller_with_the_real_probe_refuses_a_recycled_identity(
        sleeper: subprocess.Popen) -> None:
    start, uid = identity(sleeper)
    recorded = target(sleeper.pid, start_time=start - 3600.0, uid=uid)
    assert Signaller(Probe()).send(recorded, signal.SIGKILL) == Result.NOT_OURS
    time.sleep(0.05)
    assert sleeper.poll() is None


def test_signaller_kills_the_process_whose_identity_matches(sleeper: subprocess.Popen) -> None:
    start, uid = identity(sleeper)
    probe = FakeProbe()
    probe.set_sample(process_sample(sleeper.pid, start_time=start, uid=uid))
    recorded = target(sleeper.pid, start_time=start, uid=uid)
    assert Signaller(probe).send(recorded, signal.SIGKILL) == Result.SENT
    assert sleeper.wait(timeout=5) == -signal.SIGKILL


def test_signaller_to_a_dead_pid_returns_gone(sleeper: subprocess.Popen) -> None:
    start, uid = identity(sleeper)
    sleeper.kill()
    sleeper.wait()
    dead = target(sleeper.pid, start_time=start, uid=uid)
    assert Signaller(Probe()).send(dead, signal.SIGTERM) == Result.GONE
    assert Signaller(FakeProbe()).send(dead, signal.SIGKILL) == Result.GONE
    assert Signaller(Probe()).alive(dead) is False


def test_the_ladder_never_touches_a_mismatched_real_process(
        sleeper: subprocess.Popen, state_dir: Path) -> None:
    start, uid = identity(sleeper)
    probe = FakeProbe()
    probe.set_sample(process_sample(sleeper.pid, start_time=start, uid=uid))
    stale = target(sleeper.pid, start_time=start + 5.0, uid=uid)
    clock = FakeClock()
    enf = Enforcer(settings(state_dir), Signaller(probe), probe,
                   clock=clock.now, sleep=clock.sleep, wall=clock.wall)
    inc = respond(enf, incident(targets=[stale]), [stale]).incident.to_json()
    assert inc["outcome"] == {str(sleeper.pid): Result.NOT_OURS}
    assert [s["result"] for s in inc["signals"]] == [Result.NOT_OURS, Result.NOT_OURS]  # STOP, TERM
    time.sleep(0.05)
    assert sleeper.poll() is None


# -- Python stack evidence from a real process -----------------------------------------------

DUMPER = """
import faulthandler, signal, sys, threading, time
stacks = open(sys.argv[1], "a")
faulthandler.register(signal.SIGUSR2, file=stacks, all_threads=True, chain=False)
def spinning_helper():
    while True:
        time.sleep(0.01)
threading.Thread(target=spinning_helper, name="helper", daemon=True).start()
open(sys.argv[2], "w").close()
time.sleep(30)
"""


@pytest.mark.slow
def test_capture_copies_the_new_faulthandler_dump(tmp_path: Path, state_dir: Path) -> None:
    stacks = tmp_path / "123.stacks"
    stacks.write_text("an older dump that must not be copied again\n")
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", DUMPER, str(stacks), str(ready)])
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        start, uid = identity(proc)
        t = target(proc.pid, rank=3, start_time=start, uid=uid,
                   dump_signal=int(signal.SIGUSR2), stacks_path=str(stacks))
        enf = Enforcer(settings(state_dir), Signaller(Probe()), Probe())  # real clock
        files = enf.capture("inc-1", [t])

        assert len(files) == 1
        evidence = Path(files[0])
        assert evidence.parent == state_dir / "evidence" / "inc-1"
        assert evidence.name == f"rank3-pid{proc.pid}-python.txt"
        text = evidence.read_text()
        assert "older dump" not in text
        assert "Thread" in text and "spinning_helper" in text and "<string>" in text
        assert proc.poll() is None  # the dump signal did not end it
    finally:
        proc.kill()
        proc.wait()


# -- a rank already leaving on its own (the backend's) error -------------------------


def _record(tmp_path: Path, pid: int, status: int | None = None):
    """A real record naming `pid` (the fakes' start time); closed with `status` if given."""
    from watchdog import record

    writer = record.RecordWriter(str(tmp_path / f"{pid}.rec"), pid=pid, start_time=1.7e9,
                                 uid=0, host="node-a", job="job-1", rank=0, world_size=2,
                                 backend="ring", dump_signal=0)
    if status is not None:
        writer.close(status, remove=False)
    return writer


def test_a_rank_whose_record_says_it_is_leaving_on_an_error_is_not_signalled(tmp_path,
                                                                             state_dir):
    from watchdog import record
    from watchdog.states import State

    _record(tmp_path, 101, record.STATUS_ERROR)
    fake = FakeSignaller({})  # gone by the time the ladder looks again: it left on its own
    enf, clock = enforcer(state_dir, fake)
    leaving = dataclasses.replace(target(101), record_path=str(tmp_path / "101.rec"))
    assert end(enf, [leaving])[1] == {101: State.EXITED}
    assert fake.sent == []


def test_a_rank_leaving_on_an_error_that_does_not_go_gets_the_ladder(tmp_path, state_dir):
    from watchdog import record

    _record(tmp_path, 102, record.STATUS_ERROR)
    fake = FakeSignaller({102: DIES_ON_TERM})
    enf, clock = enforcer(state_dir, fake, grace=2.0)
    stuck = dataclasses.replace(target(102), record_path=str(tmp_path / "102.rec"))
    start = clock.now()
    outcome = end(enf, [stuck])[1]
    # Not frozen (leaving on its own error), waited out the grace unsignalled, then
    # SIGTERM and SIGCONT ended it: that is ours.
    assert clock.now() - start >= 2.0 and fake.names()[:2] == ["SIGTERM", "SIGCONT"]
    assert outcome == {102: "killed"}


def test_a_rank_that_reached_its_error_exit_during_the_ladder_is_the_ladders_kill(
        tmp_path, state_dir):
    """The ring raised on the rank once the ladder had signalled its peers, an instant
    before its own SIGTERM: the teardown ended it (it often dies of the SIGTERM mid-exit),
    so it counts as killed; only a rank found leaving before the ladder is left alone."""
    from watchdog import record

    writer = _record(tmp_path, 103)

    class ExitsOnItsOwn(FakeSignaller):
        def send(self, target, signum):
            if signum == signal.SIGTERM and writer is not None:
                writer.close(record.STATUS_ERROR, remove=False)  # its own exit, first
            return super().send(target, signum)

    fake = ExitsOnItsOwn({103: DIES_ON_TERM})
    enf, _ = enforcer(state_dir, fake)
    racing = dataclasses.replace(target(103), record_path=str(tmp_path / "103.rec"))
    assert end(enf, [racing])[1] == {103: "killed"}
    # The same, with a record still open after the SIGTERM: the watchdog's kill.
    _record(tmp_path, 104)
    plain = FakeSignaller({104: DIES_ON_TERM})
    enf, _ = enforcer(state_dir, plain)
    assert end(enf, [dataclasses.replace(target(104), record_path=str(
        tmp_path / "104.rec"))])[1] == {104: "killed"}
