"""Pure: the rank that holds a healthy job back, by how much, and why: the figures and
the words (the tracker that keeps each rank's window and names a straggler with
hysteresis is judge/stragglers.py).

A rank of a job in step waits for its slowest peer at every collective; the peer it
waits for waits least. So, per rank over a sliding window (`WINDOW`), two figures:

- its *wait share*: the share of its time spent waiting on its peers. A ring rank
  waiting in a collective polls its peers' sockets, and that thread's time goes to
  the kernel (`backends.Spin.KERNEL`, ~60-85% system time), while computing goes to
  user space (or to the GPU). So the share is the demand for a core of the rank's
  polling threads (threads whose time went mostly to the kernel; run and run-queue
  time where the OS keeps it, else their CPU) per second of the interval: read off
  the two process samples the scan takes anyway, nothing new in the rank's hot path.
  A backend whose wait spins in user space (JACCL, MPI) cannot be told this way: its
  ranks get no wait share and no score, only their pace and the node's causes
  (docs/limits.md);
- its *pace*: collectives issued per second (the record's counter). In step, every
  rank has the job's pace; it is shown, and it gates what is counted.

Only the intervals in which the rank made progress at its usual pace are counted
(its collectives advanced by at least half its median interval's, and it was never
idle), and of those only the ones in which every rank of the job was *active*: in a
wait (an eval: computing, on the GPU too, or waiting), using a quarter of a core,
stopped, or paging its memory back in (`FAULTS_CAUSE` major faults a second). A
rank that is none of these sleeps by design: mlx_lm.server's rank 0 reads requests
(sharing "nothing" every 0.1 s) while the others wait in a collective for it; that
wait is no work held back. Across nodes (`from_ranks`) the intervals cannot
be lined up, so a rank is named only when it was active in `ACTIVE_MIN` of its own.

From the job's ranks (`judge`): a rank's *score* is the job's pace over its own, as
NVRx's relative score (1: the job's pace, lower: slower): the share of time the
others spend working (their median) over its own, at most 1. The *slowdown* is how
much faster the job would run if its slowest rank kept the others' median pace:
the others wait `excess` of each step for it, so a step would take `1 - excess` of
its time. A rank is named (`Stragglers`) only when it is clear: every rank counted
`MIN_SECONDS` of the window, the slowdown at least `NAME_SLOWDOWN` for `SUSTAIN`
seconds; it stays named until the slowdown falls under `CLEAR_SLOWDOWN`.
The slowdown *shown* of a named rank off its core (stopped, or paging its memory back
in) is measured where the job was seen healthy: its pace (the median rank's, every
interval of the window counted) in the fastest window judged healthy in the two before
the rank stood out, over the others' pace now. Where ranks share cores, the wait shares
alone over-read it: a rank off its core frees one and its peers then compute faster than
beside it (two-fold at 83% stopped here). The wait shares' figure (`estimate`) stays
what a name rests on, and the one shown otherwise; a rank off its core whose job still
runs at its healthy pace (its measured slowdown under `CLEAR_SLOWDOWN`) holds no one
back and is not named.
Never a kill: a straggler is reported, not ended.

What is shown of each rank (`Figures`) is more than what a name rests on: once 8 s
(`SHOW_SECONDS`) at its usual pace are counted, active or not, its figures and score
(a loop that sleeps between steps, a busy machine), and while it is not judged, why
(`pace_unjudged`, `pace_note`: "not judged: idle between steps 80% of the time").
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Generic, TypeVar

from watchdog import backends
from watchdog.daemon.judge.threads import KERNEL_SHARE, WORK_RATIO
from watchdog.daemon.sample import ProcessSample
from watchdog.states import ENDED, STOPPED_STATUSES, Unjudged
from watchdog.status import RankStatus, Straggler

WINDOW = 30.0  # seconds of intervals each rank's figures are taken over
MIN_SECONDS = 20.0  # counted seconds every rank of the job needs before any is judged
NAME_SLOWDOWN = 1.25  # the job would run 25% faster at the others' pace: named...
SUSTAIN = 10.0  # ...once it has held this long
CLEAR_SLOWDOWN = 1.12  # a named straggler stays named until the slowdown falls under this
MAX_WAIT = 0.95  # a share above this is read as this (a score stays finite)
TICK = 1.0  # seconds: a rank's interval closes once this long and a collective was issued
LONG_TICK = 10.0  # ...or once this long without one
POLLING_FLOOR = 0.02  # a thread using less of a core than this polls nothing
# Causes: a share of the time the rank's busiest thread waited in a run queue for a
# core (CPU contention), major page faults per second (memory pressure).
RUN_QUEUE_CAUSE = 0.15
FAULTS_CAUSE = 20.0
STOPPED_CAUSE = 0.1  # of its scans that saw it stopped (SIGSTOP, a debugger, a tracer)
ACTIVE_MIN = 0.8  # a straggler is active (working, waiting or stopped) this share of the time
FLAT_OUT = 0.85  # its computing threads ran this share of a core: flat out
SHOW_SECONDS = 8.0  # counted seconds (any tick at its usual pace) before a figure is shown

K = TypeVar("K", bound=Hashable)  # what a rank is known by: the daemon's rank key, an index


@dataclass(frozen=True)
class Tick:
    """One rank's interval between two scans."""

    at: float  # monotonic seconds at its end
    seconds: float
    wait: float  # share of the interval its polling threads ran (waiting on peers)
    collectives: int  # issued in the interval
    queue: float  # share of the interval its busiest thread waited for a core
    faults: int | None  # major page faults in the interval (None: unknown)
    stopped: bool = False  # the process was seen stopped (SIGSTOP, a debugger) at its end
    active: bool = True  # in a wait at its end, a thread at work through it, or stopped
    busy: float = 0.0  # cores its computing threads ran, at most 1 (not waited for one)
    idle: bool = False  # in hb.idle() at a scan in it: kept only to say why it is not counted


