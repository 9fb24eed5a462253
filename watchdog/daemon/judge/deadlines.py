"""Pure: the deadline of a rank's current wait, and the settings it comes from.

Fixed, an `hb.expect()` window, `mx.distributed.init`'s own, or learned per kind
of wait and per job (`auto`: docs/configuration.md, "The auto deadline"). The
learning is one object, `AutoDeadline`: the per-kind pace each job (and its workload)
has shown, the deadlines that follow under the rules' floors and factor, and its update
from the waits a rank completes; the detector holds one and calls it at each scan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from watchdog.record import Record
from watchdog.record.layout import OPS
from watchdog.states import Phase


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
    wedge_floor: float = 15.0  # a wedged collective's deadline is never under this
    # ...nor under this when every rank's stillness was read from byte counters
    wedge_floor_exact: float = 4.0
    gpu_spin_watts: float = 5.0  # macOS: a resident GPU under this spins on nothing


@dataclass
class Learned:
    """What a job has shown of one kind of wait: the longest seen, and how many."""

    longest: float = 0.0  # seconds
    count: int = 0  # waits of this kind completed (v2 records: a scan saw in progress)

    def add(self, seconds: float) -> None:
        """One more completed wait of this kind, `seconds` long."""
        self.longest = max(self.longest, seconds)
        self.count += 1


NATIVE_KIND = "native"  # the backstop's spells outside a known wait
# Entry points that wait for the same thing learn together: `async_eval` and
# `synchronize` wait, as `eval` does, for the graph to be evaluated (mlx-lm's
# generation alternates async_eval and eval; its evals alone are too rare to
# learn from). A conversion (`item`, `print(a)`, ...) stays its own kind: a tiny
# `.item()` says nothing about the pace of a big eval.
KIND_OF = {"async_eval": "eval", "synchronize": "eval"}
# An op code this daemon has no name for (a newer hook, or any user's forgery):
# all such codes are one kind, so a record cannot mint kinds without end.
OTHER_KIND = "other"


def kind_of(op: str) -> str:
    """The kind of wait an op name (as the record reader gives it) is learned under."""
    if op in OPS:
        return KIND_OF.get(op, op or "wait")
    return OTHER_KIND


def deadline_for(record: Record, rules: Rules, learned: Learned | None = None) -> float:
    """The deadline of the rank's current wait: init, expect, fixed, or learned.

    `learned` is what the rank's job has shown of this kind of wait (see
    docs/configuration.md, "The auto deadline"): until `auto_min_waits` waits
    of that kind were seen, the fallback applies.
    """
    if record.phase == Phase.INIT:
        return rules.init_deadline
    if record.expect_seconds > 0:
        return record.expect_seconds
    if rules.deadline is not None:
        return rules.deadline
    if learned is None or learned.count < rules.auto_min_waits:
        return rules.auto_fallback
    return max(rules.auto_floor, rules.auto_factor * learned.longest)


def wedge_deadline(rules: Rules, learned: Learned | None, exact: bool = False) -> float:
    """The deadline of a wait in a collective found wedged (judge/wedge.py): the learned
    one without its floor, max(wedge_floor, factor x the longest completed wait of
    that kind); the floor alone before any wait of that kind completed. `exact`: every
    rank's stillness was read from byte counters, and `wedge_floor_exact` is the floor."""
    longest = learned.longest if learned is not None else 0.0
    floor = min(rules.wedge_floor, rules.wedge_floor_exact) if exact else rules.wedge_floor
    return max(floor, rules.auto_factor * longest)


def job_key(record: Record) -> str:
    """Where a job's learning is kept: its owner's uid and its job id."""
    return f"{record.uid}:{record.job}"


def workload_key(record: Record) -> str | None:
    """Where a job's learning is kept for its workload too (its owner's, its program's
    digest and its size): a relaunch under a new job id (exo recreates an instance
    with new ports) starts from it, not from the fallback. None for a record that
    names no workload (an older hook)."""
    if not record.workload:
        return None
    return f"{record.uid}:w:{record.workload}:{record.world_size}"


def learning_keys(record: Record) -> list[str]:
    """Every key a completed wait of this rank teaches: its job's, then its workload's."""
    key = workload_key(record)
    return [job_key(record)] + ([key] if key is not None else [])


NS = 1_000_000_000


@dataclass
class RankWaits:
    """What the auto deadline remembers of one rank between scans (the detector keeps
    one per rank, in its `Track`)."""

    # The wait a scan last saw in progress: (kind, when it began (ns), waits completed
    # when it began, seconds it had lasted then), or None; learned from when it ends (a
    # record without a pace table: v1, v2).
    seen: tuple[str, int, int, float] | None = None
    # Per kind, the rank's pace table as last learned from: (waits, longest ns).
    paced: dict[str, tuple[int, int]] = field(default_factory=dict)
    stopped: bool = False  # the previous scan found the process stopped


@dataclass(frozen=True)
class WaitDeadline:
    """What the deadlines say of a rank's current wait (or, outside one, of its spell
    without progress)."""

    deadline: float  # seconds it may last (deadline_for)
    # Its deadline were its collective found wedged (wedge_deadline, never over
    # `deadline`); 0: no such deadline (outside a collective's wait, or in an
    # hb.expect() window).
    wedge: float = 0.0
    # The first wait of its kind, on the learned deadline's fallback (nothing learned
    # yet: a cold prefill, a first step compiling, a load after a relaunch).
    cold: bool = False


