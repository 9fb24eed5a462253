"""What a restarted daemon makes of an unfinished response: a pure `plan` from the
journal's entry and the targets' live identities; the enforcer acts on it (its
`RESUME` step, act/ladder.py).

An entry holds what its last write said: a daemon that died at a step leaves the last
`[j]` before its death. For every step: a target is ended now (`live`) only if it is
still ours (its identity), the verdict fresh (`replay_within`), the mode `enforce`, the
action "ending" or "ended", and its wait not returned since (`progressed`); it goes down
the ladder from HOLD's round (it takes no evidence and parses no dumps). One still ours
and not ended now is `unknown`, left to the scan to judge afresh. One gone counts
`killed` only if the entry says a signal to end it may have gone (`ladder: "begun"`, or
a SIGTERM or SIGKILL listed); else what its identity check found (its own end). One
listed SIGSTOPped and not SIGTERMed is frozen still: ended now (SIGTERM first:
`frozen`), or thawed (`stale`), never left stopped. Step by step
(tests/unit/daemon/test_resume_plan.py holds this table as cases):

    died at   its entry holds               so the plan
    BEGIN     none, or the verdict alone    no entry: nothing was signalled, the scan
              (action "ending")             judges afresh; else no target is frozen
                                            that it knows of (a SIGSTOP sent and not yet
                                            journaled is not: a stale target so stopped
                                            is not thawed; the window is the back-to-back
                                            SIGSTOPs'), none gone was ours
    EVIDENCE, the SIGSTOPs sent (`freeze`)  the frozen are known: ended, or thawed when
    HOLD                                    stale; none gone was ours
    LEAVING,  the round begun (`ladder`,    a target gone was ended by us; its SIGTERMs
    TERM      action "ended")               are not listed, so every SIGSTOPped one
                                            counts as frozen (ended again, or thawed: a
                                            SIGCONT after its SIGTERM harms nothing)
    KILL,     the SIGTERMs and SIGCONTs     none is frozen; one still there gets the
    FRAMES    (if one outlived the grace;   round again (SIGTERM, the grace, SIGKILL)
              else as at TERM)
    SETTLE    the outcome (`native_hot`)    its targets gone, ended by us: the settle
                                            again, in full, if it ended something
    DONE      `closed_at` (it died before   `closed`: the writes alone (the line and
              the line and the flag were    the flag, each only if not on disk yet)
              on disk, or a write failed)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from watchdog.daemon.signaller import Result, Target, end_of
from watchdog.states import End
from watchdog.status import Incident


@dataclass(frozen=True)
class Plan:
    """What to do with an earlier daemon's unfinished response."""

    closed: bool = False  # all done but its writes: the incident line and the flag
    live: tuple[Target, ...] = ()  # ended now, from HOLD's round
    frozen: tuple[Target, ...] = ()  # of `live`: SIGSTOPped, not yet SIGTERMed
    stale: tuple[Target, ...] = ()  # SIGSTOPped, not SIGTERMed, not ended now: thawed
    # pid -> KILLED (gone after a signal to end it may have gone), UNKNOWN (ours, left
    # to the scan), or what its identity check found (GONE, NOT_OURS, ...); not `live`
    outcomes: dict[int, End] = field(default_factory=dict)


def plan(incident: Incident, targets: Sequence[Target], identities: Mapping[int, Result], *,
         progressed: Collection[int] = (), fresh: bool, enforce: bool) -> Plan:
    """The plan for `incident` (the entry's, with its `targets`): `identities` is each
    target's identity check now (pid -> `Result`), `progressed` the pids whose wait
    returned since the verdict, `fresh` whether the verdict is within `replay_within`,
    `enforce` whether the mode is `enforce`."""
    if incident.closed_at is not None:
        return Plan(closed=True)
    signals = incident.signals or ()
    # The ladder had begun: every target may have had its signals (they are journaled
    # per round); else only those the journal names.
    signalled = ({t.pid for t in targets} if incident.ladder else
                 {s.pid for s in signals if s.signal in ("SIGTERM", "SIGKILL")})
    due = fresh and enforce and incident.action in ("ending", "ended")
    live: list[Target] = []
    outcomes: dict[int, End] = {}
    for target in targets:
        who = identities[target.pid]
        if who == Result.OURS and due and target.pid not in progressed:
            live.append(target)
        elif who == Result.OURS:
            outcomes[target.pid] = End.UNKNOWN  # left to the scan to judge afresh
        else:
            outcomes[target.pid] = End.KILLED if target.pid in signalled else end_of(who)
    termed = {s.pid for s in signals if s.signal == "SIGTERM"}
    stopped = [t for t in targets if t.pid not in termed and any(
        s.pid == t.pid and s.signal == "SIGSTOP" and s.result == Result.SENT
        for s in signals)]
    # Frozen and not ended now (stale, observe, progressed): thawed, never left stopped.
    # Those ended now are frozen still: SIGTERM first.
    return Plan(live=tuple(live), outcomes=outcomes,
                frozen=tuple(t for t in stopped if t in live),
                stale=tuple(t for t in stopped if t not in live
                            and outcomes.get(t.pid) == End.UNKNOWN))