@dataclass(frozen=True)
class Pace:
    """One rank's figures over the window."""

    seconds: float  # counted
    wait_share: float
    pace: float  # collectives per second
    run_queue: float
    faults: float | None  # major faults per second
    stopped: float = 0.0  # share of its counted scans that saw it stopped
    active: float = 1.0  # share of its intervals at its usual pace in which it was active
    busy: float = 0.0  # cores its computing threads ran (at most 1), over the counted time
    wait_known: bool = True  # False: its backend polls in user space (no share, no score)


def _delta(before: Iterable[tuple[int, float]], after: Iterable[tuple[int, float]]
           ) -> dict[int, float]:
    old = dict(before)
    return {tid: v - old[tid] for tid, v in after if tid in old and v >= old[tid]}


def tick(before: ProcessSample, after: ProcessSample, seconds: float, collectives: int,
         at: float, waiting: bool = False) -> Tick:
    """The interval between two samples of one rank's process (`waiting`: in a wait, an
    eval or a collective, at its end)."""
    cpu = _delta(before.threads, after.threads)
    system = _delta(before.system, after.system)
    demand = _delta(before.demand, after.demand)
    ran = sum(cpu.values())
    if not demand and before.runnable is not None and after.runnable is not None and ran > 0:
        # macOS keeps no thread's run-queue time, only the process's (ri_runnable_time).
        # Shared out in proportion to each thread's CPU (exact when the threads that wait
        # for a core each want a whole one, as a poller and a compute thread do), it gives
        # each thread's demand as Linux's schedstat does (docs/limits.md).
        scale = 1.0 + max(0.0, after.runnable - before.runnable) / ran
        demand = {tid: used * scale for tid, used in cpu.items()}
    wait = work = 0.0
    for tid, used in cpu.items():
        if not (used / seconds >= POLLING_FLOOR and system.get(tid, 0.0) >= KERNEL_SHARE * used):
            work += used  # computing (the main thread's Python, the stream's kernels)
        else:
            # Its demand for a core, where the OS keeps it (Linux schedstat): on a busy
            # machine a polling thread gets only part of one, and its CPU alone would
            # read as less waiting (the slowdown under-estimated by half at a load of 5
            # a core). Elsewhere its CPU (macOS: docs/limits.md).
            wait += max(used, demand.get(tid, used))
    queue = max((max(0.0, wanted - cpu.get(tid, wanted)) for tid, wanted in demand.items()),
                default=0.0)
    faults = None
    if before.major_faults is not None and after.major_faults is not None:
        faults = max(0, after.major_faults - before.major_faults)
    busiest = max((demand.get(tid, used) for tid, used in cpu.items()), default=0.0)
    stopped = after.status in STOPPED_STATUSES
    # A rank reading its pages back from storage sleeps on the disk, not by design:
    # its data did not fit in memory (it is at work, as a rank that computes is).
    paging = faults is not None and faults >= FAULTS_CAUSE * seconds
    return Tick(at, seconds, min(1.0, wait / seconds), max(0, collectives),
                min(1.0, queue / seconds), faults, stopped,
                waiting or stopped or paging or busiest / seconds >= WORK_RATIO,
                min(1.0, work / seconds))


