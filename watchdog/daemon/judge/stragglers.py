"""The stragglers' tracker: each rank's window of intervals, fed at every scan, and each
job's straggler, named with hysteresis. The figures and words it rests on (a tick, a
rank's figures, a score, a why) are judge/pacing.py's, pure; this module keeps only the
state between scans.

A rank is named only when it is clear: every rank counted `MIN_SECONDS` of the window,
the slowdown at least `NAME_SLOWDOWN` for `SUSTAIN` seconds; it stays named until the
slowdown falls under `CLEAR_SLOWDOWN`. A rank off its core (stopped, or paging its
memory back in) is named by the larger of the wait shares' estimate and the slowdown
measured against the job's healthy pace (`pacing.measured`), and not named while the
job keeps its healthy pace. Never a kill: a straggler is reported, not ended.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Generic, TypeVar

from watchdog import backends
from watchdog.daemon.judge.pacing import (
    ACTIVE_MIN,
    CLEAR_SLOWDOWN,
    LONG_TICK,
    MIN_SECONDS,
    SHOW_SECONDS,
    SUSTAIN,
    TICK,
    WINDOW,
    K,
    Named,
    Pace,
    Scored,
    Tick,
    judge,
    measured,
    named_after,
    slowest,
    summarise,
    tick,
    why_not,
    window_pace,
)
from watchdog.daemon.sample import ProcessSample
from watchdog.record import Record
from watchdog.states import Phase, Unjudged

J = TypeVar("J", bound=Hashable)  # what a job is known by: the daemon's (uid, job)


@dataclass
class _Track:
    """One rank's state between scans."""

    last: tuple[float, ProcessSample, int]  # (monotonic s, sample, collectives)
    ticks: deque[Tick]
    backend: str | None = None  # as its record last said
    idle: bool = True  # idle at a scan since the open tick began (or never seen before)
    waiting: bool = False  # in a wait at a scan since it began
    judged: bool = False  # its job was judged since it was first seen...
    pace: Pace | None = None  # ...and these were its strict figures then


@dataclass(frozen=True)
class Figures:
    """What is shown of one rank: its figures and score once any are known (the strict
    ones a name rests on when ripe, else every tick at its usual pace), and, while it is
    not judged, why, as a code (a metric label) and in words."""

    pace: Pace | None = None
    score: float | None = None
    judged: bool = False
    unjudged: Unjudged | None = None
    note: str | None = None


