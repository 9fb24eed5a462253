"""Pure: a rank's threads between two samples: how busy, where (user or kernel), and
which of them run Python (the record's table) and which are MLX's own."""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.daemon.sample import ProcessSample
from watchdog.record import Record

QUIET_RATIO = 0.1  # a Python thread under this share of a core is not running Python
# A thread using this share of a core (load-scaled) counts as at work when judging
# whether a rank computes: lower than spin_ratio, because a computing rank shares
# the machine with its peers' spinning threads and often gets less than half a core.
WORK_RATIO = 0.25
# A busy thread spending less than this share of its CPU in the kernel computes;
# a ring rank polling a peer spends ~85% there (docs/judging.md).
KERNEL_SHARE = 0.3
# Which backends' waits on a peer poll in the kernel: watchdog/backends.py (Spin).


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


@dataclass(frozen=True)
class ThreadTick:
    """One interval's view of a rank's threads (see `thread_tick`). Every share but
    `busiest` is how much of a core a thread *wanted*: read from its run + run-queue
    time where the OS keeps it (Linux), else its CPU share scaled up by the load."""

    busiest: float  # the busiest thread's share of a core it got (CPU time; reported)
    kernel_share: float | None  # share of that thread's CPU spent in the kernel; None: unknown
    python: float | None  # busiest Python thread (main included); None: cannot tell
    native: float | None  # busiest thread that runs no Python; None: cannot tell
    busy: float = 0.0  # the most any one thread wanted a core
    measured_by: str = "cpu"  # "demand" when the busiest thread's share came from it
    hot: tuple[int, ...] = ()  # the threads that wanted WORK_RATIO of a core or more


def thread_tick(before: dict[int, float], after: dict[int, float],
                sys_before: dict[int, float], sys_after: dict[int, float], seconds: float,
                python: frozenset[int] | None, scale: float = 1.0,
                demand_before: dict[int, float] | None = None,
                demand_after: dict[int, float] | None = None) -> ThreadTick:
    """Each thread's use of, and demand for, a core between two samples, summed up.

    `python` is the set of thread ids known to run Python (None: unknown). `scale` is
    the machine's runnable load per core (at least 1): a thread whose demand is not
    known is taken to have wanted its CPU share times that (on an oversubscribed
    machine a spinning thread gets only 1/load of a core). A demand known for a thread
    is its run + run-queue time, which does not fall with the load.
    """
    busiest, kernel, py, native, busy, by = 0.0, 0.0, 0.0, 0.0, 0.0, "cpu"
    hot: list[int] = []
    wanted_before, wanted_after = demand_before or {}, demand_after or {}
    if seconds > 0:
        for tid, cpu in after.items():
            prior = before.get(tid)
            if prior is None or cpu < prior:
                continue
            ratio = min((cpu - prior) / seconds, 1.0)
            asked, had = wanted_after.get(tid), wanted_before.get(tid)
            if asked is not None and had is not None and asked >= had:
                share, how = min((asked - had) / seconds, 1.0), "demand"
            else:
                share, how = min(ratio * scale, 1.0), "cpu"
            busiest = max(busiest, ratio)
            if share >= WORK_RATIO:
                hot.append(tid)
            if share > busy:
                used = cpu - prior
                spent = sys_after.get(tid, 0.0) - sys_before.get(tid, 0.0)
                busy, by = share, how
                kernel = max(0.0, spent) / used if used > 0 else 0.0
            if python is not None:
                if tid in python:
                    py = max(py, share)
                else:
                    native = max(native, share)
    known = kernel if sys_after else None  # a probe without system times cannot tell
    if python is None:
        return ThreadTick(busiest, known, None, None, busy, by, tuple(hot))
    return ThreadTick(busiest, known, py, native, busy, by, tuple(hot))


def python_threads(record: Record, sample: ProcessSample) -> frozenset[int] | None:
    """The ids (in the sample's id space) of the rank's Python threads, or None
    when that cannot be told: no main thread known, no table published, a table
    that overflowed, or ids that are not native while other Python threads exist."""
    main = sample.main_tid
    table = record.python_threads
    if main is None or table is None or record.python_threads_overflow:
        return None
    if sample.native_ids:
        return frozenset((main, *table))
    return frozenset((main,)) if not table else None
