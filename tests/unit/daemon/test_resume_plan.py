"""Resume's plan (act/resume.py) as a table: the entry an earlier daemon left at each
step of the ladder, the target's identity now, and what the plan makes of it. Pure: no
signaller, no clock, no file (tests/unit/daemon/test_ladder_edges.py drives the real
entries through the real enforcer)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.fakes import target
from tests.unit.daemon.test_enforcer import incident
from watchdog.daemon.act.ladder import Step
from watchdog.daemon.act.resume import Plan, plan
from watchdog.daemon.signaller import Result
from watchdog.status import Incident, SignalSent

T = target(21)
U = target(22, rank=1)


def sent(name: str, pid: int = 21, result: str = Result.SENT) -> SignalSent:
    return SignalSent(pid=pid, rank=0 if pid == 21 else 1, signal=name, time=1.7e9,
                      result=result)


STOP = (sent("SIGSTOP"),)
ROUND = (*STOP, sent("SIGTERM"), sent("SIGCONT"))

# What the entry holds when its daemon died at each step: its last journal write.
ENTRIES: dict[str, dict] = {
    "BEGIN": {"action": "ending"},  # the verdict alone, before the first signal
    "EVIDENCE": {"action": "ending", "signals": STOP, "freeze": "1 rank frozen"},
    "HOLD": {"action": "ending", "signals": STOP, "freeze": "1 rank frozen"},
    "LEAVING": {"action": "ended", "ladder": "begun", "signals": STOP},
    "TERM": {"action": "ended", "ladder": "begun", "signals": STOP},
    "KILL": {"action": "ended", "ladder": "begun", "signals": ROUND},
    "FRAMES": {"action": "ended", "ladder": "begun", "signals": ROUND},
    "SETTLE": {"action": "ended", "ladder": "begun", "signals": ROUND,
               "outcome": {"21": "killed"}, "native_hot": ("poll_cq",)},
    "DONE": {"action": "ended", "ladder": "begun", "signals": ROUND,
             "outcome": {"21": "killed"}, "closed_at": 1.7e9 + 60},
}
FROZEN_STILL = {"EVIDENCE", "HOLD", "LEAVING", "TERM"}  # SIGSTOPped, no SIGTERM listed
ENDED_BY_US = {"LEAVING", "TERM", "KILL", "FRAMES", "SETTLE"}  # the round had begun

OURS, GONE, NOT_OURS, UNKNOWN = Result.OURS, Result.GONE, Result.NOT_OURS, Result.UNKNOWN


def entry(step: str, **more) -> Incident:
    return dataclasses.replace(incident(targets=[T]), **{**ENTRIES[step], **more})


def expected(step: str, who: str, due: bool) -> Plan:
    """What resume.py's table says for one target: `due` = the verdict fresh, the mode
    enforce, its wait not returned."""
    if step == "DONE":
        return Plan(closed=True)
    frozen = step in FROZEN_STILL
    if who == OURS and due:  # ended now, from HOLD's round; SIGTERM first if frozen
        return Plan(live=(T,), frozen=(T,) if frozen else ())
    if who == OURS:  # left to the scan; thawed if frozen still
        return Plan(outcomes={21: Result.UNKNOWN}, stale=(T,) if frozen else ())
    if step in ENDED_BY_US:
        return Plan(outcomes={21: "killed"})
    # Not ended by us: what the identity check found. One it could not check, frozen
    # still, is thawed if the signaller can (it re-checks the identity first).
    return Plan(outcomes={21: who}, stale=(T,) if frozen and who == UNKNOWN else ())


CASES = [(step, who, fresh, enforce, returned)
         for step in ENTRIES
         for who, fresh, enforce, returned in [
             (OURS, True, True, False),  # still hung: ended now
             (OURS, False, True, False),  # its verdict stale
             (OURS, True, False, False),  # the mode is observe now
             (OURS, True, True, True),  # its wait returned since the verdict
             (GONE, True, True, False),
             (NOT_OURS, True, True, False),  # the pid is another process now
             (UNKNOWN, True, True, False)]]  # the identity could not be checked


@pytest.mark.parametrize(("step", "who", "fresh", "enforce", "returned"), CASES)
def test_the_plan_for_an_entry_left_at_each_step(step: str, who: str, fresh: bool,
                                                 enforce: bool, returned: bool) -> None:
    made = plan(entry(step), [T], {21: who}, progressed={21} if returned else (),
                fresh=fresh, enforce=enforce)
    assert made == expected(step, who, fresh and enforce and not returned)


def test_the_table_covers_every_step_a_daemon_can_die_at() -> None:
    # RESUME is never journaled as such: a daemon dying while resuming leaves the entry
    # it resumed, or one of the steps' writes.
    assert set(ENTRIES) == {s.name for s in Step} - {"RESUME"}


def test_a_verdict_only_observed_is_never_ended_at_resume() -> None:
    """An entry whose action is not "ending" or "ended" (observe's) ends nothing."""
    made = plan(entry("BEGIN", action="observed (mode observe: nothing signalled)"), [T],
                {21: OURS}, fresh=True, enforce=True)
    assert made == Plan(outcomes={21: Result.UNKNOWN})


def test_a_sigstop_that_did_not_reach_its_rank_leaves_it_not_frozen() -> None:
    made = plan(entry("HOLD", signals=(sent("SIGSTOP", result=Result.DENIED),)), [T],
                {21: OURS}, fresh=False, enforce=True)
    assert made == Plan(outcomes={21: Result.UNKNOWN})  # nothing to thaw


def test_before_the_round_only_a_listed_sigterm_or_sigkill_counts_a_gone_rank_killed() -> None:
    killed = plan(entry("HOLD", signals=(*STOP, sent("SIGKILL"))), [T], {21: GONE},
                  fresh=True, enforce=True)
    assert killed.outcomes == {21: "killed"}
    own_end = plan(entry("HOLD"), [T], {21: GONE}, fresh=True, enforce=True)
    assert own_end.outcomes == {21: Result.GONE}


def test_of_two_frozen_ranks_one_is_ended_and_the_other_thawed() -> None:
    """Rank 1's wait returned since the verdict: it is thawed and left to the scan,
    while rank 0, still hung, is ended from its freeze (SIGTERM first)."""
    said = dataclasses.replace(incident(targets=[T, U]), action="ending",
                               signals=(sent("SIGSTOP"), sent("SIGSTOP", pid=22)))
    made = plan(said, [T, U], {21: OURS, 22: OURS}, progressed={22}, fresh=True,
                enforce=True)
    assert made == Plan(live=(T,), frozen=(T,), stale=(U,), outcomes={22: Result.UNKNOWN})


def test_the_plan_reads_no_clock_no_file_and_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every clock, `open` and the signaller's checks broken: the same plans (all that
    the plan knows of the world is what it is handed)."""
    import builtins
    import time

    from watchdog.daemon.signaller import Signaller

    def broken(*_args: object, **_kw: object) -> float:
        raise AssertionError("the plan reached outside its arguments")

    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter"):
        monkeypatch.setattr(time, name, broken)
    monkeypatch.setattr(builtins, "open", broken)
    monkeypatch.setattr(Signaller, "identify", broken)
    monkeypatch.setattr(Signaller, "send", broken)
    made = [plan(entry(step), [T], {21: who}, progressed={21} if returned else (),
                 fresh=fresh, enforce=enforce)
            for step, who, fresh, enforce, returned in CASES]
    monkeypatch.undo()
    assert made == [expected(step, who, fresh and enforce and not returned)
                    for step, who, fresh, enforce, returned in CASES]
