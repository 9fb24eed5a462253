"""macOS: wired memory from the VM statistics; native stacks from `sample`."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct
import subprocess
from dataclasses import replace
from typing import Any

import psutil

from watchdog.daemon.probes import (
    Probe,
    ProbeError,
    ProcessSample,
    find_tool,
    gputime,
    samplegraph,
    stack_tool_output,
)
from watchdog.status import HotThread

RUSAGE_INFO_V2 = 2
# struct rusage_info_v2 (<sys/resource.h>): a 16-byte uuid, 16 uint64 counters, then
# ri_diskio_bytesread and ri_diskio_byteswritten; 8 more uint64 follow in v2.
RUSAGE_V2_SIZE = 16 + 26 * 8
DISKIO = struct.Struct("<QQ")
DISKIO_OFFSET = 16 + 16 * 8
PAGEINS = struct.Struct("<Q")
PAGEINS_OFFSET = 16 + 4 * 8  # ri_pageins: after user, system time and the two wakeups


def rusage_pageins(buffer: bytes) -> int:
    """ri_pageins (pages read back in: macOS's major faults) of a struct rusage_info_v2."""
    if len(buffer) < PAGEINS_OFFSET + PAGEINS.size:
        raise ValueError("a short rusage_info_v2")
    return int(PAGEINS.unpack_from(buffer, PAGEINS_OFFSET)[0])


def pmset_therm(text: str) -> str | None:
    """`pmset -g therm`'s output: the CPU speed limit when under 100%, and a thermal
    warning level when one was recorded; None when the node is not throttled."""
    parts = []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "CPU_Speed_Limit":
            try:
                limit = int(value.strip())
            except ValueError:
                continue
            if 0 <= limit < 100:
                parts.append(f"CPU speed limit {limit}% (thermal)")
        low = line.strip().lower()
        if low.startswith("thermal warning level") and "no thermal" not in low:
            parts.append(line.strip().rstrip("."))
    return "; ".join(parts) or None


def rusage_io(buffer: bytes) -> tuple[int, int]:
    """(bytes read, bytes written) from a struct rusage_info_v2 as proc_pid_rusage fills it."""
    if len(buffer) < DISKIO_OFFSET + DISKIO.size:
        raise ValueError("a short rusage_info_v2")
    read, written = DISKIO.unpack_from(buffer, DISKIO_OFFSET)
    return int(read), int(written)


@functools.lru_cache(maxsize=1)
def _libproc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("proc") or "/usr/lib/libproc.dylib")
    except OSError:
        return None


def read_io(pid: int, libproc: Any = None) -> tuple[int, int] | None:
    """The process's disk I/O counters through proc_pid_rusage, or None (no libproc, or
    not permitted: another user's process without root)."""
    raw = _rusage(pid, libproc)
    return None if raw is None else rusage_io(raw)


def read_pageins(pid: int, libproc: Any = None) -> int | None:
    """Pages the process read in from disk (its major faults) through proc_pid_rusage,
    or None."""
    raw = _rusage(pid, libproc)
    return None if raw is None else rusage_pageins(raw)


def _rusage(pid: int, libproc: Any = None) -> bytes | None:
    """The process's proc_pid_rusage (version 2) as bytes, or None (no libproc, or not
    permitted: another user's process without root)."""
    lib = libproc if libproc is not None else _libproc()
    if lib is None:
        return None
    buffer = ctypes.create_string_buffer(RUSAGE_V2_SIZE)
    try:
        if lib.proc_pid_rusage(ctypes.c_int(pid), ctypes.c_int(RUSAGE_INFO_V2), buffer) != 0:
            return None
    except (AttributeError, OSError):
        return None
    return buffer.raw


class MacProbe(Probe):
    """Thread ids from psutil here are positions in `task_threads` order, main
    first (the inherited `main_thread`), not `threading.get_native_id()` values:
    the record's table of Python threads cannot be matched (see docs/limits.md)."""

    name = "macos"

    def sample(self, pid: int) -> ProcessSample | None:
        sample = super().sample(pid)
        if sample is None:
            return None
        return replace(sample, io=read_io(pid), major_faults=read_pageins(pid))

    def thermal(self) -> str | None:
        pmset = find_tool("pmset")
        if pmset is None:
            return None
        try:
            done = subprocess.run([pmset, "-g", "therm"], capture_output=True, text=True,
                                  timeout=2, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return pmset_therm(done.stdout)

    def wired_bytes(self) -> int | None:
        try:
            return int(psutil.virtual_memory().wired)  # type: ignore[attr-defined]
        except (OSError, AttributeError) as err:
            raise ProbeError(f"reading wired memory: {err}") from err

    def stack_command(self, pid: int) -> list[str] | None:
        sample = find_tool("sample")
        # `sample PID 1`: one second of samples of every thread, to stdout.
        return [sample, str(pid), "1"] if sample else None

    def hot_frames(self, text: str) -> list[HotThread] | None:
        return samplegraph.parse(text)

    def gpu_time(self, pid: int, timeout: float) -> int | None:
        """`ioreg`'s AGXDeviceUserClient entries of the process, their GPU time summed;
        None without ioreg or without a Metal client. Never run on hardware."""
        ioreg = find_tool("ioreg")
        if not ioreg:
            return None
        try:
            done = subprocess.run([ioreg, "-r", "-c", "AGXDeviceUserClient", "-l", "-w0"],
                                  capture_output=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, check=False)
        except (subprocess.TimeoutExpired, OSError):
            return None
        text = done.stdout[:8 << 20].decode("utf-8", "replace")
        return gputime.gpu_time_by_pid(text).get(pid)

    def native_stacks(self, pid: int, timeout: float) -> dict[int, tuple[str, ...]] | None:
        """`sample PID 1`'s heaviest path of each thread, leaf first, by position (not
        the OS's thread ids: judge/frames.py then takes every thread not parked as
        busy). Never run on hardware (docs/macos.md)."""
        command = self.stack_command(pid)
        if not command:
            return None
        text = stack_tool_output(command, timeout, 8 << 20, f"sample on pid {pid}")
        return {} if text is None else sample_stacks(text)


def sample_stacks(text: str) -> dict[int, tuple[str, ...]]:
    """Each thread of a `sample` report as its heaviest path, leaf first, by position."""
    return {i: tuple(p.frame for p in reversed(t.path))
            for i, t in enumerate(samplegraph.parse(text))}
