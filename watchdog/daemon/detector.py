"""Pure judgement: from what a rank's record and process show, its state.

No file, clock or process is touched here: the caller passes the record, the
process sample and the monotonic time, and gets a `Verdict`. The per-rank
memory a verdict needs (the previous CPU sample, how busy the wait has been,
how many ticks in a row it has been due) lives in a `Track` the `Detector`
keeps by rank identity.

Only a wait that does not return is judged. A rank outside a wait, or inside
`hb.idle()`, is never a hang, however long it takes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from watchdog.daemon.probes import STOPPED_STATUSES, ProcessSample
from watchdog.record import Record
from watchdog.states import Phase, State

NS = 1_000_000_000
BUSY_WINDOW = 32


@dataclass(frozen=True)
class Rules:
    """The detector's settings (see docs/configuration.md for the defaults' reasons)."""

    deadline: float | None = None  # seconds; None: learned ("auto")
    auto_factor: float = 4.0  # auto deadline = factor x longest completed wait...
    auto_floor: float = 60.0  # ...but never under the floor...
    auto_min_waits: int = 20  # ...and only after this many completed waits,
    auto_fallback: float = 600.0  # before which this deadline applies
    init_deadline: float = 600.0  # for mx.distributed.init (connecting to peers)
    blocked_deadline: float = 900.0  # a wait at ~0% CPU is acted on only after this
    spin_ratio: float = 0.5  # a thread using this share of a core or more is spinning
    confirm: int = 2  # ticks in a row a rank must be due before it is acted on


@dataclass
class Track:
    """What the detector remembers about one rank between ticks."""

    cpu: dict[int, float] = field(default_factory=dict)
    cpu_at_ns: int | None = None
    wait_key: tuple[int, int] = (0, 0)  # (wait started, waits completed): one wait
    # Busiest-thread ratios, scaled by load, over the latest ticks of this wait (bounded: a wait
    # can last days under observe mode or a stopped peer).
    busy: deque[float] = field(default_factory=lambda: deque(maxlen=BUSY_WINDOW))
    due_ticks: int = 0
    busiest: float = 0.0


@dataclass(frozen=True)
class Verdict:
    state: State
    deadline: float  # seconds the current (or next) wait may last
    seconds_in_wait: float  # 0 outside a wait
    seconds_since_progress: float
    busiest_cpu: float  # busiest thread's share of a core over the last interval
    act: bool  # due long enough: escalate now
    reason: str


def busiest_ratio(before: dict[int, float], after: dict[int, float], seconds: float) -> float:
    """The largest share of one core any single thread used between two samples.

    Thread ids that come and go (on macOS they are list positions) are skipped:
    only ids present in both samples are compared.
    """
    if seconds <= 0:
        return 0.0
    best = 0.0
    for tid, cpu in after.items():
        prior = before.get(tid)
        if prior is not None and cpu >= prior:
            best = max(best, (cpu - prior) / seconds)
    return min(best, 1.0)


def deadline_for(record: Record, rules: Rules) -> float:
    """The deadline of the rank's current wait: init, expect, fixed, or learned."""
    if record.phase == Phase.INIT:
        return rules.init_deadline
    if record.expect_seconds > 0:
        return record.expect_seconds
    if rules.deadline is not None:
        return rules.deadline
    if record.waits_completed < rules.auto_min_waits:
        return rules.auto_fallback
    return max(rules.auto_floor, rules.auto_factor * record.max_wait_ns / NS)


def _median(values: deque[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


class Detector:
    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.tracks: dict[tuple[int, float], Track] = {}

    def forget(self, key: tuple[int, float]) -> None:
        self.tracks.pop(key, None)

    def observe(self, record: Record, sample: ProcessSample, now_ns: int,
                load: float = 1.0) -> Verdict:
        """One tick for one live rank whose identity the caller has checked.

        `load` is the machine's runnable load per core (at least 1) over
        this tick: on an oversubscribed machine a spinning thread gets only
        1/load of a core, so what it got is scaled up by it.
        """
        rules = self.rules
        track = self.tracks.setdefault((record.pid, record.start_time), Track())
        cpu = dict(sample.threads)
        measured = track.cpu_at_ns is not None  # the first sample has no interval to measure
        if track.cpu_at_ns is not None:
            track.busiest = busiest_ratio(track.cpu, cpu, (now_ns - track.cpu_at_ns) / NS)
        track.cpu, track.cpu_at_ns = cpu, now_ns

        deadline = deadline_for(record, rules)
        since_progress = max(0.0, (now_ns - record.last_progress_ns) / NS)
        waiting = record.phase in (Phase.WAIT, Phase.INIT) and record.wait_since_ns > 0
        in_wait = max(0.0, (now_ns - record.wait_since_ns) / NS) if waiting else 0.0

        def verdict(state: State, reason: str, act: bool = False) -> Verdict:
            return Verdict(state, deadline, in_wait, since_progress, track.busiest, act, reason)

        wait_key = (record.wait_since_ns, record.waits_completed) if waiting else (0, 0)
        if wait_key != track.wait_key:  # a new wait, or none: nothing carried over
            track.wait_key, track.due_ticks = wait_key, 0
            track.busy.clear()
        if waiting and measured and cpu:
            # Scaled by this tick's load: on an oversubscribed machine a
            # spinning thread gets only 1/load of a core.
            track.busy.append(min(1.0, track.busiest * max(1.0, load)))

        if sample.status in STOPPED_STATUSES:
            track.due_ticks = 0
            return verdict(State.STOPPED, f"process is {sample.status}")
        if record.phase == Phase.IDLE:
            return verdict(State.IDLE, "inside hb.idle()")
        if not waiting:
            return verdict(State.RUNNING, "outside a wait")
        if in_wait < deadline / 2:
            return verdict(State.RUNNING, "waits return within the deadline")
        what = f"in {record.op or 'a wait'} for {in_wait:.1f}s"
        if in_wait < deadline:
            return verdict(State.SUSPECT, f"{what}, past half the {deadline:g}s deadline")

        # Past the deadline. A spinning thread over most of the wait means the
        # seeds' hang (a survivor polling a dead or frozen peer); a quiet one may
        # be a wedged GPU or broken group, given a longer deadline of its own.
        spinning = len(track.busy) >= 2 and _median(track.busy) >= rules.spin_ratio
        if spinning:
            state, due = State.STALLED, True
            reason = f"{what}, past the {deadline:g}s deadline, one thread spinning"
        else:
            state = State.BLOCKED
            due = in_wait >= max(deadline, rules.blocked_deadline)
            reason = f"{what}, past the {deadline:g}s deadline, nothing spinning"
        track.due_ticks = track.due_ticks + 1 if due else 0
        return verdict(state, reason, act=track.due_ticks >= rules.confirm)
