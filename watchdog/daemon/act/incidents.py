"""An incident as it is journaled: what was found, on which ranks, and who holds the
job up. Built from the daemon's ranks when it decides to act, as a frozen
`status.Incident`; the enforcer advances it with what it did (evidence, signals,
outcome, wired memory)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import replace

from watchdog import cause
from watchdog.cause import CAUSES, Cause
from watchdog.daemon.judge.wedge import Wedge
from watchdog.daemon.lifecycle import Key, Rank
from watchdog.daemon.view import Shown, rank_status
from watchdog.states import Fenced, State
from watchdog.status import (
    Culprit,
    Elsewhere,
    Fence,
    FlightEntry,
    Incident,
    IncidentRank,
    PeerView,
)
from watchdog.text import who

FLIGHT_TAIL = 8  # collectives of each due rank's flight recorder in an incident


def culprit_of(host: str, rank: Rank, why: str) -> Culprit:
    """The rank named as the incident's culprit, with why."""
    return Culprit(host=host, rank=rank.record.rank, pid=rank.record.pid,
                   state=rank.state.value, reason=why)


def waited_for(due: list[Rank], local: list[Rank]) -> tuple[Rank, str] | None:
    """The local rank the due ones wait for, in a wait of its own (a save whose storage
    stopped answering), not spinning and not ahead of them in the collective sequence;
    and why."""
    most = max((r.record.collectives for r in due), default=0)
    for rank in sorted(local, key=lambda r: r.record.rank):
        own = rank.verdict.own if rank.verdict is not None else None
        if rank in due or own is None or own.spinning or rank.record.collectives > most:
            continue
        if own.quiet is None:
            moved = "its I/O unknown"
        elif (own.read or 0) + (own.written or 0) == 0:
            moved = "no byte moved"
        else:
            moved = f"no byte moved for the last {own.quiet:.0f}s"
        return rank, (f"in {own.op or 'a wait'} of its own for {own.seconds:.0f}s, {moved}, "
                      "while its peers wait on it")
    return None


def death_culprit(host: str, rank: Rank, how: str) -> Culprit:
    """A rank of the job that died: the culprit a fence (and the peers' incidents)
    name, with its cause and one line."""
    shown = rank_status(rank.record, rank.state, None)
    return replace(culprit_of(host, rank, how), cause=Cause.PEER_DEAD,
                   summary=f"rank {rank.record.rank} on {host} (pid {rank.record.pid}) "
                           f"{how} at {cause.where(shown)}; its peers cannot finish without it")


def incident_rank(rank: Rank) -> IncidentRank:
    """A rank as the incident lists it: identity, state, wait and counters at the verdict."""
    v = rank.verdict
    return IncidentRank(pid=rank.record.pid, rank=rank.record.rank, state=rank.state.value,
                        phase=rank.record.phase.label, op=rank.record.op,
                        seconds_in_wait=round(v.seconds_in_wait, 3) if v else None,
                        busiest_thread_cpu=round(v.busiest_cpu, 3) if v else None,
                        attempt=rank.attempt, progress=rank.record.waits_completed,
                        collectives=rank.record.collectives, frames=(v.seen or None) if v else None)


def verdict_of(due: list[Rank], fenced: Fence | None) -> str:
    """The incident's verdict: the fence's kind, else stalled if any due rank is, else blocked."""
    if fenced is not None:
        return Fenced.PEER_DIED if fenced.local else Fenced.FENCED
    return State.STALLED if any(r.state == State.STALLED for r in due) else State.BLOCKED


def reason_of(worst: Rank, fenced: Fence | None) -> str:
    """The incident's reason: the worst rank's, or what the fence said and who sent it."""
    if fenced is None:
        return worst.reason
    if fenced.local:
        return str(fenced.reason)
    return f"peer {fenced.origin} fenced the job: {fenced.reason}"


def local_finding(local: list[Rank],
                  links: Mapping[Key, str | None] | None = None) -> cause.Finding:
    """The cause as this node alone sees it: its live ranks of the job, each with its
    data link as last probed (`links`); the others reported by no one (no peers asked),
    which decides nothing by itself."""
    links = links or {}
    shown = [rank_status(r.record, r.state, r.verdict, Shown(data_link=links.get(r.key)),
                         reason=r.reason) for r in local]
    world = max((r.record.world_size for r in local), default=0)
    here = {r.record.rank for r in local}
    return cause.decide(shown, [i for i in range(world) if i not in here])


def fenced_finding(fenced: Fence) -> tuple[str, str]:
    """(cause, summary) of a fenced job: a local rank's death, or the origin's words."""
    c = fenced.culprit
    if fenced.local:
        if c is not None and c.summary:
            return Cause.PEER_DEAD, c.summary
        dead = who(c.rank, c.host, c.pid) if c is not None else "a rank of the job"
        return Cause.PEER_DEAD, f"{dead} died: {fenced.reason}; its local peers are ended"
    said = (c.summary if c is not None and c.summary else fenced.reason) or ""
    return ((c.cause if c is not None and c.cause in CAUSES else Cause.UNKNOWN),
            f"fenced by {fenced.origin}: {said}")


def with_view(incident: Incident, view: PeerView | None) -> Incident:
    """The incident with the cluster view's cause and one line (the peers answered),
    unless the node's own cause says more (cause.replaces); a local culprit carries
    them too."""
    if view is None or not cause.replaces(view.cause, incident.cause):
        return incident
    found, summary = view.cause, view.summary or incident.summary
    c = incident.culprit
    return replace(incident, cause=found, summary=summary,
                   culprit=replace(c, cause=found, summary=summary) if c else None)


