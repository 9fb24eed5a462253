"""Pure: the deadline of a rank's current wait, and the settings it comes from.

Fixed, an `hb.expect()` window, `mx.distributed.init`'s own, or learned per kind
of wait and per job (`auto`: docs/configuration.md, "The auto deadline").
"""

from __future__ import annotations

from dataclasses import dataclass

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
