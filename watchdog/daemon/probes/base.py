"""What every platform's probe offers (`Probe`, the generic one), its errors, and the
helpers the platforms share (the identity rule, a tool's output, where a tool is found).

The platforms' probes (linux.py, macos.py) build on this module; the package's face
(`probes/__init__.py`) picks one of them once and re-exports what is here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import psutil

from watchdog import host

# What a probe returns: its data type lives below the seam (the judges read it).
from watchdog.daemon.sample import GpuPower
from watchdog.daemon.sample import ProcessSample as ProcessSample
from watchdog.states import GONE_STATUSES, ProcStatus
from watchdog.status import HotThread


class ProbeError(Exception):
    """A probe could not read something it should have (e.g. access denied)."""


# Uninterruptible sleep ('D'): a SIGSTOP takes effect only once the process leaves it.
UNINTERRUPTIBLE = ProcStatus.DISK_SLEEP


class Probe:
    """What every platform offers; subclasses fill in wired memory and evidence."""

    name = "generic"
    native_ids = False  # see ProcessSample.native_ids
    # Does MLX compute on a GPU here whose per-process time the probe reads (macOS)? Then
    # a GPU time not read is unknown, never flat (judge/frames.py): no quiet hang on it.
    gpu_clock = False
    # Seconds one native stack sample may take (the stack sampler's box): gdb reads a
    # rank in ~0.5 s.
    stack_timeout = 3.0
    # psutil, or a stand-in with its API (the simulated Mac's, watchdog/macsim).
    ps: Any = psutil

    def main_thread(self, pid: int, tids: list[int]) -> int | None:
        """The main thread among `tids`: psutil lists it first (task order)."""
        return tids[0] if tids else None

    def sample(self, pid: int) -> ProcessSample | None:
        """The process now, or None when it no longer exists (or is a zombie)."""
        try:
            ps = self.ps
            proc = ps.Process(pid)
            with proc.oneshot():
                status = proc.status()
                if status in GONE_STATUSES:
                    return None
                start_time = proc.create_time()
                uids = tuple(proc.uids())
                uid = uids[0]
                try:
                    listed = proc.threads()
                except ps.AccessDenied:
                    listed = []
        except ps.NoSuchProcess:
            return None
        except ps.AccessDenied as err:
            raise ProbeError(f"access denied reading pid {pid}") from err
        except OSError as err:  # a thread vanishing mid-read on some kernels
            raise ProbeError(f"reading pid {pid}: {err}") from err
        threads = tuple((t.id, t.user_time + t.system_time) for t in listed)
        system = tuple((t.id, t.system_time) for t in listed)
        main = self.main_thread(pid, [t.id for t in listed])
        return ProcessSample(pid, start_time, uid, status, threads, system, main,
                             self.native_ids, uids=uids)

    def glance(self, pid: int) -> ProcessSample | None:
        """A first look at `pid`'s identity, before a full sample is worth its cost (a
        record not watched yet may name any process): None when it is gone. Here the
        full sample; on Linux its start and credentials only, without its threads."""
        return self.sample(pid)

    def descends(self, pid: int, depth: int = 8) -> bool | None:
        """Is `pid` a descendant of this process (the daemon's own stack sampler: its gdb,
        its `sample`, and what those start)? None when its line could not be read to the
        end (a tracer gone meanwhile)."""
        me = os.getpid()
        try:
            for _ in range(depth):
                if pid == me:
                    return True
                if pid <= 1:
                    return False
                pid = int(self.ps.Process(pid).ppid())
        except (self.ps.NoSuchProcess, self.ps.AccessDenied, OSError):
            return None
        return False

    def wired_bytes(self) -> int | None:
        """The node's wired memory in bytes; None when this platform cannot tell
        (ProbeError when it should and could not)."""
        return None

    def held_wired_bytes(self, leaver: int | None = None) -> int | None:
        """Bytes of wired memory live processes hold themselves, whoever owns them
        (Linux: what they lock, `mlock` or a locked SysV segment; macOS: each process's
        wired size), or None when this platform cannot tell. Memory a live process
        holds is not leaked: the reboot flag is the node's, not a user's (act/wired.py)."""
        return None

    def thermal(self) -> str | None:
        """The node's thermal throttling in a few words ("CPU speed limit 70%"), or
        None when it is not throttled or this platform cannot tell."""
        return None

    def load_per_cpu(self) -> float:
        """Runnable load per core over the last minute, at least 1.0."""
        try:
            return max(1.0, float(self.ps.getloadavg()[0]) / (self.ps.cpu_count() or 1))
        except (OSError, AttributeError):
            return 1.0

    def deleted_holders(self, directory: str) -> dict[int, int] | None:
        """Bytes of deleted files under `directory` still held open, by the uid of the
        process holding them (what fills a filesystem nothing can free); None where
        that cannot be found."""
        return None

    def stack_command(self, pid: int) -> list[str] | None:
        """A native stack sampler for evidence, or None when none is installed."""
        return None

    def hot_frames(self, text: str) -> list[HotThread] | None:
        """The sampler's output as threads with their hot frames; None: no parser
        for this platform's tool, [] for output that holds no stacks."""
        return None

    def native_stacks(self, pid: int, timeout: float) -> dict[int, tuple[str, ...]] | None:
        """One sample of every thread's native frames (leaf first) by thread id, within
        `timeout` seconds; None when no sampler is installed, {} when it read nothing.
        The caller checks the process's identity first (probes/stacksampler.py)."""
        return None

    def gpu_time(self, pid: int, timeout: float) -> int | None:
        """The process's accumulated GPU nanoseconds (macOS: IOKit's per-client
        `accumulatedGPUTime`); None when this platform cannot tell."""
        return None

    def gpu_reading(self, pid: int, timeout: float) -> tuple[int | None, str]:
        """`gpu_time`, with why it is None in words ("" when read)."""
        ns = self.gpu_time(pid, timeout)
        return ns, "" if ns is not None else "not read on this platform"

    def gpu_others(self, pid: int) -> dict[int, tuple[int, str]] | None:
        """Every other process's accumulated GPU nanoseconds and name, by pid, from the
        same reading as the last `gpu_reading` (macOS: one ioreg lists every Metal
        client); None when this platform cannot tell or nothing was read yet."""
        return None

    def gpu_power(self, timeout: float) -> GpuPower | None:
        """The GPU's active residency and power over a short sample (macOS, root:
        `powermetrics --samplers gpu_power`); None when this platform cannot tell."""
        return None

    def socket_queues(self, pid: int) -> tuple[tuple[int, int, int], ...] | None:
        """Each TCP socket of the process: (inode, bytes queued to send, bytes received
        and not yet read); None when this platform cannot tell."""
        return None

    def socket_counters(self, pid: int) -> tuple[tuple[int, int, int], ...] | None:
        """Each TCP socket of the process: (inode, bytes sent and acknowledged, bytes
        received), counters that only grow while bytes move; None when this platform
        (or this process's network namespace) cannot tell them for every socket."""
        return None