def _overlaps(t: Tick, spans: Sequence[tuple[float, float]]) -> bool:
    return any(start < t.at and t.at - t.seconds < end for start, end in spans)


def summarise(ticks: Sequence[Tick], skip: Sequence[tuple[float, float]] = (),
              strict: bool = True) -> Pace | None:
    """A rank's figures over its ticks at its usual pace, active, and overlapping none
    of the spans `skip` (when another rank of the job was not active); None if none.
    Not `strict`: every tick at its usual pace, active or not (the figures shown for a
    loop that sleeps between steps, or a busy machine; never the ones a name rests on)."""
    moving = [t for t in ticks if t.collectives > 0 and not t.idle]
    if not moving:
        return None
    usual = median(t.collectives / t.seconds for t in moving)
    usual_pace = [t for t in moving if t.collectives / t.seconds >= usual / 2]
    active = sum(t.active for t in usual_pace) / len(usual_pace)
    counted = ([t for t in usual_pace if t.active and not _overlaps(t, skip)] if strict
               else usual_pace)
    if not counted:
        return None
    seconds = sum(t.seconds for t in counted)
    known = [t.faults for t in counted if t.faults is not None]
    return Pace(
        seconds=seconds,
        wait_share=sum(t.wait * t.seconds for t in counted) / seconds,
        pace=sum(t.collectives for t in counted) / seconds,
        run_queue=sum(t.queue * t.seconds for t in counted) / seconds,
        faults=sum(known) / seconds if len(known) == len(counted) else None,
        # Of every scan not idle: a rank stopped most of the time issues few collectives
        # in most intervals, which the usual pace leaves out.
        stopped=sum(t.stopped for t in ticks if not t.idle) / sum(not t.idle for t in ticks),
        active=active,
        busy=sum(t.busy * t.seconds for t in counted) / seconds)


@dataclass(frozen=True)
class Scored(Generic[K]):
    """One rank of a job, judged against the others."""

    key: K
    pace: Pace
    score: float  # 1: the job's pace; lower: slower
    excess: float  # how much more of each step the others wait than it does
    # The job's pace before this rank held it back over its pace now (`Stragglers`),
    # when the job was seen healthy first; None: unknown.
    measured: float | None = None

    @property
    def estimate(self) -> float:
        """How much faster the job would run if this rank kept the others' median pace
        as they run now (from the wait shares alone): what a name rests on."""
        return 1.0 / (1.0 - max(0.0, min(self.excess, MAX_WAIT)))

    @property
    def slowdown(self) -> float:
        """The job's slowdown as shown: measured against its own healthy pace where it
        was seen healthy (`measured`), else the wait shares' `estimate`."""
        return self.measured if self.measured is not None else self.estimate


def judge(paces: Sequence[tuple[K, Pace]]) -> list[Scored[K]]:
    """Each rank of one job scored against the median of the others; [] for fewer
    than two ranks with figures."""
    if len(paces) < 2:
        return []
    out = []
    for i, (key, pace) in enumerate(paces):
        others = median(min(p.wait_share, MAX_WAIT) for j, (_, p) in enumerate(paces)
                        if j != i)
        own = min(pace.wait_share, MAX_WAIT)
        out.append(Scored(key, pace, min(1.0, (1.0 - others) / (1.0 - own)), others - own))
    return out


def slowest(scored: Sequence[Scored[K]], min_seconds: float = MIN_SECONDS) -> Scored[K] | None:
    """The rank the others wait for, once every rank has counted enough of the window;
    None when that rank was not active most of the time (it sleeps by design)."""
    if not scored or any(s.pace.seconds < min_seconds for s in scored):
        return None
    worst = min(scored, key=lambda s: (s.score, -s.excess))
    return worst if worst.pace.active >= ACTIVE_MIN else None


