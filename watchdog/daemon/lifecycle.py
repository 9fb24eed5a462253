"""A watched rank and its lifecycle: every change of state goes through `transition`.

The daemon's scan, its hold, the exit watcher and each response move a rank from
state to state; each does it by naming an `Edge`, and the table below says from
which states that edge may be taken and what it sets. A rank has two parts to its
life: the state users see (`State`: running, stalled, killed, ...) and whether a
response has it (`escalating`: not judged meanwhile), with the two marks the
responses leave on it: the wait an incident was raised for (`acted_on`: one
incident per wait) and a peer node's hold (`held_until`, `held_reason`); and the
verdict and reason shown with it. Only `transition` writes any of them. A rank in a
final state (`killed`, `unkillable`, `exited`) stays there, but for the one way out of
`unkillable`: it went after all.

    edge        from                      to                 sets, and why
    judged      live, not escalating      the verdict's      a scan judged it (its verdict, reason)
    rejudged    live, escalating          (kept)             a scan judged it while a response has
                                                             it: verdict and reason shown fresh
    abandoned   live, not escalating      abandoned          its record is closed, the process runs
    held        live, not escalating      suspect            due, but a rank of its job computes
                                                             (`note`: the local hold, logged once)
    escalated   live, not escalating      (kept), escalating a response has it; `wait`: the wait
                                                             it was raised for (acted_on)
    peer_held   escalating                suspect            a peer node computes: left alone
                                                             until `until`, its wait not acted on
    released    escalating                (kept)             the response is done without ending
                                                             it (observed, gone, not ours, denied)
    retried     escalating                (kept), acted_on   the response failed, ran overdue or
                                          cleared            could not identify it, or it only
                                                             observed and the mode is now enforce:
                                                             judged afresh
    rearmed     live, not escalating      (kept), acted_on   a reload switched observe to enforce:
                                          cleared            a wait only observed is judged afresh
                                                             (due at once if still hung)
    exited      live, not escalating      exited             gone on its own
    killed      escalating                killed             the ladder ended it
    unkillable  escalating                unkillable         still there after SIGKILL
    went_late   unkillable                killed             it went after being declared unkillable

The escalation ladder itself (freeze with SIGSTOP, evidence, SIGTERM then SIGCONT,
grace, SIGKILL, settle) is a table of steps of its own (`act/ladder.py`), taken by the
daemon's loop when each is due, under its write-ahead journal; a rank is `escalating`
for all of it, and its end is one of the last five edges.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from watchdog import record
from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.sample import ProcessSample
from watchdog.daemon.signaller import Target
from watchdog.record import Record
from watchdog.states import FINAL, State

Key = tuple[int, float]  # a rank: (pid, start time), its identity wherever it is kept
JobKey = tuple[int, str]  # (uid, job): a job is its owner's


class Edge(enum.Enum):
    """A named change of a rank's life (the module's table)."""

    JUDGED = "judged"
    REJUDGED = "rejudged"
    ABANDONED = "abandoned"
    HELD = "held"
    EXITED = "exited"
    ESCALATED = "escalated"
    PEER_HELD = "peer_held"
    RELEASED = "released"
    RETRIED = "retried"
    REARMED = "rearmed"
    KILLED = "killed"
    UNKILLABLE = "unkillable"
    WENT_LATE = "went_late"


@dataclass
class Rank:
    """What the daemon knows of one rank process (its identity is the record's)."""

    path: str
    record: Record
    state: State = State.RUNNING
    verdict: Verdict | None = None
    reason: str = ""
    escalating: bool = False  # a response has it: not judged meanwhile
    gone_at: float | None = None  # monotonic seconds when it reached a final state
    # The wait an incident was raised for, (wait_since_ns, waits_completed).
    acted_on: tuple[int, int] | None = None
    # A peer node said another rank of the job computes: left alone until then
    # (monotonic seconds), when the cluster is asked again.
    held_until: float = 0.0
    held_reason: str = ""
    hold_note: str = ""  # the local hold last logged
    # Its identity was checked against the live process at least once. A record
    # whose pid was already gone at first sight proves nothing (anyone can
    # write one naming a dead pid and any job), so its "crash" fences no one.
    seen_alive: bool = False
    attempt: int | None = None  # of its job, from `mlx-watchdog launch` (attempts.py)
    # The cause of the last incident that acted on it, kept once its response is done
    # (while one is under way the response's own is shown). What else a rank shows (its
    # data link, sockets, pace) is no part of its life: daemon/jobs.py keeps it.
    cause: str | None = None

    @property
    def key(self) -> Key:
        """The rank's key in the table: its pid and start time."""
        return (self.record.pid, self.record.start_time)

    @property
    def live(self) -> bool:
        """Whether the rank has not reached a final state."""
        return self.state not in FINAL

    def target(self) -> Target:
        """What the signaller needs to signal this rank: identity, dump signal, files."""
        rec = self.record
        return Target(rec.pid, rec.start_time, rec.uid, rec.job, rec.rank, rec.dump_signal,
                      record.stacks_path(self.path), rec.start_ticks, self.path)


LiveRanks = list[tuple[Rank, ProcessSample]]  # a scan's live ranks, each with its sample


def _live_idle(rank: Rank) -> bool:
    return rank.live and not rank.escalating


# Which states each edge may leave from (see the module's table).
ALLOWED: dict[Edge, Callable[[Rank], bool]] = {
    Edge.JUDGED: _live_idle,
    Edge.REJUDGED: lambda rank: rank.escalating and rank.live,
    Edge.ABANDONED: _live_idle,
    Edge.HELD: _live_idle,
    Edge.ESCALATED: _live_idle,
    Edge.PEER_HELD: lambda rank: rank.escalating and rank.live,
    Edge.RELEASED: lambda rank: rank.escalating and rank.live,
    Edge.RETRIED: lambda rank: rank.escalating and rank.live,
    Edge.REARMED: _live_idle,
    Edge.EXITED: _live_idle,
    Edge.KILLED: lambda rank: rank.escalating and rank.live,
    Edge.UNKILLABLE: lambda rank: rank.escalating and rank.live,
    Edge.WENT_LATE: lambda rank: rank.state == State.UNKILLABLE,
}


def transition(rank: Rank, edge: Edge, now: float, reason: str = "",
               verdict: Verdict | None = None, *, wait: tuple[int, int] | None = None,
               note: str | None = None, until: float = 0.0) -> bool:
    """Take `edge` if the rank's state allows it; returns whether it was taken.

    `verdict` is the detector's, for `judged` (it, its state and its reason become
    the rank's) and `rejudged` (it and its reason: the state stays the response's);
    `reason` says why for every other edge. `wait` is the wait an
    `escalated` rank's incident was raised for, `note` a local hold's why (`held`),
    `until` when a `peer_held` rank's hold ends.
    """
    if not ALLOWED[edge](rank):
        return False
    if edge in (Edge.JUDGED, Edge.REJUDGED):
        assert verdict is not None
        rank.verdict, rank.reason = verdict, verdict.reason
        if edge is Edge.JUDGED:
            rank.state = verdict.state
    elif edge is Edge.ABANDONED:
        rank.state, rank.verdict, rank.reason = State.ABANDONED, None, reason
    elif edge is Edge.HELD:
        rank.state, rank.reason = State.SUSPECT, reason
        if note is not None:
            rank.hold_note = note
    elif edge is Edge.ESCALATED:
        rank.escalating = True
        if wait is not None:  # one incident per wait; a local hold of it is over
            rank.acted_on, rank.hold_note = wait, ""
    elif edge is Edge.PEER_HELD:
        rank.escalating, rank.acted_on = False, None
        rank.held_until, rank.held_reason = until, reason
        rank.state, rank.reason = State.SUSPECT, reason
    elif edge is Edge.RELEASED:
        rank.escalating = False
    elif edge is Edge.RETRIED:
        rank.escalating, rank.acted_on = False, None
    elif edge is Edge.REARMED:
        rank.acted_on = None
    elif edge in (Edge.EXITED, Edge.KILLED, Edge.WENT_LATE):
        rank.state = State.EXITED if edge is Edge.EXITED else State.KILLED
        rank.gone_at, rank.reason = now, reason
    elif edge is Edge.UNKILLABLE:
        # No gone_at: an unkillable rank is kept (and shown) until it goes.
        rank.state, rank.gone_at, rank.reason = State.UNKILLABLE, None, reason
    if edge in (Edge.KILLED, Edge.UNKILLABLE):
        rank.escalating = False
    return True


def rearm(ranks: Iterable[Rank], now: float) -> list[Rank]:
    """A reload switched observe to enforce: every wait only observed judged afresh
    (`rearmed`); the ranks rearmed."""
    return [r for r in ranks if r.acted_on is not None and transition(r, Edge.REARMED, now)]
