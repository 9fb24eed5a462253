"""Pure: what one scan saw of one rank beside its record and process sample, one frozen
value (`Sighting`) the judge takes whole: the detector's verdict (detector.py), the
wedge's member and what the rank shows (daemon/sightings.py) are built from it.

It is built in one place (daemon/sightings.py) from the stack sampler's and the probers'
state, with one freshness rule: a stack sample speaks for the rank for FRESH seconds
(`Sighting.fresh`). The next fact of this kind is a field here and the rule reading it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from watchdog.daemon.judge.frames import Reading

FRESH = 10.0  # seconds a stack sample speaks for
GPU_WORKS = "advances"  # `Sighting.gpu` of a rank whose GPU time advances on work
# Two samples of one wait this far apart, both reading the rank in its backend's wait,
# before its sockets' stillness counts as exact (the lower wedge floor): no single sample
# decides. The early sample takes the second (daemon/early.py).
TWICE_APART = 1.0


def fresh(age: float | None) -> bool:
    """The freshness rule: does a stack sample `age` seconds old (None: none) still speak
    for its rank?"""
    return age is not None and age <= FRESH


class Sockets(NamedTuple):
    """A rank's sockets while the stack sampler tracks them: the seconds their queues
    stood still, the bytes received and not read, and whether that stillness was read
    from each socket's byte counters (exact: probes/tcpdiag.py), not the queues alone."""

    still: float
    unread: int
    exact: bool


@dataclass(frozen=True)
class Sighting:
    """What one scan saw of one rank (the default: nothing but an idle node)."""

    # The node's runnable load per core over this scan: a spinning thread got only
    # 1/load of a core, so what it got is scaled up by it (detector).
    load: float = 1.0
    # Seconds since its latest native stack sample (None: none kept); that sample speaks
    # for it while `fresh`.
    age: float | None = None
    # What its busy threads ran at that sample when fresh (frames.classify; a GPU whose
    # time advances reads computing); None: none fresh, or taken with no thread busy
    # where the OS names the busy threads (nothing spins).
    seen: Reading | None = None
    # What it waits in at that sample when taken with no thread busy (frames.asleep), of
    # any age: the quiet hang's frames.
    asleep: Reading | None = None
    # Its own GPU time flat while another process's advances on a GPU busy at working
    # power, at a fresh sample (gpuwork.behind): what its work waits behind; "": not.
    behind: str = ""
    sockets: Sockets | None = None  # None: not read (not tracked, or unreadable)
    link: str | None = None  # its data path to its peers as last probed (datalink.py)
    # Stopped by the daemon's own stack sampler during this interval (gdb holds it
    # ~0.5 s): what its threads used then says nothing.
    traced: bool = False
    # When a person's tracer was last seen on a rank of its job (monotonic ns; 0: never):
    # its waits count from that detach.
    judged_from_ns: int = 0
    # At bring-up: the ranks of its job seen (its records here, the peers' answers) and
    # where they were looked for; None: no rank of its job at bring-up.
    present: frozenset[int] | None = None
    where: str = ""
    # Nothing busy, its fresh sample finds it parked in its backend's wait: a wedge's
    # member as a spinning rank is, when its job's stillness is exact (wedge.py).
    parked: bool = False
    # Seconds since bytes last moved on a socket of its open at two reads in a row (byte
    # counters, read lately); None: not read so. A transfer under way (holds.py).
    flowing: float | None = None

    @property
    def fresh(self) -> bool:
        """Does its latest stack sample still speak for it (at most FRESH seconds old)?"""
        return fresh(self.age)

    @property
    def gpu(self) -> str:
        """Its GPU at its latest fresh sample, read either way (busy threads, or none):
        GPU_WORKS, "unknown: <why>", or "" (flat, or no GPU time kept here)."""
        readings = (self.seen, self.asleep if self.fresh else None)
        if any(r is not None and r.gpu for r in readings):
            return GPU_WORKS
        why = next((r.gpu_unknown for r in readings if r is not None and r.gpu_unknown), "")
        return f"unknown: {why}" if why else ""


NOTHING = Sighting()
