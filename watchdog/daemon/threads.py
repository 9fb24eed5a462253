"""Pure: a rank's threads between two samples: how busy, where (user or kernel), and
which of them run Python (the record's table) and which are MLX's own."""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.daemon.probes import ProcessSample
from watchdog.record import Record

QUIET_RATIO = 0.1  # a Python thread under this share of a core is not running Python
# A thread using this share of a core (load-scaled) counts as at work when judging
# whether a rank computes: lower than spin_ratio, because a computing rank shares
# the machine with its peers' spinning threads and often gets less than half a core.
WORK_RATIO = 0.25
# A busy thread spending less than this share of its CPU in the kernel computes;
# a ring rank polling a peer spends ~85% there (docs/architecture.md).
KERNEL_SHARE = 0.3
# Backends whose wait on a peer polls sockets, i.e. spins in the kernel. Not jaccl
# or mpi: their waits poll in user space, where computation runs too.
KERNEL_SPIN_BACKENDS = frozenset({"ring"})


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
    """One interval's view of a rank's threads (see `thread_tick`)."""

    busiest: float  # the busiest thread's share of a core
    kernel_share: float | None  # share of that thread's CPU spent in the kernel; None: unknown
    python: float | None  # busiest Python thread (main included); None: cannot tell
    native: float | None  # busiest thread that runs no Python; None: cannot tell


def thread_tick(before: dict[int, float], after: dict[int, float],
                sys_before: dict[int, float], sys_after: dict[int, float], seconds: float,
                python: frozenset[int] | None) -> ThreadTick:
    """Each thread's use of a core between two samples, summed up.

    `python` is the set of thread ids known to run Python (None: unknown).
    """
    busiest, kernel, py, native = 0.0, 0.0, 0.0, 0.0
    if seconds > 0:
        for tid, cpu in after.items():
            prior = before.get(tid)
            if prior is None or cpu < prior:
                continue
            ratio = min((cpu - prior) / seconds, 1.0)
            if ratio > busiest:
                used = cpu - prior
                spent = sys_after.get(tid, 0.0) - sys_before.get(tid, 0.0)
                busiest, kernel = ratio, (max(0.0, spent) / used if used > 0 else 0.0)
            if python is not None:
                if tid in python:
                    py = max(py, ratio)
                else:
                    native = max(native, ratio)
    share = kernel if sys_after else None  # a probe without system times cannot tell
    if python is None:
        return ThreadTick(busiest, share, None, None)
    return ThreadTick(busiest, share, py, native)


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
