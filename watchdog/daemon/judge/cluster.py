"""The cluster judgement: a job's ranks as every reachable node reported them, judged.

On a cluster with one rank per Mac, each daemon sees one rank and cannot tell
a rank waiting on a frozen peer from the frozen peer itself. Lining up all
ranks of a job does: the waiting ranks sit in the same collective, and the
culprit is the one that is stopped, gone, elsewhere, or furthest behind. A job
is `healthy` only when nothing says otherwise: `hung`, `suspect` (a rank stopped
while its peers wait, none of them past its deadline yet), `unknown` (a rank behind
an unreachable node while another waits) and `ended` (every rank gone, or the
watchdog ended some; each rank with what happened to it) are told apart.

Pure, like the rest of `judge/`: the nodes' answers (`status.NodeAnswer`, asked by
`net/cluster.py`) in, a `status.ClusterView` out. `cluster status` and the daemon
(`act/peers.py`, whose `peer_view` says what holds a job of ours) judge with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from watchdog import cause
from watchdog.daemon.judge import stragglers
from watchdog.record import MAX_WORLD_SIZE
from watchdog.states import ENDED, HUNG, WAITING_PHASES, State
from watchdog.status import (
    ClusterNode,
    ClusterView,
    ComputingRank,
    HoldingRank,
    JobCulprit,
    JobState,
    JobView,
    NodeAnswer,
    PeerView,
    RankStatus,
    ReportedRank,
)

LOCAL = "local"  # the peer name of this node's own answer


def _last(seen: ReportedRank) -> int:
    last = seen.rank.last_collective
    return last.number if last is not None and last.number is not None else 0


def _past_deadline(seen: ReportedRank) -> bool:
    """The rank's wait is past its deadline as its daemon judges it (stalled, blocked),
    or by the seconds its node reported (a sampled rank, judged by no daemon)."""
    r = seen.rank
    if r.state in HUNG:
        return True
    return (r.seconds_in_wait is not None and r.deadline_seconds is not None
            and r.seconds_in_wait >= r.deadline_seconds)


def where(rank: RankStatus) -> str:
    """The rank's last collective, as "op #number"."""
    c = rank.last_collective
    return f"{c.op if c.op is not None else '?'} #{c.number if c.number is not None else 0}" \
        if c is not None else "no collective yet"


def _culprit(seen: ReportedRank, reason: str) -> JobCulprit:
    r = seen.rank
    return JobCulprit(host=r.host, node=seen.node, rank=r.rank, pid=r.pid, state=r.state,
                      reason=reason)


def _ended_note(ranks: Sequence[ReportedRank]) -> str:
    """What happened to each rank, ranks that share a fate said once: `ranks 0, 1 on
    h0, h1: killed, ended by the watchdog (incident X)`."""
    fates: dict[tuple[str | None, str | None], list[RankStatus]] = {}
    for s in ranks:
        fates.setdefault((s.rank.state, s.rank.reason), []).append(s.rank)
    parts = []
    for (state, reason), members in fates.items():
        hosts = ", ".join(dict.fromkeys(str(r.host) for r in members))
        names = ", ".join(str(r.rank) for r in members)
        parts.append(f"{'rank' if len(members) == 1 else 'ranks'} {names} on {hosts}: "
                     f"{state}" + (f", {reason}" if reason else ""))
    return "; ".join(parts)


