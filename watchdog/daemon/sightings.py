"""What one scan saw of each rank, built in one place (`Sightings.of`) as one frozen
`judge.sighting.Sighting`, from the stack sampler's state (the rank's latest native stack
sample, its sockets' queues and byte counters: probes/stacksampler.py) and the probers'
(its data link, whether our sampler held it), with one freshness rule
(`Sighting.fresh`); and the wedge's member built from it (`member`, judge/wedge.py).

A sample's threads are read once (frames.classify, frames.asleep), not at every scan
(issue 57, item 6): `Sightings` keeps that per rank, until the table forgets the rank.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from watchdog.daemon.config import Live
from watchdog.daemon.judge import frames, gpuwork, wedge
from watchdog.daemon.judge.detector import foreign_tracer
from watchdog.daemon.judge.sighting import TWICE_APART, Sighting, Sockets, fresh
from watchdog.daemon.lifecycle import Key, Rank
from watchdog.daemon.probes import Probe
from watchdog.daemon.probes.stacksampler import Stacks, StackSampler
from watchdog.daemon.sample import ProcessSample
from watchdog.states import STOPPED_STATUSES, FrameKind

log = logging.getLogger(__name__)

# A rank's byte counters read this lately speak for a transfer under way (holds.py):
# a waiting rank with nothing busy has them read every 3 s (QUIET_QUEUES_EVERY).
FLOW_FRESH = 5.0


@dataclass
class _Read:
    """What was read once of a rank's latest sample (each kept with the sample it read)."""

    # Its busy threads as read (frames.classify), with the GPU reading it was read with.
    busy: tuple[Stacks, tuple[bool | None, str], frames.Reading] | None = None
    asleep: tuple[Stacks, frames.Reading] | None = None  # none busy (frames.asleep)
    said: bool = False  # its threads could not be read, and that was logged
    # The first sample of its current wait that read it in its backend's wait, none
    # since reading anything else: (the wait's wait_since_ns, the sample's time).
    waiting: tuple[int, float] | None = None


