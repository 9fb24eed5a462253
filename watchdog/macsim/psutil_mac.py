"""psutil as it answers on macOS, built from the live Linux process.

What psutil's macOS backend (`_psosx`) gives, and nothing more:

- thread ids are positions in `task_threads` order, from 1, main thread first
  (psutil's C `proc_threads` builds them as `j + 1`), never the kernel's ids;
- a status is one of `kinfo_proc.p_stat`'s: SIDL "idle", SRUN "running", SSTOP
  "stopped", SZOMB "zombie" (SSLEEP is defined but xnu leaves a live process in
  SRUN): no "disk-sleep", no "tracing-stop", no "sleeping" (guessed from xnu's
  sources: `proc_stop` sets SSTOP, nothing sets SSLEEP; docs/macos.md);
- uids are (real, effective, saved): no filesystem uid;
- no `cpu_num`, no `io_counters`, no `num_ctx_switches` per thread;
- MLX's compute thread is not among the threads: it stands for the Mac's GPU (gpu.py);
- `virtual_memory()` has `wired` (macOS's wired pages; here the Linux kernel's
  Unevictable + Mlocked, the nearest it keeps).

The errors are psutil's own classes, so callers catch what they catch on a Mac.
"""

from __future__ import annotations

import contextlib
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import psutil

from watchdog.macsim import gpu

NoSuchProcess = psutil.NoSuchProcess
AccessDenied = psutil.AccessDenied
ZombieProcess = psutil.ZombieProcess
Error = psutil.Error
TimeoutExpired = psutil.TimeoutExpired
CONN_ESTABLISHED, CONN_LISTEN = psutil.CONN_ESTABLISHED, psutil.CONN_LISTEN

pthread = namedtuple("pthread", ["id", "user_time", "system_time"])
puids = namedtuple("puids", ["real", "effective", "saved"])
svmem = namedtuple("svmem", ["total", "available", "percent", "used", "free", "active",
                             "inactive", "wired"])

# Linux's state letters as psutil words, to the p_stat macOS would keep.
_STATUS = {
    psutil.STATUS_STOPPED: psutil.STATUS_STOPPED,
    psutil.STATUS_ZOMBIE: psutil.STATUS_ZOMBIE,
    psutil.STATUS_DEAD: psutil.STATUS_ZOMBIE,
}


class Process:
    """psutil.Process as macOS answers it: only the calls `_psosx` has."""

    def __init__(self, pid: int | None = None) -> None:
        self._proc = psutil.Process(pid)
        self.pid = self._proc.pid

    def oneshot(self) -> contextlib.AbstractContextManager[None]:
        """psutil's: the reads within are taken from one look at the process."""
        return self._proc.oneshot()

    def status(self) -> str:
        """psutil's words as a Mac's p_stat gives them: "running" for every live
        process, "stopped" after SIGSTOP, "zombie" for one exited."""
        return _STATUS.get(self._proc.status(), psutil.STATUS_RUNNING)

    def create_time(self) -> float:
        """The start time, seconds since the epoch (psutil's)."""
        return self._proc.create_time()

    def uids(self) -> tuple[int, int, int]:
        """The real, effective and saved uids (a Mac has no filesystem uid)."""
        real, effective, saved = self._proc.uids()[:3]
        return puids(real, effective, saved)

    def threads(self) -> list[Any]:
        """The threads as `_psosx` lists them: ids numbered from 1 in the kernel's
        order, the main thread first; MLX's compute thread left out (the Mac's GPU)."""
        gpu_threads = gpu.hidden(self.pid)  # MLX's compute: the Mac's GPU (gpu.py)
        listed = [t for t in self._proc.threads() if t.id not in gpu_threads]
        main = [t for t in listed if t.id == self.pid]
        rest = [t for t in listed if t.id != self.pid]
        return [pthread(i + 1, t.user_time, t.system_time)
                for i, t in enumerate(main + rest)]

    def kernel_tids(self) -> list[int]:
        """The stand-in's own key (no psutil call has it on a Mac): the kernel ids in
        `threads()`'s order, for the other stand-ins that read the same process."""
        gpu_threads = gpu.hidden(self.pid)
        ids = [t.id for t in self._proc.threads() if t.id not in gpu_threads]
        return [i for i in ids if i == self.pid] + [i for i in ids if i != self.pid]

    def name(self) -> str:
        """The process's name (psutil's)."""
        return self._proc.name()

    def cmdline(self) -> list[str]:
        """The process's command line (psutil's)."""
        return self._proc.cmdline()

    def environ(self) -> dict[str, str]:
        """The process's environment (psutil's)."""
        return self._proc.environ()

    def username(self) -> str:
        """The name of the process's real user (psutil's)."""
        return self._proc.username()

    def ppid(self) -> int:
        """The parent's pid (psutil's)."""
        return self._proc.ppid()

    def is_running(self) -> bool:
        """Whether the process still runs, the same one (psutil's)."""
        return self._proc.is_running()

    def cpu_times(self) -> Any:
        """The process's CPU times (psutil's)."""
        return self._proc.cpu_times()

    def memory_info(self) -> Any:
        """The process's memory (psutil's)."""
        return self._proc.memory_info()

    def net_connections(self, kind: str = "inet") -> list[Any]:
        """The process's connections of `kind` (psutil's)."""
        return self._proc.net_connections(kind=kind)

    def children(self, recursive: bool = False) -> list[Process]:
        """The process's children (all descendants with `recursive`), as stand-ins."""
        return [Process(c.pid) for c in self._proc.children(recursive=recursive)]


def process_iter(attrs: list[str] | None = None) -> Iterator[Process]:
    """Every live process, as a stand-in (`attrs` is taken and not used)."""
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            yield Process(proc.pid)


def net_connections(kind: str = "inet") -> list[Any]:
    """Every process's connections (root on a Mac, as here)."""
    return psutil.net_connections(kind=kind)


def pid_exists(pid: int) -> bool:
    """Whether `pid` is a live process (psutil's)."""
    return psutil.pid_exists(pid)


def pids() -> list[int]:
    """Every live pid (psutil's)."""
    return psutil.pids()


def getloadavg() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages (psutil's)."""
    return psutil.getloadavg()


def cpu_count(logical: bool = True) -> int | None:
    """The number of CPUs (psutil's)."""
    return psutil.cpu_count(logical)


def boot_time() -> float:
    """When the machine booted, seconds since the epoch (psutil's)."""
    return psutil.boot_time()


def virtual_memory() -> Any:
    """The memory as `_psosx` gives it, its `wired` Linux's Unevictable (or
    Mlocked, the larger)."""
    memory = psutil.virtual_memory()
    wired = 0
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Unevictable", "Mlocked"):
                wired = max(wired, int(rest.split()[0]) * 1024)
    return svmem(memory.total, memory.available, memory.percent, memory.used, memory.free,
                 getattr(memory, "active", 0), getattr(memory, "inactive", 0), wired)
