"""A process's start in clock ticks since boot, as Linux keeps it: the identity a
rank writes into its record and the daemon's probe checks it against.

Field 22 of `/proc/<pid>/stat`. Unlike the epoch start time (ticks plus the boot
time as it reads *now*), it does not move when the wall clock is stepped. One
parser for both sides: the rank side imports this module, so it uses the stdlib
only.
"""

from __future__ import annotations

import os
import time

from watchdog import host


def start_ticks(stat: str) -> int:
    """Field 22 of a /proc/<pid>/stat line: the start in clock ticks since boot.

    The command name (field 2) may hold spaces and parentheses: count from
    the last ")". Raises ValueError or IndexError on a line that is not one.
    """
    return int(stat[stat.rindex(")") + 2:].split()[19])


def read_start_ticks(pid: int | str, proc: str = "/proc") -> int:
    """The start ticks of `pid` ("self" for this process); raises OSError,
    ValueError or IndexError. OSError off Linux, the simulated Mac included: macOS
    keeps no such count (its /proc would not be there)."""
    if host.os_name() != host.LINUX:
        raise FileNotFoundError(f"{proc}/{pid}/stat: not on Linux")
    with open(f"{proc}/{pid}/stat") as f:
        return start_ticks(f.read())


def wall_start(ticks: int) -> float | None:
    """The wall time a process started at `ticks` since boot, to a tick (Linux): the
    boot time taken as now less CLOCK_BOOTTIME, not /proc/stat's whole-second btime
    (psutil's, which reads a start up to 1 s early). None off Linux or for 0 ticks."""
    if not ticks or host.os_name() != host.LINUX or not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def locked_by_uid(proc: str = "/proc") -> dict[int, int] | None:
    """Bytes each real uid's live processes hold locked (their VmLck), from every
    /proc/<pid>/status; None when /proc cannot be listed (macOS)."""
    try:
        pids = [n for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return None
    held: dict[int, int] = {}
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/status", "rb") as f:
                text = f.read(8192)
        except OSError:
            continue  # gone meanwhile
        uid, locked = _field(text, b"\nUid:"), _field(text, b"\nVmLck:")
        if uid is not None and locked:
            held[uid] = held.get(uid, 0) + locked * 1024
    return held


def _field(text: bytes, name: bytes) -> int | None:
    """The first number after `name` in a /proc status text, or None."""
    at = text.find(name)
    if at < 0:
        return None
    fields = text[at + len(name):text.find(b"\n", at + 1)].split()
    return int(fields[0]) if fields and fields[0].isdigit() else None

