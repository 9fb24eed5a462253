"""A slow peer is not a hang: the one owner of the hold rule.

A job is hung only when none of its ranks makes progress. Its due ranks are held
instead of acted on while:

- local: a rank of the job here computes (its GPU time advancing too, or not read on a
  Mac: it may), still makes progress, or is busy in a wait of its own they wait for (a
  checkpoint being written: judge/ownwait.py)
  (`hold_reason`, applied by `hold` at every scan);
- the peers' view: a rank of the job on another node computes, or is in a wait of its
  own not ahead of ours (`peer_hold`, asked by a response before its ladder begins);
- recheck: a job a peer held is left alone for HOLD_RECHECK seconds, then asked about
  again, and shown held meanwhile (`peer_held`, `still_held`, `shown_held`);
- bound: no hold outlasts the blocked deadline (`past_bound`), so a misread can delay
  a verdict but never prevent it, but for a save or load still moving bytes, a cold
  first wait whose work shows at a fresh stack sample, and a person's tracer;
- traced: a rank of the job a person traces (states.TRACED) holds it, however long,
  here (`hold_reason`) and from a peer (`peer_traced`);
- a transfer: every rank of the job here in a collective's wait with bytes moving on
  its sockets (byte counters, a socket open at two reads: a long all_sum over a slow
  link) holds it up to the bound (`flowing`). One rank's other sockets moving (a
  server's clients) while another's stand still holds nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.lifecycle import Edge, Rank, transition
from watchdog.states import FINAL, State
from watchdog.status import Incident, PeerView

log = logging.getLogger(__name__)

HOLD_RECHECK = 5.0  # seconds before a job held by a computing peer node is asked about again
# Bytes moved on a rank's sockets this recently: a transfer under way (`flowing`). A link
# at 1 Mbit/s moves them every second or so; a waiting rank's sockets are read every 3 s
# with nothing busy (stacksampler.QUIET_QUEUES_EVERY). A transfer that stops is acted on
# this much later.
FLOW_WITHIN = 8.0

Jobs = dict[tuple[int, str], list[Rank]]  # (uid, job) -> its due ranks


def past_bound(due: Verdict, rules: Rules) -> bool:
    """The wait has outlasted every excuse but bytes still moving: the blocked
    deadline, or its own when longer."""
    return due.seconds_in_wait >= max(due.deadline, rules.blocked_deadline)


def hold_reason(due: Verdict, job: list[tuple[int, Verdict]], rules: Rules,
                rank: int | None = None) -> str:
    """Why a rank due for action should be left alone, or "" to act.

    A job is hung only when none of its ranks makes progress: while another
    rank of the job (`job`: (rank, verdict) of each rank seen; `rank` is the
    due one's) completes waits or issues collectives within its deadline (and
    the due rank's), or
    any rank of the job, the due one included, looks like it is computing,
    the others wait on a slow peer, not a dead one. That excuse ends at the
    blocked deadline (`past_bound`).

    So does a rank the due one may wait for (not ahead of it in collectives issued:
    those of an `mx.compile`d step are counted once, at the trace, so counts can tie)
    busy in a wait of its own (ownwait.py), not spinning: within that wait's own
    deadline, up to the same bound; or a save or load still moving bytes, however long
    (up to ownwait.MAX_IO_HOLD). A save or load that moved no byte for the stuck window
    (`auto_floor`) holds nobody.

    A rank of the job traced by a person (states.TRACED) holds it, however long: only
    its owner (or root) can trace it, so an owner holds nothing but his own job. A
    cold first wait (nothing learned of its kind) is held past the bound too, while a
    rank of the job shows its work at a fresh stack sample (`Verdict.works`).
    """
    traced = sorted(((r, v) for r, v in job if v.state == State.TRACED), key=lambda i: i[0])
    if traced:
        # A person at work on a rank of the job (a debugger, a profiler): held however
        # long, unbounded; the job is judged afresh from the detach (jobs.traced_at).
        r, v = traced[0]
        return f"held: rank {r} is {v.reason} (a person at work, not a hang)"
    live = [(r, v) for r, v in job if v.state != State.STOPPED]
    bounded = past_bound(due, rules)
    transfer = "" if bounded else flowing(due, job)
    if transfer:
        return transfer
    if bounded and due.cold:
        # A cold first step (nothing learned of its kind yet: a cold prefill, a first
        # step compiling, a load right after a relaunch) may outlast every bound: held
        # while its work shows at a fresh stack sample (compute frames named by the
        # table, or GPU time advancing), never on a guess or the CPU split alone.
        shown = sorted(r for r, v in live if v.computing and v.works)
        if shown:
            r = shown[0]
            seen = next(v.seen for q, v in live if q == r)
            return (f"held: rank {r} computes its first step of this kind (nothing learned "
                    f"yet, a cold first step, not a hang)" + (f": {seen}" if seen else ""))
    for r, v in sorted(live, key=lambda item: item[0]):
        own = v.own
        if r == rank or own is None or v.collectives > due.collectives:
            continue
        what = own.holds(rules.auto_floor)
        if what and (own.moving(rules.auto_floor) or not bounded):
            return f"held: rank {r} is {what}"
    if bounded:
        return ""
    # Its GPU time not read (macOS): its GPU may work while every CPU thread sleeps.
    # Unknown is not flat: it holds as a computing rank does, up to the same bound.
    unknown = [(r, v.gpu) for r, v in live if v.gpu.startswith("unknown")]
    if unknown:
        r, gpu = unknown[0]
        return f"held: rank {r}'s GPU time is {gpu} (it may be computing)"
    busy = sorted(r for r, v in live if v.computing)
    if busy:
        names = ", ".join(str(r) for r in busy)
        # What a stack sample saw its busy threads run, when one was taken (frames.py).
        seen = "; ".join(f"rank {r}'s {v.seen}" for r, v in sorted(live, key=lambda i: i[0])
                         if v.computing and v.seen)
        return (f"held: rank{'s' if len(busy) > 1 else ''} {names} of the job "
                f"{'are' if len(busy) > 1 else 'is'} computing (a slow peer, not a hang)"
                + (f": {seen}" if seen else ""))
    # Recent by both deadlines: a peer on a long fallback deadline must not hold
    # a rank whose own (learned) deadline passed long ago.
    moving = sorted(r for r, v in live if r != rank
                    and v.seconds_since_progress < min(v.deadline, due.deadline))
    if moving:
        names = ", ".join(str(r) for r in moving)
        return (f"held: rank{'s' if len(moving) > 1 else ''} {names} of the job "
                f"{'are' if len(moving) > 1 else 'is'} still making progress "
                "(a slow peer, not a hang)")
    return ""


def flowing(due: Verdict, job: list[tuple[int, Verdict]]) -> str:
    """Why a transfer under way holds the job, or "": every rank of it here (none
    stopped) in a collective's wait with bytes moved on its sockets within FLOW_WITHIN.
    Bytes move on the collective's sockets only while it does (a peer dead, frozen or cut
    off stops them within a socket buffer's worth), but a rank's other connections (a
    client, a logger) may move too: the hold is bounded like the computing peer's, by
    the blocked deadline (`hold_reason`), never past it."""
    if not job:
        return ""
    if any(v.state == State.STOPPED or v.wedge_deadline <= 0 or v.flowing is None
           or v.flowing >= FLOW_WITHIN for _, v in job):
        return ""
    names = ", ".join(str(r) for r, _ in sorted(job, key=lambda i: i[0]))
    return (f"held: bytes move on the sockets of rank{'s' if len(job) > 1 else ''} {names} "
            "(a long transfer, not a hang)")


def hold(due: Jobs, ranks: Iterable[Rank], rules: Rules, now: float) -> Jobs:
    """The due ranks to act on; the others are held (state `suspect`, with why). Each one
    kept is escalated by the caller, with the wait it is acted on for (lifecycle.py)."""
    table = list(ranks)
    kept: Jobs = {}
    for (uid, job), found in due.items():
        for rank in found:
            rec = rank.record
            assert rank.verdict is not None
            if still_held(rank, now):  # a peer node said a rank of the job computes
                transition(rank, Edge.HELD, now, rank.held_reason)
                continue
            # Only ranks of the same owner may speak for the job (a job is its owner's).
            mates = [(r.record.rank, r.verdict) for r in table
                     if r.record.job == job and r.record.uid == rec.uid
                     and r.state not in FINAL and r.verdict is not None]
            why = hold_reason(rank.verdict, mates, rules, rec.rank)
            if why:
                if holder(rank.hold_note) != holder(why):  # once per hold or change of it
                    log.info("job %s rank %s: %s; %s", job, rec.rank, rank.verdict.reason, why)
                transition(rank, Edge.HELD, now, f"{rank.verdict.reason}; {why}", note=why)
                continue
            kept.setdefault((uid, job), []).append(rank)  # escalated: loop._escalate
    return kept


def holder(why: str) -> str:
    """What holds a rank, without how long or how many bytes so far (which change at
    every scan): a hold is logged when it begins or what holds it changes."""
    return why.split(" (", 1)[0]


def may_hold(due: Iterable[Rank], rules: Rules) -> bool:
    """Whether the peers' view may still hold these due ranks (none past the bound)."""
    return all(r.verdict is not None and not past_bound(r.verdict, rules) for r in due)


# -- the peers' view -----------------------------------------------------------------

def peer_hold(view: PeerView | None, incident: Incident) -> str:
    """Why the peers' view holds the job (a rank there computing, or in a wait of its
    own not ahead of ours: the job's pace), or "" to act."""
    traced = peer_traced(view)
    if traced:
        return traced
    busy = view.computing if view is not None else ()
    if busy:
        names = ", ".join(f"{b.rank} on {b.host}" for b in busy)
        return f"held: rank {names} of the job is computing (a slow peer, not a hang)"
    ours = max((r.collectives or 0 for r in incident.ranks), default=0)
    pace = [h for h in (view.holding if view is not None else ())
            if h.collectives is not None and h.collectives <= ours]
    if pace:
        h = pace[0]
        return f"held: rank {h.rank} on {h.host} is {h.what}"
    return ""


def peer_traced(view: PeerView | None) -> str:
    """Why the peers' view holds the job for a rank there a person traces (or whose
    tracer let go less than its deadline ago), unbounded; "" when none."""
    traced = view.traced if view is not None else ()
    if not traced:
        return ""
    t = traced[0]
    return f"held: rank {t.rank} on {t.host} is {t.what} (a person at work, not a hang)"


# -- the recheck ---------------------------------------------------------------------

def peer_held(ranks: Iterable[Rank], held: str, now: float) -> None:
    """A rank of the job computes on another node: these are left alone until the
    recheck, shown held with why."""
    for rank in ranks:
        transition(rank, Edge.PEER_HELD, now,
                   f"{rank.verdict.reason if rank.verdict else ''}; {held}",
                   until=now + HOLD_RECHECK)


def still_held(rank: Rank, now: float) -> bool:
    """A peer's hold of this rank is not over yet."""
    return rank.held_until > now


def shown_held(rank: Rank, now: float) -> None:
    """A rank a peer held, escalated again: it stays shown held while the peers are
    asked again, instead of flipping to the verdict's state."""
    if rank.held_reason and now - rank.held_until < HOLD_RECHECK:
        transition(rank, Edge.HELD, now, rank.held_reason)
