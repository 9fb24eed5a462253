"""Pure: the rank that holds a healthy job back, by how much, and why.

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

import dataclasses
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median

from watchdog import backends
from watchdog.daemon.judge.threads import KERNEL_SHARE, WORK_RATIO
from watchdog.daemon.sample import ProcessSample
from watchdog.record import Record
from watchdog.states import ENDED, STOPPED_STATUSES, Phase
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
class Scored:
    """One rank of a job, judged against the others."""

    key: object
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


def judge(paces: Sequence[tuple[object, Pace]]) -> list[Scored]:
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


def slowest(scored: Sequence[Scored], min_seconds: float = MIN_SECONDS) -> Scored | None:
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


def scored_ranks(ranks: Sequence[RankStatus]) -> tuple[list[RankStatus], list[Scored],
                                                     Scored | None]:
    """A job's live ranks as the nodes reported them, each scored against the others from
    its node's minute of figures (`Scored.key`: its index in the live ranks), and the
    slowest of them when it was active most of the time (else None); ([], [], None) when
    a rank is not judged by its node (figures shown early, a loop that sleeps, a backend
    polling in user space): no ground for a name here either. `from_ranks` (`cluster
    status`) and the daemon's judgement across nodes (`judge/across.py`) both score so."""
    live = [r for r in ranks if r.state not in ENDED]
    if len(live) < 2 or any(r.wait_share is None or r.pace_unjudged not in (None, "alone")
                            for r in live):
        return [], [], None
    paces: list[tuple[object, Pace]] = [
        (i, Pace(MIN_SECONDS, r.wait_share or 0.0, r.pace or 0.0, r.run_queue or 0.0, None,
                 active=r.active_share if r.active_share is not None else 0.0))
        for i, r in enumerate(live)]
    scored = judge(paces)
    return live, scored, slowest(scored, 0.0)


def straggler_of(job: str, uid: int | None, r: RankStatus, worst: Scored) -> Straggler:
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
    assert isinstance(worst.key, int)
    return straggler_of(job, uid, live[worst.key], worst)


# -- the daemon's state: each rank's window, each job's named straggler -------------------


@dataclass
class _Track:
    last: tuple[float, ProcessSample, int]  # (monotonic s, sample, collectives)
    ticks: deque[Tick]
    idle: bool = True  # idle at a scan since the open tick began (or never seen before)
    waiting: bool = False  # in a wait at a scan since it began


@dataclass(frozen=True)
class Figures:
    """What is shown of one rank: its figures and score once any are known (the strict
    ones a name rests on when ripe, else every tick at its usual pace), and, while it is
    not judged, why, as a code (a metric label) and in words."""

    pace: Pace | None = None
    score: float | None = None
    judged: bool = False
    unjudged: str | None = None  # "user_space_wait", "no_collectives", "idle", ...
    note: str | None = None


@dataclass
class Named:
    """A job's straggler, from when it was first clear (`since`) and whether named."""

    key: object
    since: float
    named: bool = False


