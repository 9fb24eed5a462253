"""A record against its process: one look, one typed answer.

The daemon's scan, the CLI's sampling (`status` without a daemon, `inspect`)
and the signaller all ask the same question of a pid and the identity a
record gives it (start time, start ticks, uid): is that process still there,
and is it the one the record describes? `identify` answers it through the
probe, by the identity rule of `probes.same_process`; `observe` adds what the
record itself says (open, or closed while its process runs). Each caller words
the answer its own way (a status reason, an invalid-record message, a signal
result): only the classification is shared.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from watchdog.daemon.probes import Probe, ProbeError, same_process
from watchdog.daemon.sample import ProcessSample
from watchdog.record import STATUS_OPEN, Record


class Presence(enum.Enum):
    """What one look at a record's process found."""

    LIVE = "live"  # its own process, the record open: judged, with its sample
    CLOSED = "closed"  # its own process, the record closed or abandoned: reported, never judged
    GONE = "gone"  # no process with that pid (or a zombie): the rank exited
    NOT_OURS = "not-ours"  # the pid is another process now: a stale or forged record
    UNKNOWN = "unknown"  # the probe failed: nothing can be concluded, nothing is done


@dataclass(frozen=True)
class Observation:
    """One look at a record's process: its presence, and the sample or the error."""

    seen: Presence
    sample: ProcessSample | None = None  # LIVE and CLOSED: the process as sampled
    error: ProbeError | None = None  # UNKNOWN: why the probe failed
    thread_of: int = 0  # NOT_OURS: the process whose thread the pid names (Linux), or 0


def identify(probe: Probe, pid: int, start_time: float, uid: int,
             start_ticks: int = 0, glance: bool = False) -> Observation:
    """The process `pid` against an identity: LIVE (with its sample), GONE, NOT_OURS,
    or UNKNOWN (with the probe's error), never a guess. `glance`: a first look at its
    identity alone (`Probe.glance`) before the full sample, for a record not yet
    watched: one naming another process (or a thread) costs two reads, not a read of
    every thread of that process."""
    try:
        sample = None
        if glance and start_ticks:
            first = probe.glance(pid)
            if first is None:
                return Observation(Presence.GONE)
            if (first.uids or first.thread_of) and not same_process(first, start_time, uid,
                                                                    start_ticks):
                return Observation(Presence.NOT_OURS, thread_of=first.thread_of)
            sample = first if first.threads else None  # the base's glance is the sample
        sample = sample or probe.sample(pid)
    except ProbeError as err:
        return Observation(Presence.UNKNOWN, error=err)
    if sample is None:
        return Observation(Presence.GONE)
    if not same_process(sample, start_time, uid, start_ticks):
        # Nothing of another process is handed on; only that the pid names a thread.
        return Observation(Presence.NOT_OURS, thread_of=sample.thread_of)
    return Observation(Presence.LIVE, sample)


def observe(rec: Record, probe: Probe, glance: bool = False) -> Observation:
    """The record's process, and whether its record still speaks: CLOSED when the
    process is its own but the record is no longer open (its words are frozen).
    `glance`: see `identify`."""
    found = identify(probe, rec.pid, rec.start_time, rec.uid, rec.start_ticks, glance)
    if found.seen is Presence.LIVE and rec.status != STATUS_OPEN:
        return Observation(Presence.CLOSED, found.sample)
    return found
