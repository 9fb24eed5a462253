"""Parse `ioreg -r -c AGXDeviceUserClient -l -w0` (macOS): each process's accumulated GPU
time, the clock Activity Monitor's GPU column reads.

Every Metal client of a process is an AGXDeviceUserClient entry; ioreg prints its
properties in one block, sorted by key, so `AppUsage` comes before the client's creator:

    +-o AGXDeviceUserClient  <class AGXDeviceUserClient, id 0x1000a1b2c, !registered, ...>
        {
          "AppUsage" = ({"API"="Metal","lastSubmittedTime"=...,"accumulatedGPUTime"=123632000})
          "IOUserClientCreator" = "pid 4245, python3.12"
        }

Pure: text in, {pid: nanoseconds summed over its clients} out; never raises. Written
from the format as documented, never run on a Mac here (docs/macos.md).
"""

from __future__ import annotations

import re

_CREATOR = re.compile(r'"IOUserClientCreator" = "pid (\d+),')
_CREATOR_NAME = re.compile(r'"IOUserClientCreator" = "pid (\d+), ([^"]*)"')
_GPU_NS = re.compile(r'"accumulatedGPUTime"=(\d+)')
MAX_CLIENTS = 4096


def gpu_time_by_pid(text: str) -> dict[int, int]:
    """Accumulated GPU nanoseconds per pid, over every client block that names its pid
    and holds at least one `accumulatedGPUTime` (a client with an empty `AppUsage`, one
    that submitted nothing yet, counts 0 when another of its blocks reads; a pid none
    of whose blocks holds one is not read: unknown, not 0)."""
    totals: dict[int, int] = {}
    for block in text.split("+-o ")[1:MAX_CLIENTS + 1]:
        creator = _CREATOR.search(block)
        if creator is None:
            continue
        pid = int(creator.group(1))
        if "AppUsage" not in block:
            continue
        totals[pid] = totals.get(pid, 0) + sum(int(n) for n in _GPU_NS.findall(block))
    return totals


def listed(text: str, pid: int) -> bool:
    """Does any client block name this pid as its creator?"""
    return any((c := _CREATOR.search(block)) is not None and int(c.group(1)) == pid
               for block in text.split("+-o ")[1:MAX_CLIENTS + 1])


def client_names(text: str) -> dict[int, str]:
    """Each client's creator's name by pid, as ioreg prints it ("python3.12")."""
    return {int(m.group(1)): m.group(2)[:64]
            for m in _CREATOR_NAME.finditer(text[:8 << 20])}