class Stragglers:
    """Each rank's window of ticks (fed every scan) and each job's straggler, with its
    hysteresis (named after `SUSTAIN` at `NAME_SLOWDOWN`, cleared under
    `CLEAR_SLOWDOWN`)."""

    def __init__(self, window: float = WINDOW, min_seconds: float = MIN_SECONDS,
                 sustain: float = SUSTAIN) -> None:
        self.window, self.min_seconds, self.sustain = window, min_seconds, sustain
        self.tracks: dict[object, _Track] = {}
        self.jobs: dict[object, Named] = {}
        self.paces: dict[object, Pace | None] = {}  # as last judged with the job's ranks
        self.backends: dict[object, str] = {}
        self.figures: dict[object, Figures] = {}  # as last judged, what is shown
        # Each job's pace (median of its ranks') at every judgement with no rank holding
        # it back, the last `3 * window` seconds of them: what the slowdown is measured by.
        self.healthy: dict[object, deque[tuple[float, float]]] = {}

    def observe(self, key: object, record: Record, sample: ProcessSample, now: float) -> None:
        """One scan's look at a live rank. A tick closes once it lasts `TICK` seconds and
        the rank issued a collective in it (a scan interval may be shorter than a step),
        or after `LONG_TICK` seconds without one (a tick that counts for nothing)."""
        track = self.tracks.get(key)
        self.backends[key] = record.backend
        if track is None:
            self.tracks[key] = _Track((now, sample, record.collectives), deque(),
                                      idle=record.phase is Phase.IDLE)
            return
        track.idle = track.idle or record.phase is Phase.IDLE
        track.waiting = track.waiting or record.phase in (Phase.WAIT, Phase.INIT)
        at, before, collectives = track.last
        seconds = now - at
        if seconds < TICK or (record.collectives == collectives and seconds < LONG_TICK):
            return
        # Every backend's intervals are kept: a rank whose wait polls in user space has
        # no wait share and is never scored, but its pace and the node's causes (run
        # queue, stopped, major faults) are shown all the same.
        done = tick(before, sample, seconds, record.collectives - collectives, now,
                    track.waiting)
        # An idle interval is kept only to say why the rank is not counted.
        track.ticks.append(dataclasses.replace(done, idle=True) if track.idle else done)
        track.last = (now, sample, record.collectives)
        track.idle, track.waiting = record.phase is Phase.IDLE, False
        while track.ticks and track.ticks[0].at <= now - self.window:
            track.ticks.popleft()

    def forget(self, key: object) -> None:
        self.tracks.pop(key, None)
        self.paces.pop(key, None)
        self.backends.pop(key, None)
        self.figures.pop(key, None)

    def pace(self, key: object) -> Pace | None:
        """The rank's figures as its job was last judged (with its other ranks here)."""
        if key in self.paces:
            return self.paces[key]
        track = self.tracks.get(key)
        if track is None or not backends.spins_in_kernel(self.backends.get(key)):
            return None  # no wait share: never scored (its shown figures: `figures`)
        return summarise(track.ticks)

    def judge_job(self, job: object, keys: Sequence[object], now: float
                  ) -> tuple[list[Scored], Scored | None]:
        """The job's ranks scored, and its straggler when named (with hysteresis). The
        ranks are scanned together: an interval in which one of them was not active
        (it sleeps by design) is left out for every one."""
        tracks = [self.tracks[k] for k in keys if k in self.tracks]
        skip = [(t.at - t.seconds, t.at) for track in tracks for t in track.ticks
                if not t.active]
        for k in keys:
            track = self.tracks.get(k)
            # Never scored without a wait share: a user-space poller's CPU reads as work.
            waits = backends.spins_in_kernel(self.backends.get(k))
            self.paces[k] = (summarise(track.ticks, skip) if track is not None and waits
                             else None)
        paces = [(k, p) for k in keys if (p := self.paces[k]) is not None]
        scored = judge(paces)
        worst = slowest(scored, self.min_seconds) if len(paces) == len(keys) else None
        self._show(keys, scored)
        self._note_healthy(job, scored, worst, len(keys), now)
        held = self.jobs.get(job)
        if worst is None:
            self.jobs.pop(job, None)
            return scored, None
        mine = held is not None and held.key == worst.key
        measured = self._measured(job, worst, scored,
                                  held.since if held is not None and mine else now)
        # A rank off its core is named by the larger of the two figures: the wait
        # shares under-read a rank paging its memory back in (it waits too, asleep on
        # the disk), the job's measured pace does not.
        figure = max(worst.estimate, measured or 0.0)
        if held is not None and mine:
            if held.named and figure < CLEAR_SLOWDOWN:
                self.jobs.pop(job, None)
                return scored, None
            if not held.named and figure < NAME_SLOWDOWN:
                self.jobs.pop(job, None)
                return scored, None
        elif figure >= NAME_SLOWDOWN:
            held = self.jobs[job] = Named(worst.key, now)
        else:
            self.jobs.pop(job, None)
            return scored, None
        if not held.named and now - held.since >= self.sustain:
            held.named = True
        if not held.named:
            return scored, None
        measured = self._measured(job, worst, scored, held.since)
        if measured is not None and measured < CLEAR_SLOWDOWN:
            # Off its core, yet the job keeps its healthy pace: its peers got the core it
            # left, and it holds no one back (seen at a load of 10-20 on 2 cores).
            return scored, None
        return scored, dataclasses.replace(worst, measured=measured)

    def _pace_of_window(self, key: object) -> float | None:
        """The rank's collectives per second over its whole window, every interval
        counted: the job's own pace, as a clock on the wall reads it (its figures'
        `pace` leaves out the intervals under half its usual one, which a rank slowed
        in bursts has many of)."""
        track = self.tracks.get(key)
        seconds = sum(t.seconds for t in track.ticks) if track is not None else 0.0
        if track is None or seconds <= 0:
            return None
        return sum(t.collectives for t in track.ticks) / seconds

    def _note_healthy(self, job: object, scored: Sequence[Scored], worst: Scored | None,
                      ranks: int, now: float) -> None:
        """The job's pace, kept while every rank is judged and none holds it back."""
        if (len(scored) < 2 or len(scored) != ranks
                or any(s.pace.seconds < self.min_seconds for s in scored)
                or (worst is not None and worst.estimate >= CLEAR_SLOWDOWN)):
            return
        paces = [p for s in scored if (p := self._pace_of_window(s.key)) is not None]
        if not paces:
            return
        seen = self.healthy.setdefault(job, deque())
        seen.append((now, median(paces)))
        while seen and seen[0][0] < now - 3 * self.window:
            seen.popleft()

    def _measured(self, job: object, worst: Scored, scored: Sequence[Scored],
                  since: float) -> float | None:
        """The job's pace before `worst` held it back over the others' pace now, for a
        rank off its core (stopped, or asleep paging its memory back in); None for
        any other, or when the job was never seen healthy. The wait shares alone say
        what the job would gain at the others' pace *as they run now*; where ranks
        share cores, a rank off its core frees one and the others then compute faster
        than beside it (twice as fast with a rank stopped 83% of the time here), so
        that figure over-reads the job's loss two-fold (docs/limits.md). A rank on
        its core (contended, or more work per step) frees none: its estimate stands,
        and a pace measured before would also count any change of the machine's load
        since. The pace kept is the fastest of the windows judged healthy in the two
        before the rank stood out: the first slow steps only drag a window's pace
        down, as a job's first steps do (its warm-up); None when none is that recent."""
        seen = self.healthy.get(job)
        others = [p for s in scored
                  if s.key != worst.key and (p := self._pace_of_window(s.key)) is not None]
        faults = worst.pace.faults
        off_core = (worst.pace.stopped >= STOPPED_CAUSE
                    or (faults is not None and faults >= FAULTS_CAUSE))
        if not off_core or not seen or not others or median(others) <= 0:
            return None
        baseline = max((pace for at, pace in seen if at >= since - 2 * self.window),
                       default=None)
        if baseline is None:
            return None  # healthy too long before: the machine may have changed since
        return max(1.0, baseline / median(others))

    def _show(self, keys: Sequence[object], scored: Sequence[Scored]) -> None:
        """Each rank's shown figures: the strict ones once every rank of the job has
        counted `min_seconds` (what a name rests on), else every tick at its usual pace
        once `SHOW_SECONDS` are (a busy machine, a loop that sleeps between steps); and
        while it is not judged, why in words."""
        ripe = bool(scored) and len(scored) == len(keys) and all(
            s.pace.seconds >= self.min_seconds for s in scored)
        strict = {s.key: s for s in scored}
        loose = {k: p for k in keys if (track := self.tracks.get(k)) is not None
                 and (p := summarise(track.ticks, strict=False)) is not None
                 and p.seconds >= SHOW_SECONDS}
        loose_scores = ({s.key: s.score for s in judge(list(loose.items()))}
                        if len(loose) == len(keys) else {})
        if len(keys) == 1 and (alone := self.paces.get(keys[0])) is not None:
            # The only rank of its job here: its strict figures, once ripe, are what the
            # cluster view scores it by against its peers' (from_ranks).
            ripe = alone.seconds >= self.min_seconds and alone.active >= ACTIVE_MIN
            strict = {keys[0]: Scored(keys[0], alone, 1.0, 0.0)}
        for k in keys:
            unjudged, note = self._why_not(k, ripe, strict.get(k), keys)
            if unjudged == "user_space_wait":
                track = self.tracks.get(k)
                polled = summarise(track.ticks, strict=False) if track is not None else None
                shown = (dataclasses.replace(polled, wait_share=0.0, wait_known=False)
                         if polled is not None and polled.seconds >= SHOW_SECONDS else None)
                self.figures[k] = Figures(shown, None, False, unjudged, note)
                continue
            if ripe and k in strict:
                pace: Pace | None = strict[k].pace
                score: float | None = strict[k].score if len(keys) > 1 else None
            else:
                pace, score = loose.get(k), loose_scores.get(k)
            self.figures[k] = Figures(pace, score, unjudged is None, unjudged, note)

    def _why_not(self, key: object, ripe: bool, scored: Scored | None,
                 keys: Sequence[object]) -> tuple[str | None, str | None]:
        """Why this rank cannot be judged now, as (code, words); (None, None) if it is."""
        backend = self.backends.get(key)
        if backend == "single":  # a group of one (no peers): nothing to be held back by
            return ("alone", "not judged: a single process, no peer to keep pace with")
        if not backends.spins_in_kernel(backend):
            return ("user_space_wait", f"not judged: the {backend or 'unknown'} backend polls "
                    "in user space, so no wait share (docs/limits.md)")
        track = self.tracks.get(key)
        ticks = list(track.ticks) if track is not None else []
        total = sum(t.seconds for t in ticks)
        idle = sum(t.seconds for t in ticks if t.idle)
        if total and idle / total >= 1 - ACTIVE_MIN:
            return "idle", f"not judged: idle (hb.idle) {idle / total:.0%} of the time"
        if not any(t.collectives for t in ticks if not t.idle):
            return "no_collectives", f"not judged: no collective in the last {self.window:.0f} s"
        if total < self.min_seconds:  # at its start: too little seen to say it sleeps
            return ("too_few_seconds", f"not judged yet: only {total:.0f} s seen of "
                    f"{self.min_seconds:.0f} s needed")
        loose = summarise(ticks, strict=False)
        if loose is not None and loose.active < ACTIVE_MIN:
            return ("sleeps", f"not judged: idle between steps {1 - loose.active:.0%} of "
                    "the time")
        if scored is None or scored.pace.seconds < self.min_seconds:
            counted = scored.pace.seconds if scored is not None else 0.0
            return ("too_few_seconds", f"not judged yet: only {counted:.0f} s counted of "
                    f"{self.min_seconds:.0f} s needed")
        if not ripe:
            return "peer_unjudged", "not judged yet: another rank of its job is not"
        if len(keys) < 2:
            return ("alone", "judged in `cluster status` only: the only rank of its job "
                    "on this node")
        return None, None

    def forget_jobs(self, live: Iterable[object]) -> None:
        keep = set(live)
        for job in [j for j in self.jobs if j not in keep]:
            del self.jobs[job]
        for job in [j for j in self.healthy if j not in keep]:
            del self.healthy[job]