def view_culprit(view: PeerView | None) -> Culprit | None:
    """The rank the peers' view names as holding the job up, as an incident names it."""
    named = view.culprit if view is not None else None
    if named is None:
        return None
    return Culprit(host=named.host, rank=named.rank, pid=named.pid, state=named.state,
                   reason=named.reason)


def fence_culprit(incident: Incident, view: PeerView | None) -> Culprit:
    """What a fence names: the incident's culprit, else the cluster view's, else no
    rank; always with the cause and its one line, which the peers' incidents take."""
    named = incident.culprit or view_culprit(view) or Culprit()
    return replace(named, cause=incident.cause, summary=incident.summary)


def fence_named(fenced: Fence) -> Culprit | None:
    """The rank a fence names, None when it names none (only its cause and line sent)."""
    named = fenced.culprit
    if named is not None and named.rank is None and named.host is None and named.pid is None:
        return None
    return named


def _culprit(host: str, due: list[Rank], local: list[Rank], stopped: list[Rank],
             wedged: Wedge | None, quiet: list[Rank]) -> Culprit | None:
    """Who holds the job up, as far as this node sees: a stopped rank, else the rank the
    due ones wait for in a wait of its own, else the wedge's culprit (here or on a peer),
    else the one quiet rank; None: no one rank."""
    if stopped:
        return culprit_of(host, stopped[0], "stopped (SIGSTOP or traced) while its peers wait")
    behind = waited_for(due, local)
    if behind is not None:
        return culprit_of(host, *behind)
    if wedged is not None:  # judge/wedge.py: every rank spinning on nothing
        stuck = next((r for r in local if r.record.rank == wedged.culprit), None)
        if stuck is not None:
            return culprit_of(host, stuck, f"{stuck.verdict.seen if stuck.verdict else ''}, "
                                           "bytes left unread in its sockets while its "
                                           "peers wait on it")
        if wedged.culprit_host is not None:
            return Culprit(host=wedged.culprit_host, rank=wedged.culprit,
                           reason="bytes left unread in its sockets while its peers wait "
                                  "on it")
    if len(quiet) == 1:  # judge/detector.py: asleep in a wait, nothing moving
        return culprit_of(host, quiet[0], "waits with nothing spinning and nothing moving")
    return None


def _named(rank: Rank) -> str:
    """"rank 1"; a single process (no group, world size 1) has no rank: "pid 4242"."""
    rec = rank.record
    return f"rank {rec.rank}" if rec.rank >= 0 else f"pid {rec.pid}"


def new_id(wall: float) -> str:
    """An incident's id (also its evidence folder's name): `YYYYmmddTHHMMSS-xxxxxx`, UTC."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall)) + "-" + uuid.uuid4().hex[:6]


def new_incident(*, wall: float, host: str, uid: int, job: str, mode: str, kill_scope: str,
                 due: list[Rank], targets: list[Rank], local: list[Rank],
                 fenced: Fence | None,
                 links: Mapping[Key, str | None] | None = None,
                 incident_id: str = "") -> Incident:
    """The incident for ending `targets` because `due` ranks are hung (or a peer fenced
    the job); `local` is every live local rank of the job, for the culprit, and `links`
    each rank's data link as last probed, for the cause. `incident_id`: the id a fence's
    answer gave already (else a new one)."""
    worst = max(due, key=lambda r: r.verdict.seconds_in_wait if r.verdict else 0.0)
    stopped = [r for r in local if r.state == State.STOPPED]
    wedged = next((r.verdict.wedge for r in due if r.verdict and r.verdict.wedge), None)
    quiet = sorted((r for r in due if r.verdict and r.verdict.quiet),
                   key=lambda r: r.record.rank)
    mine = cause.own(wedged.note if wedged is not None else None,
                     [f"{_named(r)}'s {r.verdict.quiet}" for r in quiet if r.verdict],
                     bool(stopped))
    if fenced is not None:
        found, summary = fenced_finding(fenced)
    elif mine is not None:  # what the node alone saw: a wedge, a quiet hang
        found, summary = mine
    else:
        finding = local_finding(local, links)
        found, summary = finding.cause, finding.summary
    culprit = fence_named(fenced) if fenced is not None else _culprit(
        host, due, local, stopped, wedged if found == Cause.COLLECTIVE_WEDGED else None,
        quiet if found == Cause.QUIET_HANG else [])
    if culprit is not None and fenced is None:
        culprit = replace(culprit, cause=found, summary=summary)
    return Incident(
        id=incident_id or new_id(wall),
        time=wall,
        host=host,
        job=job,
        # Which launch of the job (`mlx-watchdog launch` numbers them), when known.
        attempt=max((r.attempt for r in targets if r.attempt is not None), default=None),
        uid=uid,
        verdict=verdict_of(due, fenced),
        mode=mode,
        kill_scope=kill_scope,
        reason=reason_of(worst, fenced),
        cause=found,
        summary=summary,
        ranks=tuple(incident_rank(r) for r in targets),
        pids=tuple(r.record.pid for r in targets),
        seconds_without_progress=max(
            (r.verdict.seconds_since_progress for r in due if r.verdict), default=0.0),
        busiest_thread_cpu=max(
            (r.verdict.busiest_cpu for r in due if r.verdict), default=0.0),
        flight_recorder_tail={str(r.record.rank): tuple(
            FlightEntry(number=c.number, op=c.op, dtype=c.dtype, bytes=c.nbytes)
            for c in r.record.flight[-FLIGHT_TAIL:]) for r in due},
        culprit=culprit,
        # The fence's origin's incident: where the evidence of the job's other ranks is.
        elsewhere=((Elsewhere(fenced.origin, fenced.incident),)
                   if fenced is not None and fenced.incident and not fenced.local else None),
    )