class Sightings:
    """Builds each rank's `Sighting` at each scan from the stack sampler's state (read
    here, never asked here), reading the settings from the daemon's holder at use."""

    def __init__(self, live: Live, probe: Probe, stacks: StackSampler) -> None:
        self.live, self.probe, self.stacks = live, probe, stacks
        self.read: dict[Key, _Read] = {}

    def forget(self, key: Key) -> None:
        """A rank the table forgot: nothing of it kept here."""
        self.read.pop(key, None)

    def of(self, rank: Rank, sample: ProcessSample, now: float, job: Sighting, *,
           traced: bool, link: str | None) -> Sighting:
        """What the scan saw of the rank at `now` (monotonic seconds), `job` holding what
        it saw of the rank's job (the load, a person's trace, the ranks at bring-up)."""
        read = self.read.setdefault(rank.key, _Read())
        rec = rank.record
        if sample.threads_error and not read.said:
            read.said = True  # said once; its status says it at every scan
            log.warning("job %s rank %s pid %s: %s", rec.job, rec.rank, rec.pid,
                        sample.threads_error)
        found = self.stacks.found.get(rank.key)
        queues = self.stacks.queues.get(rank.key)
        # A transfer under way: bytes moved on a socket open at two reads, read lately.
        flowing = (now - queues.flowed if queues is not None and queues.exact
                   and queues.flowed is not None and now - queues.read_at <= FLOW_FRESH
                   else None)
        sockets = (Sockets(now - queues.since, queues.unread, queues.exact)
                   if queues is not None and queues.queues is not None else None)
        if found is None:
            return replace(job, sockets=sockets and sockets._replace(exact=False),
                           link=link, traced=traced, flowing=flowing)
        age = now - found.at
        recent = fresh(age)  # the one freshness rule (`Sighting.fresh`)
        seen = self._seen(rank, sample, found, read) if recent else None
        asleep = None if found.busy or found.error else self._asleep(rank, found, read)
        # Nothing busy, its fresh sample finds it parked in its backend's wait: a member
        # as a spinning rank is (a quiet wedge), when its stillness is exact (wedge.py).
        parked = (seen is None and asleep is not None and asleep.kind == FrameKind.WAITING
                  and recent and not (rank.verdict is not None and rank.verdict.hot))
        behind = (gpuwork.behind(found.gpu_behind, found.gpu_power,
                                 1000 * self.live.rules.gpu_spin_watts)
                  if recent and found.gpu_behind else "")
        # Exact only on byte counters and two samples of this wait a second apart, both
        # reading it in its backend's wait: no single sample decides the lower floor.
        twice = self._twice(rank, found, read, read.asleep[1] if parked and read.asleep
                            else seen)
        if sockets is not None and not twice:
            sockets = sockets._replace(exact=False)
        return replace(job, age=age, seen=seen, asleep=asleep, behind=behind,
                       sockets=sockets, link=link, traced=traced, parked=parked,
                       flowing=flowing)

    def first_waiting(self, rank: Rank) -> float | None:
        """When the first sample of the rank's current wait that read it in its backend's
        wait was taken (none since reading anything else); None: no such sample."""
        read = self.read.get(rank.key)
        waiting = read.waiting if read is not None else None
        if waiting is None or waiting[0] != rank.record.wait_since_ns:
            return None
        return waiting[1]

    @staticmethod
    def _twice(rank: Rank, found: Stacks, read: _Read, reading: frames.Reading | None) -> bool:
        """Have two samples taken in the rank's current wait, early.TWICE_APART apart or
        more, both read it in its backend's wait (and none between read anything else)?"""
        rec = rank.record
        if reading is None or reading.kind != FrameKind.WAITING \
                or rec.wait_since_ns <= 0 or found.at * 1e9 < rec.wait_since_ns:
            read.waiting = None
            return False
        if read.waiting is None or read.waiting[0] != rec.wait_since_ns:
            read.waiting = (rec.wait_since_ns, found.at)
        return found.at - read.waiting[1] >= TWICE_APART

    def _seen(self, rank: Rank, sample: ProcessSample, found: Stacks,
              read: _Read) -> frames.Reading | None:
        """What the rank's busy threads ran at its fresh sample. None when it was taken
        with no thread busy where the OS names the busy threads (Linux): nothing spins,
        so no wedge (a quiet rank is judged by its asleep frames)."""
        gpu = gpuwork.read(found.gpu_moved, found.gpu_power,
                           1000 * self.live.rules.gpu_spin_watts, found.gpu_share)
        if gpu[0]:  # its GPU works: computing, whatever its threads did (or were read)
            return frames.Reading(FrameKind.COMPUTING, frames.GPU_ADVANCES, gpu=True)
        if sample.native_ids and not found.busy and found.stacks:
            return None
        unknown = self._gpu_unknown(found)
        if found.stacks is None or found.error:
            return frames.Reading(FrameKind.UNKNOWN,
                                  found.error or "no native stack could be read",
                                  gpu_unknown=unknown)
        if read.busy is None or read.busy[0] is not found or read.busy[1] != gpu:
            read.busy = (found, gpu, frames.classify(
                found.stacks, found.busy, rank.record.backend, *gpu, unknown=unknown))
        return read.busy[2]

    def _asleep(self, rank: Rank, found: Stacks, read: _Read) -> frames.Reading | None:
        """What the rank waits in at its latest sample, taken with no thread busy
        (frames.asleep): the quiet hang's frames (detector._quiet)."""
        if read.asleep is None or read.asleep[0] is not found:
            works, flat = gpuwork.read(found.gpu_moved, found.gpu_power,
                                       1000 * self.live.rules.gpu_spin_watts,
                                       found.gpu_share)
            read.asleep = (found, frames.asleep(
                found.stacks, rank.record.backend, works, main=rank.record.pid, flat=flat,
                unknown=self._gpu_unknown(found)))
        return read.asleep[1]

    def _gpu_unknown(self, found: Stacks) -> str:
        """Why the rank's GPU time is unknown where MLX computes on a GPU (macOS); ""
        when it was read both times, or where no GPU time is kept (Linux)."""
        if not self.probe.gpu_clock or found.gpu_moved is not None:
            return ""
        return found.gpu_why or "not read"


def member(rank: Rank, sample: ProcessSample, sighting: Sighting) -> wedge.Member:
    """The rank as its job's wedge reads it (judge/wedge.py), from what the scan saw."""
    rec, sockets = rank.record, sighting.sockets
    return wedge.Member(
        rank=rec.rank, world_size=rec.world_size, phase=rec.phase,
        waiting_since_ns=rec.wait_since_ns, collectives=rec.collectives,
        op=f"{rec.op} ({rec.flight[-1].op if rec.flight else ''})",
        stopped=sample.status in STOPPED_STATUSES or foreign_tracer(sample),
        seen=sighting.asleep if sighting.parked else sighting.seen,
        quiet=sockets.still if sockets is not None else None,
        unread=sockets.unread if sockets is not None else 0, link=sighting.link,
        exact=wedge.exact_reading(sockets is not None and sockets.exact, rec.backend,
                                  sighting.link),
        parked=sighting.parked)
