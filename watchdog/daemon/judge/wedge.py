"""Pure: a collective wedged with nothing to explain it, decided per job.

Every rank of the job present (on this node, or on a peer whose `/status` answered a
moment ago: `remote` builds its member from what that peer published), each in a wait at the same
collective (or the next one of the same op, which a ring neighbour whose part of the
current one completed has issued), none stopped; each rank's busy threads sampled
spinning in a wait frame (judge/frames.py), no byte moving on the job's sockets for
QUIET_FOR seconds, no data link found down. Then nobody computes and nothing moves: the
job is ended at its wedge deadline, max(wedge_floor, auto_factor x the longest completed
wait of that kind), instead of the auto floor. A pause (a stopped rank), a link blip (a
link down, or bytes moving), a slow peer (a rank computing) and a checkpoint (a rank in
a wait of its own, outside the collective) each fail one condition and keep today's
rules.

Spinning or asleep is not what makes a wedge (issue 58): a rank with no thread busy whose
sample finds every thread parked in its backend's wait (frames.asleep) is a member as a
spinning one is, but only when every rank's stillness was read from byte counters
(`exact`: probes/tcpdiag.py); on queues alone a parked job keeps the quiet hang's rule.
A wedge whose every rank's stillness is exact is ended at the lower `wedge_floor_exact`.

The culprit is the rank with bytes received and not read while its busy thread spins
(it stopped reading its socket), with its host when on a peer; with none, no one rank
is named. A rank on a peer lacking any fact (an old peer, nothing sampled there yet) is
unknown: no wedge, today's rules, as for a peer that did not answer (a partition).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from watchdog.backends import links_probed
from watchdog.daemon.judge.frames import Reading
from watchdog.states import FrameKind, Link, Phase, State
from watchdog.status import RankStatus

QUIET_FOR = 3.0  # seconds the job's sockets' queues must stand still
# A rank in a collective's wait this long has its sockets' byte counters read at every
# scan (cheap: no stop of the rank); a job whose every rank's counters stood exactly
# still for EARLY_STILL is sampled then (once a wait), not first at its wedge deadline:
# by the time the sample is read, QUIET_FOR has passed.
TRACK_AFTER = 0.5
EARLY_STILL = 1.0


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
    seen: Reading | None  # its latest stack sample, classified; None: none fresh
    quiet: float | None  # seconds its sockets' queues stood still; None: unknown
    unread: int = 0  # bytes received in its sockets and not read
    link: str | None = None  # its data-link probe ("up", "down ...", ...)
    host: str | None = None  # the peer it lives on; None: this node
    # Its stillness read from each socket's byte counters, not the queues alone.
    exact: bool = False
    # Seen with no thread busy, every thread parked in its backend's wait (frames.asleep).
    parked: bool = False


@dataclass(frozen=True)
class Wedge:
    """Why the job is wedged, in words, and the rank it names (None: no one rank)."""

    note: str
    culprit: int | None = None
    culprit_host: str | None = None  # its host when on a peer
    # Every rank's stillness read from byte counters: the lower floor applies.
    exact: bool = False


def exact_reading(quiet_exact: bool, backend: str | None, link: str | None) -> bool:
    """Whether a rank's stillness is exact enough for the lower floor: read from byte
    counters, and, where the backend's links are probed (ring), its link found up (a link
    blip keeps the counters still too: the probe must have answered before the lower floor
    applies)."""
    return quiet_exact and (not links_probed(backend)
                            or (link or "").split(" ", 1)[0] == Link.UP.value)


def waited_op(current_op: str, last_op: str) -> str:
    """What a member waits in, as every node spells it: the blocking call with its last
    collective's op, without the collective's number (a neighbour may be one ahead)."""
    return f"{current_op} ({last_op})"


def remote(rank: RankStatus, host: str, now_ns: int) -> Member | None:
    """A rank a peer published (its `/status`, fresh) as a member, or None when it lacks
    what a member needs (an old peer: no wedge). Its frames' words are the peer's."""
    if rank.rank is None or rank.world_size is None or rank.phase is None \
            or rank.collectives is None or rank.state is None:
        return None
    phase = next((p for p in Phase if p.label == rank.phase), None)
    if phase is None:
        return None
    kind = next((k for k in FrameKind if k.value == rank.frames_kind), FrameKind.UNKNOWN)
    seen = Reading(kind, rank.frames or rank.frames_kind) if rank.frames_kind else None
    in_wait = rank.seconds_in_wait or 0.0
    last = rank.last_collective.op if rank.last_collective else None
    op = rank.current_op or ""
    if last is not None and op.endswith(")") and " (" in op:
        op = op.rsplit(" (", 1)[0]  # "eval (all_sum #12)": the call alone
    return Member(
        rank=rank.rank, world_size=rank.world_size, phase=phase,
        waiting_since_ns=max(1, now_ns - int(in_wait * 1e9)) if in_wait > 0 else 0,
        collectives=rank.collectives, op=waited_op(op, last or ""),
        stopped=rank.state == State.STOPPED, seen=seen, quiet=rank.quiet_seconds,
        unread=rank.unread_bytes or 0, link=rank.data_link, host=host,
        exact=exact_reading(bool(rank.quiet_exact), rank.backend, rank.data_link))


def decide(members: Sequence[Member]) -> Wedge | None:
    """The job's wedge, or None when anything explains the wait (or it cannot be told)."""
    if not members:
        return None
    world = members[0].world_size
    ranks = {m.rank for m in members}
    if world < 2 or len(ranks) != world or len(members) != world:
        return None  # a rank unseen (a peer silent, or none yet), or one seen twice
    if any(m.stopped or m.phase != Phase.WAIT or m.waiting_since_ns <= 0 for m in members):
        return None
    # The same collective, or the next: a ring neighbour whose part of the current one
    # completed has issued the next and waits in it (the same op).
    numbers = [m.collectives for m in members]
    if max(numbers) - min(numbers) > 1 or len({m.op for m in members}) != 1:
        return None
    if any(m.seen is None or m.seen.kind != FrameKind.WAITING for m in members):
        return None
    if any(m.quiet is None or m.quiet < QUIET_FOR for m in members):
        return None
    exact = all(m.exact for m in members)
    if any(m.parked for m in members) and not exact:
        return None  # asleep on queues alone: the quiet hang's rule, not the wedge's
    if any(Link.is_down(m.link) for m in members):
        return None
    ordered = sorted(members, key=lambda m: m.rank)
    stuck = max(ordered, key=lambda m: m.unread)
    culprit = stuck if stuck.unread > 0 else None
    quiet = min(m.quiet or 0.0 for m in members)
    seen = "; ".join(f"{_named(m)}'s {m.seen.what}" for m in ordered if m.seen)
    head = (f"{_named(culprit)} leaves {culprit.unread} B unread in its sockets; "
            if culprit else "")
    nodes = " across nodes" if any(m.host for m in members) else ""
    read = " (byte counters)" if exact else ""
    return Wedge(f"collective wedged{nodes}: {head}{seen}; no byte moved on the job's "
                 f"sockets for {quiet:.0f}s{read}, no rank stopped, every link answering",
                 culprit.rank if culprit else None, culprit.host if culprit else None,
                 exact=exact)


def _named(m: Member) -> str:
    return f"rank {m.rank} on {m.host}" if m.host else f"rank {m.rank}"