def judge_job(job: str, ranks: Sequence[ReportedRank], unreachable: Sequence[str],
              uid: int | None = None) -> JobView:
    """Healthy or hung, and if hung, which rank holds the job up and why."""
    def order(seen: ReportedRank) -> tuple[int, int]:
        return (seen.rank.rank if seen.rank.rank is not None else -1, seen.rank.pid or 0)

    seen = sorted(ranks, key=order)
    # A peer's /status is untrusted: sizes are bounded before any range is built.
    sizes = [s.rank.world_size for s in seen]
    world = min(MAX_WORLD_SIZE, max([n for n in sizes if n is not None] + [len(seen)]))
    present = {s.rank.rank for s in seen}
    missing = tuple(i for i in range(world) if i not in present)
    waiting = [s for s in seen if s.rank.phase in WAITING_PHASES and s.rank.state not in ENDED]
    hung = any(s.rank.state in HUNG for s in seen)
    troubled = [s for s in seen if s.rank.state in ENDED]
    # A rank stopped while its peers wait is hung only once a wait is past its deadline
    # as the daemon judges it: Ctrl-Z, a debugger's attach or a short pause stops a rank
    # for a moment in a job making collectives by the second. Before, the job is
    # `suspect` (named, its culprit too, and no failing exit).
    stopping = bool(waiting) and any(s.rank.state == State.STOPPED for s in seen)
    suspect = stopping and not hung and not any(_past_deadline(s) for s in waiting)
    if waiting and troubled or stopping and not suspect:
        hung = True
    stopped_live = [s for s in seen if s.rank.state == State.STOPPED]
    if stopped_live and any(s.rank.state in ENDED for s in seen):
        hung = True  # its peers are gone and a stopped rank of it is left behind
    suspect = suspect and not hung
    # A rank behind an unreachable node cannot be seen: while another rank of the
    # job waits (on it, perhaps), the job is not known to be healthy.
    # Nor known to be over: a rank ended here says nothing of one behind a node
    # that does not answer, which may still hold the job's other ranks.
    unknown = not hung and bool(missing and unreachable) and bool(
        waiting or any(s.rank.state in ENDED for s in seen))
    # Every rank gone, or the watchdog ended some: the job is over, whatever waits.
    ended = not hung and not unknown and bool(seen) and (
        all(s.rank.state in ENDED for s in seen)
        or any(s.rank.state == State.KILLED for s in seen))
    suspect = suspect and not unknown and not ended
    state = (JobState.HUNG if hung else JobState.UNKNOWN if unknown
             else JobState.ENDED if ended else JobState.SUSPECT if suspect
             else JobState.HEALTHY)
    view = JobView(job=job, uid=uid, world_size=world, state=state, ranks=tuple(seen),
                   missing_ranks=missing)
    if ended:
        return replace(view, evidence=_ended_note(seen))
    if not hung and not unknown and not suspect:
        traced = [s for s in seen if _traced_what(s.rank)]
        return replace(view, straggler=stragglers.from_ranks(job, uid, [s.rank for s in seen]),
                       evidence=(f"rank {traced[0].rank.rank} on {traced[0].rank.host} is "
                                 f"{_traced_what(traced[0].rank)}: the job is held"
                                 if traced else ""))
    finding = cause.decide([s.rank for s in seen], missing, unreachable)
    # Who waits on the culprit: a stopped rank frozen inside its own wait is not one.
    waiters = [s for s in waiting if s.rank.state != State.STOPPED] or waiting
    names = ", ".join(str(s.rank.rank) for s in waiters)
    wait_note = ((f"rank {names} waits" if len(waiters) == 1 else f"ranks {names} wait")
                 + f" in {where(waiters[0].rank)}" if waiters else "no rank waits")
    stopped = [s for s in seen if s.rank.state == State.STOPPED]
    gone = [s for s in seen if s.rank.state in ENDED]
    placed = {id(s) for s in stopped} | {id(s) for s in gone}  # by identity: linear
    outside = [s for s in seen
               if s.rank.phase not in WAITING_PHASES and id(s) not in placed]
    if stopped:
        r = stopped[0]
        culprit = _culprit(r, f"stopped at {where(r.rank)} while its peers wait")
        note = f"rank {r.rank.rank} is stopped at {where(r.rank)}"
    elif gone and not unknown:
        r = gone[0]
        culprit = _culprit(r, f"{r.rank.state} at {where(r.rank)}: "
                              f"{r.rank.reason or ''}".strip())
        note = f"rank {r.rank.rank} is gone ({r.rank.state}) at {where(r.rank)}"
    elif missing:
        culprit = JobCulprit(rank=missing[0], state="unknown",
                             reason="not reported by any reachable node"
                             + (f" (unreachable: {', '.join(unreachable)})"
                                if unreachable else ""))
        note = f"rank {missing[0]} is not reported by any node"
    elif outside and waiting:
        r = outside[0]
        culprit = _culprit(r, f"outside a wait ({r.rank.phase}) at {where(r.rank)} while "
                              "its peers wait")
        note = f"rank {r.rank.rank} is {r.rank.phase} at {where(r.rank)}"
    else:
        r = min(seen, key=_last)
        culprit = _culprit(r, f"furthest behind, at {where(r.rank)}")
        note = f"rank {r.rank.rank} is furthest behind at {where(r.rank)}"
    if unknown and gone:  # what is known of the job: its ranks that ended here
        note += "; " + _ended_note(gone)
    return replace(view, culprit=culprit, evidence=f"{wait_note}; {note}",
                   cause=finding.cause, summary=finding.summary)