def same_process(sample: ProcessSample | None, start_time: float, uid: int,
                 start_ticks: int = 0) -> bool:
    """The identity rule: same pid (implied), same start, same owner.

    The owner is every uid of the process (real, effective, saved, filesystem),
    and the process must be dumpable: a user's `su` waiting for its password has
    their real uid but root's powers, and is not theirs to have traced or ended.

    The start is compared in clock ticks since boot when both sides know them:
    an epoch start time is ticks + the *current* boot time, which moves when
    the wall clock is stepped (NTP, `date -s`, a VM resume). Records of old
    hooks (no ticks) fall back to the epoch start time.
    """
    if sample is None or sample.uid != uid or sample.thread_of:
        return False
    if any(other != uid for other in sample.uids) or sample.dumpable is False:
        return False
    if start_ticks and sample.start_ticks:
        return sample.start_ticks == start_ticks
    return abs(sample.start_time - start_time) < 0.01


def stack_tool_output(command: list[str], timeout: float, limit: int, what: str) -> str | None:
    """A native stack tool's output (gdb, `sample`), its first `limit` bytes as text;
    None when it ran past `timeout` (killed); ProbeError when it cannot start."""
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return None
    except OSError as err:
        raise ProbeError(f"{what}: {err}") from err
    return done.stdout[:limit].decode("utf-8", "replace")


def find_tool(*names: str) -> str | None:
    """The first of `names` in the daemon's own tool folders (host.TOOL_PATH), never
    on the caller's PATH."""
    for name in names:
        path = shutil.which(name, path=host.TOOL_PATH)
        if path:
            return path
    return None