def why(pace: Pace, thermal: str | None = None) -> str:
    """What the node can tell of the reason, one line ("" when nothing stands out). With
    no sign of a sick machine and its computing threads ran flat out, it has more work
    per step than the others (uneven work, a bigger shard): the job's, not the node's."""
    parts = []
    if pace.run_queue >= RUN_QUEUE_CAUSE:
        parts.append(f"run queue {pace.run_queue:.0%} (CPU contention)")
    if pace.stopped >= STOPPED_CAUSE:
        parts.append(f"stopped {pace.stopped:.0%} of the time (a signal or a debugger)")
    if pace.faults is not None and pace.faults >= FAULTS_CAUSE:
        parts.append(f"{pace.faults:.0f} major faults/s (memory pressure)")
    if thermal:
        parts.append(thermal)
    if not parts and pace.busy >= FLAT_OUT and pace.wait_known:
        faults = "no faults" if pace.faults is not None else "faults unknown"
        parts.append(f"more work per step: its core flat out ({pace.busy:.0%}), "
                     f"no run queue, {faults}")
    return "; ".join(parts)


def summary(rank: int | None, host: str | None, excess: float, cause: str) -> str:
    """The job's line: "rank 2 on mac-3 is the straggler: the others wait 38% of each
    step for it; run queue 45% (CPU contention)"."""
    where = f" on {host}" if host else ""
    line = (f"rank {rank if rank is not None else '?'}{where} is the straggler: the others "
            f"wait {max(0.0, excess):.0%} of each step for it")
    return f"{line}; {cause}" if cause else line


def scored_ranks(ranks: Sequence[RankStatus]) -> tuple[list[RankStatus], list[Scored[int]],
                                                     Scored[int] | None]:
    """A job's live ranks as the nodes reported them, each scored against the others from
    its node's minute of figures (`Scored.key`: its index in the live ranks), and the
    slowest of them when it was active most of the time (else None); ([], [], None) when
    a rank is not judged by its node (figures shown early, a loop that sleeps, a backend
    polling in user space): no ground for a name here either. `from_ranks` (`cluster
    status`) and the daemon's judgement across nodes (`judge/across.py`) both score so."""
    live = [r for r in ranks if r.state not in ENDED]
    if len(live) < 2 or any(r.wait_share is None or r.pace_unjudged not in (None, Unjudged.ALONE)
                            for r in live):
        return [], [], None
    paces: list[tuple[int, Pace]] = [
        (i, Pace(MIN_SECONDS, r.wait_share or 0.0, r.pace or 0.0, r.run_queue or 0.0, None,
                 active=r.active_share if r.active_share is not None else 0.0))
        for i, r in enumerate(live)]
    scored = judge(paces)
    return live, scored, slowest(scored, 0.0)


def straggler_of(job: str, uid: int | None, r: RankStatus, worst: Scored[int]) -> Straggler:
    """The named rank as the contract carries it."""
    cause = r.pace_why or ""
    return Straggler(job=job, uid=uid, rank=r.rank, host=r.host, pid=r.pid,
                     score=round(worst.score, 3), slowdown=round(worst.slowdown, 3),
                     others_wait=round(worst.excess, 3), why=cause,
                     summary=summary(r.rank, r.host, worst.excess, cause))


def from_ranks(job: str, uid: int | None, ranks: Sequence[RankStatus]) -> Straggler | None:
    """The cluster's judgement (`cluster status`): a job's ranks as the nodes reported
    them, each with its minute's figures, scored together; the slowest named when it
    holds the job back by `NAME_SLOWDOWN` (each node's window already smooths it)."""
    live, _, worst = scored_ranks(ranks)
    if worst is None or worst.slowdown < NAME_SLOWDOWN:
        return None
    return straggler_of(job, uid, live[worst.key], worst)


@dataclass
class Named(Generic[K]):
    """A job's straggler, from when it was first clear (`since`) and whether named: the
    hysteresis's one piece of state (judge/stragglers.py, judge/across.py)."""

    key: K
    since: float
    named: bool = False


def named_after(held: Named[K] | None, who: K, slowdown: float, now: float,
                sustain: float) -> Named[K] | None:
    """The hysteresis of a name, one judgement on: `who` the slowest rank now, `slowdown`
    its figure, `held` the straggler as it stood (None: none). A rank stays clear (or
    named) until its figure falls under `NAME_SLOWDOWN` (or `CLEAR_SLOWDOWN`); a new one
    is clear from now once at `NAME_SLOWDOWN`, and named once clear for `sustain`
    seconds. None: no straggler, or none clear."""
    if held is not None and held.key == who:
        if slowdown < (CLEAR_SLOWDOWN if held.named else NAME_SLOWDOWN):
            return None
    elif slowdown >= NAME_SLOWDOWN:
        held = Named(who, now)
    else:
        return None
    if not held.named and now - held.since >= sustain:
        held.named = True
    return held


