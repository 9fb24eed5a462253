"""Pure: a collective wedged with nothing to explain it, decided per job.

Every rank of the job present (here: on this node), each in a wait at the same
collective (or the next one of the same op, which a ring neighbour whose part of the
current one completed has issued), none stopped; each rank's busy threads sampled
spinning in a wait frame (judge/frames.py), no byte moving on the job's sockets for
QUIET_FOR seconds, no data link found down. Then nobody computes and nothing moves: the
job is ended at its wedge deadline, max(wedge_floor, auto_factor x the longest completed
wait of that kind), instead of the auto floor. A pause (a stopped rank), a link blip (a
link down, or bytes moving), a slow peer (a rank computing) and a checkpoint (a rank in
a wait of its own, outside the collective) each fail one condition and keep today's
rules.

The culprit is the rank with bytes received and not read while its busy thread spins
(it stopped reading its socket); with none, no one rank is named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from watchdog.daemon.judge.frames import WAITING, Seen
from watchdog.states import Phase

QUIET_FOR = 3.0  # seconds the job's sockets' queues must stand still
FRESH = 10.0  # seconds a stack sample speaks for


@dataclass(frozen=True)
class Member:
    """One rank of a job as the loop sees it before judging it."""

    rank: int
    world_size: int
    phase: Phase
    waiting_since_ns: int  # 0 outside a wait
    collectives: int
    op: str  # what it waits in, with its last collective's op: "eval (all_sum)"
    stopped: bool
    seen: Seen | None  # its latest stack sample, classified; None: none fresh
    quiet: float | None  # seconds its sockets' queues stood still; None: unknown
    unread: int = 0  # bytes received in its sockets and not read
    link: str | None = None  # its data-link probe ("up", "down ...", ...)


@dataclass(frozen=True)
class Wedge:
    """Why the job is wedged, in words, and the rank it names (None: no one rank)."""

    note: str
    culprit: int | None = None


def decide(members: Sequence[Member]) -> Wedge | None:
    """The job's wedge, or None when anything explains the wait (or it cannot be told)."""
    if not members:
        return None
    world = members[0].world_size
    ranks = {m.rank for m in members}
    if world < 2 or len(ranks) != world or len(members) != world:
        return None  # a rank elsewhere (or none yet): decided where all are seen
    if any(m.stopped or m.phase != Phase.WAIT or m.waiting_since_ns <= 0 for m in members):
        return None
    # The same collective, or the next: a ring neighbour whose part of the current one
    # completed has issued the next and waits in it (the same op).
    numbers = [m.collectives for m in members]
    if max(numbers) - min(numbers) > 1 or len({m.op for m in members}) != 1:
        return None
    if any(m.seen is None or m.seen.kind != WAITING for m in members):
        return None
    if any(m.quiet is None or m.quiet < QUIET_FOR for m in members):
        return None
    if any((m.link or "").startswith("down") for m in members):
        return None
    ordered = sorted(members, key=lambda m: m.rank)
    stuck = max(ordered, key=lambda m: m.unread)
    culprit = stuck if stuck.unread > 0 else None
    quiet = min(m.quiet or 0.0 for m in members)
    seen = "; ".join(f"rank {m.rank}'s {m.seen.what}" for m in ordered if m.seen)
    head = (f"rank {culprit.rank} leaves {culprit.unread} B unread in its sockets; "
            if culprit else "")
    return Wedge(f"collective wedged: {head}{seen}; no byte moved on the job's sockets "
                 f"for {quiet:.0f}s, no rank stopped, every link answering",
                 culprit.rank if culprit else None)