class AutoDeadline:
    """The auto deadline's learning: per job ("<uid>:<job>": a job is its owner's) and
    per workload (`learning_keys`), each kind of wait's pace (`Learned`), shared by the
    job's ranks and kept by the daemon across restarts (store/learning.py); the
    deadlines that follow from it (`deadline`); and its update from each rank's
    completed waits at each scan (`learn`)."""

    def __init__(self, rules: Callable[[], Rules],
                 learned: dict[str, dict[str, Learned]] | None = None) -> None:
        """`rules`: where to read the settings at each use (a reload reaches the next
        judgement); `learned`: what was kept (the state dir's file), or nothing yet."""
        self._rules = rules
        self.learned: dict[str, dict[str, Learned]] = learned if learned is not None else {}
        self.changed: set[str] = set()  # keys whose learning moved since the keeper looked

    def known(self, record: Record, kind: str) -> Learned | None:
        """What the job has shown of this kind of wait, or, until it has shown enough,
        what its workload showed in earlier jobs (a relaunch under a new id). A call
        outside any known wait (the backstop) is some wait nobody listed: every kind
        together."""
        found: Learned | None = None
        for key in learning_keys(record):
            job = self.learned.get(key, {})
            if kind != NATIVE_KIND:
                known = job.get(kind)
            elif job:
                known = Learned(max(k.longest for k in job.values()),
                                sum(k.count for k in job.values()))
            else:
                known = None
            if known is not None and known.count >= self._rules().auto_min_waits:
                return known
            found = found or known
        return found

    def deadline(self, record: Record, waiting: bool, exact: bool = False) -> WaitDeadline:
        """The deadlines of the rank's current wait (`waiting`), or of its spell outside
        one (the backstop's, every kind together). `exact`: its job's wedge read every
        rank's stillness from byte counters (wedge_deadline)."""
        rules = self._rules()
        known = self.known(record, kind_of(record.op) if waiting else NATIVE_KIND)
        deadline = deadline_for(record, rules, known)
        collective = waiting and record.phase == Phase.WAIT and record.expect_seconds == 0
        cold = (collective and rules.deadline is None
                and (known is None or known.count < rules.auto_min_waits))
        wedge = min(deadline, wedge_deadline(rules, known, exact)) if collective else 0.0
        return WaitDeadline(deadline, wedge, cold)

    def learn(self, record: Record, rank: RankWaits, waiting: bool, stopped: bool,
              learn: bool, in_wait: float, spanned: float = float("inf")) -> None:
        """One scan of one rank: learn from the waits it completed since the last scan,
        then note the wait it is in. `waiting`: it is in a wait, `in_wait` seconds long;
        `stopped`: its process is stopped (or traced) now; `learn` False: it is under a
        response (a wait it ends now lasted as long as the hang: it counts, and never
        stretches the deadline); `spanned`: a wait at least this long began before a
        person's tracer let go of a rank of its job, and says nothing of its pace."""
        if record.pace is not None:
            self._from_pace(record, rank, stopped or rank.stopped or not learn, spanned)
        elif learn:
            self._from_seen(record, rank, waiting, spanned)
        else:
            rank.seen = None
        rank.stopped = stopped
        # Waits of init, idle or an expect() window are not the job's pace.
        if (waiting and record.pace is None and record.phase == Phase.WAIT
                and record.expect_seconds == 0 and not stopped and learn):
            rank.seen = (kind_of(record.op), record.wait_since_ns, record.waits_completed,
                         in_wait)

    def _from_seen(self, record: Record, rank: RankWaits, waiting: bool,
                   spanned: float) -> None:
        """When a wait a scan saw in progress has ended, learn how long it took."""
        if rank.seen is None:
            return
        kind, began, completed, lasted = rank.seen
        if waiting and (record.wait_since_ns, record.waits_completed) == (began, completed):
            return  # still the same wait
        if record.waits_completed == completed + 1 and record.last_wait_ns > 0:
            lasted = max(lasted, record.last_wait_ns / NS)  # exactly that wait
        rank.seen = None
        if record.waits_completed > completed and lasted < spanned:
            # It returned: a legitimate duration, unless it spanned a person's trace of a
            # rank of its job (began before the detach, `spanned` seconds ago).
            for key in learning_keys(record):
                self.learned.setdefault(key, {}).setdefault(kind, Learned()).add(lasted)
                self.changed.add(key)

    def _from_pace(self, record: Record, rank: RankWaits, paused: bool,
                   spanned: float) -> None:
        """Learn from every wait the rank completed since the last scan (record v3):
        its pace table's new waits count for the job, and a longer longest raises
        the job's. Not the longest when `paused` (a rank stopped at this scan or the
        one before, or under a response): a wait that spanned a SIGSTOP, a
        debugger's pause or a hang lasted as long as the pause, which says nothing
        of the job's pace (its count still does)."""
        kinds: dict[str, tuple[int, int]] = {}
        for pace in record.pace or ():
            kind = kind_of(pace.op)
            waits, longest = kinds.get(kind, (0, 0))
            kinds[kind] = (waits + pace.waits, max(longest, pace.longest_ns))
        keys = learning_keys(record)
        for kind, (waits, longest) in kinds.items():
            seen_waits, seen_longest = rank.paced.get(kind, (0, 0))
            if waits <= seen_waits and longest <= seen_longest:
                continue
            rank.paced[kind] = (max(waits, seen_waits), max(longest, seen_longest))
            for key in keys:
                learned = self.learned.setdefault(key, {}).setdefault(kind, Learned())
                learned.count += max(0, waits - seen_waits)
                if longest > seen_longest and not paused and longest / NS < spanned:
                    learned.longest = max(learned.longest, longest / NS)
                self.changed.add(key)