class Stragglers(Generic[K, J]):
    """Each rank's window of ticks (fed every scan, by its key `K`) and each job's
    straggler (by its key `J`), with its hysteresis (named after `SUSTAIN` at
    `NAME_SLOWDOWN`, cleared under `CLEAR_SLOWDOWN`)."""

    def __init__(self, window: float = WINDOW, min_seconds: float = MIN_SECONDS,
                 sustain: float = SUSTAIN) -> None:
        self.window, self.min_seconds, self.sustain = window, min_seconds, sustain
        self.tracks: dict[K, _Track] = {}
        self.figures: dict[K, Figures] = {}  # as last judged, what is shown
        self.jobs: dict[J, Named[K]] = {}
        # Each job's pace (median of its ranks') at every judgement with no rank holding
        # it back, the last `3 * window` seconds of them: what the slowdown is measured by.
        self.healthy: dict[J, deque[tuple[float, float]]] = {}

    def observe(self, key: K, record: Record, sample: ProcessSample, now: float) -> None:
        """One scan's look at a live rank. A tick closes once it lasts `TICK` seconds and
        the rank issued a collective in it (a scan interval may be shorter than a step),
        or after `LONG_TICK` seconds without one (a tick that counts for nothing)."""
        track = self.tracks.get(key)
        if track is None:
            self.tracks[key] = _Track((now, sample, record.collectives), deque(),
                                      record.backend, idle=record.phase is Phase.IDLE)
            return
        track.backend = record.backend
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

    def forget(self, key: K) -> None:
        """A rank gone: its window and its shown figures."""
        self.tracks.pop(key, None)
        self.figures.pop(key, None)

    def forget_jobs(self, live: Iterable[J]) -> None:
        """Every job not in `live`: its straggler and its healthy paces."""
        keep = set(live)
        for job in [j for j in self.jobs if j not in keep]:
            del self.jobs[job]
        for job in [j for j in self.healthy if j not in keep]:
            del self.healthy[job]

    def pace(self, key: K) -> Pace | None:
        """The rank's figures as its job was last judged (with its other ranks here)."""
        track = self.tracks.get(key)
        if track is None:
            return None
        if track.judged:
            return track.pace
        if not backends.spins_in_kernel(track.backend):
            return None  # no wait share: never scored (its shown figures: `figures`)
        return summarise(track.ticks)

    def judge_job(self, job: J, keys: Sequence[K], now: float
                  ) -> tuple[list[Scored[K]], Scored[K] | None]:
        """The job's ranks scored, and its straggler when named (with hysteresis). The
        ranks are scanned together: an interval in which one of them was not active
        (it sleeps by design) is left out for every one."""
        tracks = [self.tracks[k] for k in keys if k in self.tracks]
        skip = [(t.at - t.seconds, t.at) for track in tracks for t in track.ticks
                if not t.active]
        for track in tracks:
            # Never scored without a wait share: a user-space poller's CPU reads as work.
            waits = backends.spins_in_kernel(track.backend)
            track.judged, track.pace = True, summarise(track.ticks, skip) if waits else None
        paces = [(k, p) for k in keys if (p := self.pace(k)) is not None]
        scored = judge(paces)
        worst = slowest(scored, self.min_seconds) if len(paces) == len(keys) else None
        self._show(keys, scored)
        self._note_healthy(job, scored, worst, len(keys), now)
        held = self.jobs.get(job)
        if worst is None:
            self.jobs.pop(job, None)
            return scored, None
        mine = held is not None and held.key == worst.key
        slowed = self._measured(job, worst, scored,
                                held.since if held is not None and mine else now)
        # A rank off its core is named by the larger of the two figures: the wait
        # shares under-read a rank paging its memory back in (it waits too, asleep on
        # the disk), the job's measured pace does not.
        held = named_after(held, worst.key, max(worst.estimate, slowed or 0.0), now,
                           self.sustain)
        if held is None:
            self.jobs.pop(job, None)
            return scored, None
        self.jobs[job] = held
        if not held.named:
            return scored, None
        slowed = self._measured(job, worst, scored, held.since)
        if slowed is not None and slowed < CLEAR_SLOWDOWN:
            # Off its core, yet the job keeps its healthy pace: its peers got the core it
            # left, and it holds no one back (seen at a load of 10-20 on 2 cores).
            return scored, None
        return scored, dataclasses.replace(worst, measured=slowed)

    def _window_pace(self, key: K) -> float | None:
        track = self.tracks.get(key)
        return window_pace(track.ticks) if track is not None else None

    def _note_healthy(self, job: J, scored: Sequence[Scored[K]], worst: Scored[K] | None,
                      ranks: int, now: float) -> None:
        """The job's pace, kept while every rank is judged and none holds it back."""
        if (len(scored) < 2 or len(scored) != ranks
                or any(s.pace.seconds < self.min_seconds for s in scored)
                or (worst is not None and worst.estimate >= CLEAR_SLOWDOWN)):
            return
        paces = [p for s in scored if (p := self._window_pace(s.key)) is not None]
        if not paces:
            return
        seen = self.healthy.setdefault(job, deque())
        seen.append((now, median(paces)))
        while seen and seen[0][0] < now - 3 * self.window:
            seen.popleft()

    def _measured(self, job: J, worst: Scored[K], scored: Sequence[Scored[K]],
                  since: float) -> float | None:
        """`pacing.measured` of the job's straggler, from its healthy paces kept here."""
        others = [p for s in scored
                  if s.key != worst.key and (p := self._window_pace(s.key)) is not None]
        return measured(worst.pace, self.healthy.get(job, ()), others, since, self.window)

    def _show(self, keys: Sequence[K], scored: Sequence[Scored[K]]) -> None:
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
        if len(keys) == 1 and (alone := self.pace(keys[0])) is not None:
            # The only rank of its job here: its strict figures, once ripe, are what the
            # cluster view scores it by against its peers' (from_ranks).
            ripe = alone.seconds >= self.min_seconds and alone.active >= ACTIVE_MIN
            strict = {keys[0]: Scored(keys[0], alone, 1.0, 0.0)}
        for k in keys:
            track = self.tracks.get(k)
            ticks: Sequence[Tick] = track.ticks if track is not None else ()
            unjudged, note = why_not(track.backend if track is not None else None, ticks,
                                     strict.get(k), ripe, len(keys), self.window,
                                     self.min_seconds)
            if unjudged is Unjudged.USER_SPACE_WAIT:
                polled = summarise(ticks, strict=False) if track is not None else None
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
