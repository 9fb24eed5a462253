"""A watched rank and its lifecycle: every change of state goes through `transition`.

The daemon's scan, its hold, the exit watcher and the end of an escalation
move a rank from state to state; each does it by naming an `Edge`, and the
table below says from which states that edge may be taken. A rank in a final
state (`killed`, `unkillable`, `exited`) stays there, but for the one way out
of `unkillable`: it went after all.

    edge        from                          to             why
    judged      any live, not escalating      the verdict's  a scan judged it
    abandoned   any live, not escalating      abandoned      its record is closed, the process runs
    held        any live, not escalating      suspect        due, but a rank of its job computes
    exited      any live, not escalating      exited         gone on its own
    killed      escalating                    killed         the ladder ended it
    unkillable  escalating                    unkillable     still there after SIGKILL
    went_late   unkillable                    killed         it went after being declared unkillable
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from watchdog import record
from watchdog.daemon.detector import Verdict
from watchdog.daemon.signaller import Target
from watchdog.record import Record
from watchdog.states import FINAL, State


class Edge(enum.Enum):
    JUDGED = "judged"
    ABANDONED = "abandoned"
    HELD = "held"
    EXITED = "exited"
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
    escalating: bool = False
    gone_at: float | None = None  # monotonic seconds when it reached a final state
    acted_on: tuple[int, int] | None = None  # the wait an incident was raised for
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

    @property
    def key(self) -> tuple[int, float]:
        return (self.record.pid, self.record.start_time)

    @property
    def live(self) -> bool:
        return self.state not in FINAL

    def target(self) -> Target:
        rec = self.record
        return Target(rec.pid, rec.start_time, rec.uid, rec.job, rec.rank, rec.dump_signal,
                      record.stacks_path(self.path), rec.start_ticks, self.path)


def _live_idle(rank: Rank) -> bool:
    return rank.live and not rank.escalating


# Which states each edge may leave from (see the module's table).
ALLOWED: dict[Edge, Callable[[Rank], bool]] = {
    Edge.JUDGED: _live_idle,
    Edge.ABANDONED: _live_idle,
    Edge.HELD: _live_idle,
    Edge.EXITED: _live_idle,
    Edge.KILLED: lambda rank: rank.escalating and rank.live,
    Edge.UNKILLABLE: lambda rank: rank.escalating and rank.live,
    Edge.WENT_LATE: lambda rank: rank.state == State.UNKILLABLE,
}


def transition(rank: Rank, edge: Edge, now: float, reason: str = "",
               verdict: Verdict | None = None) -> bool:
    """Take `edge` if the rank's state allows it; returns whether it was taken.

    `verdict` is the detector's, for `judged` (its state and reason become the
    rank's); `reason` says why for every other edge.
    """
    if not ALLOWED[edge](rank):
        return False
    if edge is Edge.JUDGED:
        assert verdict is not None
        rank.state, rank.reason = verdict.state, verdict.reason
    elif edge is Edge.ABANDONED:
        rank.state, rank.verdict, rank.reason = State.ABANDONED, None, reason
    elif edge is Edge.HELD:
        rank.state, rank.reason = State.SUSPECT, reason
    elif edge in (Edge.EXITED, Edge.KILLED, Edge.WENT_LATE):
        rank.state = State.EXITED if edge is Edge.EXITED else State.KILLED
        rank.gone_at, rank.reason = now, reason
    elif edge is Edge.UNKILLABLE:
        # No gone_at: an unkillable rank is kept (and shown) until it goes.
        rank.state, rank.gone_at, rank.reason = State.UNKILLABLE, None, reason
    if edge in (Edge.KILLED, Edge.UNKILLABLE):
        rank.escalating = False
    return True
