"""The early sample (issue 58): a job whose every rank waits in the same collective has
its sockets' byte counters read at every scan (no stop of a rank); once they stood exactly
still, each rank is sampled in that wait, ahead of its wedge deadline, twice
TWICE_APART apart, so that a wedge is decided from the two at `wedge_floor_exact` (no
single sample decides: daemon/sightings.py counts a rank's stillness exact only then). A
job found healthy so (the wait returned) is not sampled early again for EARLY_HOLD
seconds.

`Early` keeps, per rank, the wait it was sampled early in, and per job, until when it is
not sampled early again; the stack sampler (probes/stacksampler.py) takes the samples.
What the samples read reaches the judge through the rank's sighting (daemon/sightings.py):
two of the same wait a second apart make its stillness exact.
"""

from __future__ import annotations

from collections.abc import Callable

from watchdog.backends import bytes_on_sockets
from watchdog.daemon.config import Live
from watchdog.daemon.judge import wedge
from watchdog.daemon.judge.detector import foreign_tracer
from watchdog.daemon.judge.sighting import TWICE_APART
from watchdog.daemon.lifecycle import JobKey, Key, LiveRanks, Rank
from watchdog.daemon.probes.stacksampler import Identity, StackSampler
from watchdog.states import STOPPED_STATUSES, Phase

# Early samples of one rank in one wait (`Early.track`): a second TWICE_APART after a
# first that read it waiting, another when one read nothing. A job whose sockets stand
# still for another reason (a peer computing) is never sampled more than this ahead of
# its wedge deadline.
EARLY_TRIES = 3
# A job an early sample found healthy (the wait returned) is not sampled early again for
# this long: a job whose every step has a long wait with its sockets still costs one
# early sample per rank in EARLY_HOLD seconds (~0.2% of a rank's time), and a wedge in
# that window is ended at the queue-based floor, as before issue 58.
EARLY_HOLD = 300.0


class Early:
    """Which ranks were sampled early, in which wait and when; which jobs are held from
    it. `track` is called at each scan for a job none of whose ranks is late yet."""

    def __init__(self, live: Live, stacks: StackSampler,
                 first_waiting: Callable[[Rank], float | None]) -> None:
        # `first_waiting`: when the first sample of the rank's current wait that read it
        # in its backend's wait was taken, with none since reading anything else.
        self.live, self.stacks, self.first_waiting = live, stacks, first_waiting
        # Each rank's wait it was sampled early in, and when: a job exactly still
        # is sampled once a wait ahead of its wedge deadline (`track`).
        # (its wait_since_ns, asked at, samples asked in that wait)
        self.early: dict[Key, tuple[int, float, int]] = {}
        self.early_held: dict[JobKey, float] = {}  # until when a job is not sampled early

    def forget(self, key: Key) -> None:
        """A rank the table forgot: nothing of it kept here."""
        self.early.pop(key, None)

    def track(self, members: LiveRanks, now: float) -> set[Key]:
        """A job whose every rank here has waited wedge.TRACK_AFTER in the same collective
        (or a ring neighbour's next): its sockets' byte counters read at every scan (no
        stop of a rank). Exactly still for wedge.EARLY_STILL on every rank: each rank
        sampled in this wait, ahead of its wedge deadline, twice TWICE_APART apart
        (`_again`), and its link probed, so that a wedge is decided from the two at
        `wedge_floor_exact`. A slow link or a long all_sum moving bytes is never still and
        never sampled early; a peer computing while the sockets stand still costs at most
        two samples a wait. The ranks tracked."""
        one = members[0][0].record
        job = (one.uid, one.job)
        for rank, _ in members:
            early = self.early.get(rank.key)
            if early is not None and early[0] != rank.record.wait_since_ns:
                # The wait it was sampled early in returned: a healthy job whose sockets
                # stand still while it works (a peer computing each step) is not
                # sampled early again for EARLY_HOLD seconds.
                del self.early[rank.key]
                self.early_held[job] = now + EARLY_HOLD
        if now < self.early_held.get(job, 0.0):
            return set()
        self.early_held.pop(job, None)
        if one.world_size < 2 or (len(members) < one.world_size
                                  and not self.live.peering.peers):
            return set()
        for rank, sample in members:
            v, rec = rank.verdict, rank.record
            if v is None or rank.escalating or rec.phase != Phase.WAIT \
                    or v.wedge_deadline <= 0 or v.seconds_in_wait < wedge.TRACK_AFTER \
                    or sample.status in STOPPED_STATUSES or foreign_tracer(sample) \
                    or not bytes_on_sockets(rec.backend):
                return set()  # a person's debugger on it: never a sample of ours
        numbers = [r.record.collectives for r, _ in members]
        ops = {(r.record.op, r.record.flight[-1].op if r.record.flight else "")
               for r, _ in members}
        if max(numbers) - min(numbers) > 1 or len(ops) != 1:
            return set()
        still = True
        for rank, _ in members:
            rec = rank.record
            queues = self.stacks.track_queues(rank.key, rec.pid, now, rec.backend)
            still = still and queues.exact and queues.queues is not None \
                and now - queues.since >= wedge.EARLY_STILL
        if still:
            for rank, sample in members:
                rec = rank.record
                tries = self.early[rank.key][2] if self.sampled_early(rank) else 0
                if tries >= EARLY_TRIES or (tries and not self._again(rank, now)):
                    continue
                assert rank.verdict is not None
                busy = rank.verdict.hot if sample.native_ids else ()
                if self.stacks.ask(Identity(rec.pid, rec.start_time, rec.uid,
                                            rec.start_ticks), busy, now, every=TWICE_APART):
                    self.early[rank.key] = (rec.wait_since_ns, now, tries + 1)
        return {rank.key for rank, _ in members}

    def sampled_early(self, rank: Rank) -> bool:
        """Was the rank sampled early in its current wait (`track`)?"""
        early = self.early.get(rank.key)
        return rank.record.wait_since_ns > 0 and early is not None \
            and early[0] == rank.record.wait_since_ns

    def _again(self, rank: Rank, now: float) -> bool:
        """Is the rank sampled early once more in this wait (EARLY_TRIES in all)? When its
        last early sample is in and read nothing (gdb past its time box on a loaded node),
        or read it waiting with no second sample TWICE_APART after a first; never after
        one that read it doing anything else."""
        found = self.stacks.found.get(rank.key)
        if found is None or found.at < self.early[rank.key][1]:
            return False  # the last one asked is not in yet
        if found.stacks is None or bool(found.error) or not found.stacks:
            return True
        first = self.first_waiting(rank)
        return first is not None and found.at - first < TWICE_APART <= now - found.at