def analyze(nodes: Sequence[NodeAnswer], only: tuple[int, str] | None = None) -> ClusterView:
    """Group every reachable node's ranks by job and judge each job (only the job
    `only`, (uid, job id), when given: a verdict here needs no other). Linear in
    the answers; a job's ranks past the world size cap are not its ranks."""
    # A job is (owner uid, job id): another user's ranks naming the same id
    # are another job, and never its culprit.
    jobs: dict[tuple[int, str], list[ReportedRank]] = {}
    # A node whose earlier ask failed but which answered since (late) is reachable.
    answered = {n.peer for n in nodes if n.ok}
    unreachable = [n.peer for n in nodes if not n.ok and n.peer not in answered]
    seen: set[tuple[str | None, int | None]] = set()  # a node listed twice counts once
    for node in nodes:
        for rank in node.status.ranks if node.ok and node.status is not None else ():
            key = (rank.host, rank.pid)
            if key not in seen:
                seen.add(key)
                owner = rank.uid if rank.uid is not None else -1
                if only is not None and (owner, rank.job) != only:
                    continue
                group = jobs.setdefault((owner, rank.job), [])
                if len(group) < MAX_WORLD_SIZE:
                    group.append(ReportedRank(node.peer, rank))
    return ClusterView(
        nodes=tuple(ClusterNode(
            peer=n.peer, ok=n.ok, error=n.error,
            host=n.status.host if n.ok and n.status else None,
            reboot_required=n.status.reboot_required if n.ok and n.status else None)
            for n in nodes),
        jobs=tuple(judge_job(job, ranks, unreachable, uid if uid >= 0 else None)
                   for (uid, job), ranks in sorted(jobs.items(), key=lambda kv: kv[0][::-1])))


_GONE = (State.STOPPED, State.EXITED, State.KILLED)


def peer_view(view: JobView, unreachable: Sequence[str]) -> PeerView:
    """What the peers say of a job of ours (its view judged with our own answer, named
    LOCAL): who holds it up, and the ranks on the peers that hold it, computing (a
    slow peer) or in a wait of their own (a checkpoint that ours may wait for)."""
    theirs = [s.rank for s in view.ranks if s.node != LOCAL and s.rank.state not in _GONE]
    return PeerView(
        culprit=view.culprit, evidence=view.evidence, cause=view.cause, summary=view.summary,
        unreachable=tuple(unreachable),
        computing=tuple(ComputingRank(rank=r.rank, host=r.host, pid=r.pid)
                        for r in theirs if r.computing is True),
        holding=tuple(HoldingRank(rank=r.rank, host=r.host, pid=r.pid, what=r.holding,
                                  collectives=r.collectives)
                      for r in theirs if r.holding),
        traced=tuple(HoldingRank(rank=r.rank, host=r.host, pid=r.pid,
                                 what=_traced_what(r), collectives=r.collectives)
                     for r in theirs if _traced_what(r)))


def _traced_what(rank: RankStatus) -> str:
    """A peer's rank a person traces, or whose tracer let go less than its deadline ago,
    in words; "" otherwise."""
    if rank.state == State.TRACED:
        return f"traced by pid {rank.tracer_pid}" + (f" ({rank.tracer})" if rank.tracer else "")
    if rank.since_traced is not None:
        return f"judged afresh since its tracer let go {rank.since_traced:.0f}s ago"
    return ""