def window_pace(ticks: Sequence[Tick]) -> float | None:
    """A rank's collectives per second over its whole window, every interval counted: the
    job's own pace, as a clock on the wall reads it (its figures' `pace` leaves out the
    intervals under half its usual one, which a rank slowed in bursts has many of)."""
    seconds = sum(t.seconds for t in ticks)
    if seconds <= 0:
        return None
    return sum(t.collectives for t in ticks) / seconds


def measured(worst: Pace, healthy: Iterable[tuple[float, float]], others: Sequence[float],
             since: float, window: float) -> float | None:
    """The job's pace before `worst` held it back (the fastest of the `healthy` (at, pace)
    judged in the two windows before `since`, when it stood out) over the others' pace now
    (`others`: each other rank's `window_pace`), for a rank off its core (stopped, or
    asleep paging its memory back in); None for any other, or when the job was never seen
    healthy that recently. The wait shares alone say what the job would gain at the
    others' pace *as they run now*; where ranks share cores, a rank off its core frees one
    and the others then compute faster than beside it (twice as fast with a rank stopped
    83% of the time here), so that figure over-reads the job's loss two-fold
    (docs/limits.md). A rank on its core (contended, or more work per step) frees none:
    its estimate stands, and a pace measured before would also count any change of the
    machine's load since. The fastest window, as the first slow steps only drag a
    window's pace down, as a job's first steps do (its warm-up)."""
    seen = list(healthy)
    off_core = (worst.stopped >= STOPPED_CAUSE
                or (worst.faults is not None and worst.faults >= FAULTS_CAUSE))
    if not off_core or not seen or not others or median(others) <= 0:
        return None
    baseline = max((pace for at, pace in seen if at >= since - 2 * window), default=None)
    if baseline is None:
        return None  # healthy too long before: the machine may have changed since
    return max(1.0, baseline / median(others))


def why_not(backend: str | None, ticks: Sequence[Tick], scored: Scored[K] | None,
            ripe: bool, ranks: int, window: float = WINDOW, min_seconds: float = MIN_SECONDS
            ) -> tuple[Unjudged | None, str | None]:
    """Why a rank (its backend, its window's ticks, its strict figures when scored) cannot
    be judged now, as (code, words); (None, None) if it is. `ripe`: every rank of its job
    counted enough; `ranks`: how many of its job are here."""
    if backend == "single":  # a group of one (no peers): nothing to be held back by
        return (Unjudged.ALONE, "not judged: a single process, no peer to keep pace with")
    if not backends.spins_in_kernel(backend):
        return (Unjudged.USER_SPACE_WAIT, f"not judged: the {backend or 'unknown'} backend "
                "polls in user space, so no wait share (docs/limits.md)")
    total = sum(t.seconds for t in ticks)
    idle = sum(t.seconds for t in ticks if t.idle)
    if total and idle / total >= 1 - ACTIVE_MIN:
        return Unjudged.IDLE, f"not judged: idle (hb.idle) {idle / total:.0%} of the time"
    if not any(t.collectives for t in ticks if not t.idle):
        return Unjudged.NO_COLLECTIVES, f"not judged: no collective in the last {window:.0f} s"
    if total < min_seconds:  # at its start: too little seen to say it sleeps
        return (Unjudged.TOO_FEW_SECONDS, f"not judged yet: only {total:.0f} s seen of "
                f"{min_seconds:.0f} s needed")
    loose = summarise(ticks, strict=False)
    if loose is not None and loose.active < ACTIVE_MIN:
        return (Unjudged.SLEEPS, f"not judged: idle between steps {1 - loose.active:.0%} of "
                "the time")
    if scored is None or scored.pace.seconds < min_seconds:
        counted = scored.pace.seconds if scored is not None else 0.0
        return (Unjudged.TOO_FEW_SECONDS, f"not judged yet: only {counted:.0f} s counted of "
                f"{min_seconds:.0f} s needed")
    if not ripe:
        return Unjudged.PEER_UNJUDGED, "not judged yet: another rank of its job is not"
    if ranks < 2:
        return (Unjudged.ALONE, "judged in `cluster status` only: the only rank of its job "
                "on this node")
    return None, None
