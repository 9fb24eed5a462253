"""The early sample (issue 58, daemon/early.py `Early.track`): a job whose every rank
waits in the same collective has its sockets' byte counters read at every scan; only
once they stood exactly still is each rank sampled, twice a wait, and a job found healthy
so is not sampled early again for EARLY_HOLD. Pure: a probe that hands over counters, a
sampler whose asks are recorded, no process."""

from __future__ import annotations

import dataclasses

from tests.unit.daemon.test_wedge_remote import REC as REMOTE_REC
from watchdog.daemon.clock import Clock
from watchdog.daemon.config import Live, Settings
from watchdog.daemon.counters import Counters
from watchdog.daemon.early import EARLY_HOLD, EARLY_TRIES
from watchdog.daemon.jobs import Jobs
from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.judge.frames import Reading
from watchdog.daemon.judge.sighting import TWICE_APART
from watchdog.daemon.judge.wedge import EARLY_STILL
from watchdog.daemon.lifecycle import Rank
from watchdog.daemon.probes import Probe
from watchdog.daemon.probes.stacksampler import Stacks
from watchdog.daemon.sample import ProcessSample
from watchdog.daemon.sightings import Sightings, _Read
from watchdog.record import Collective
from watchdog.states import FrameKind, State

REC = dataclasses.replace(REMOTE_REC, flight=(Collective(
    number=10, op="all_sum", dtype="float32", nbytes=64, issued_ns=1),))


class Counting(Probe):
    """Each pid's one TCP socket: queues empty, byte counters as the test sets them."""

    native_ids = True

    def __init__(self) -> None:
        self.moved: dict[int, int] = {}

    def socket_queues(self, pid: int) -> tuple[tuple[int, int, int], ...] | None:
        return ((pid, 0, 0),)

    def socket_counters(self, pid: int) -> tuple[tuple[int, int, int], ...] | None:
        return ((pid, self.moved.get(pid, 0), 0),)


def job(wait_since_ns: int = 1, in_wait: float = 2.0, backend: str = "ring"):
    members = []
    for rank in (0, 1):
        rec = dataclasses.replace(REC, pid=4242 + rank, rank=rank, backend=backend,
                                  wait_since_ns=wait_since_ns)
        verdict = Verdict(State.RUNNING, 60.0, in_wait, in_wait, 1.0, False, "r",
                          wedge_deadline=15.0, hot=(7,))
        sample = ProcessSample(rec.pid, rec.start_time, rec.uid, "running", ((7, 1.0),),
                               native_ids=True)
        members.append((Rank(path=f"r{rank}", record=rec, verdict=verdict), sample))
    return members


def jobs_with(probe: Probe) -> tuple[Jobs, list[int]]:
    jobs = Jobs(Live(Settings()), probe, Clock(), "host-a", {}, lambda _: None,
                Counters.zeroed())
    asked: list[int] = []

    def ask(who, busy, now, hold_until=0.0, every=None) -> bool:
        asked.append(who.pid)
        return True
    jobs.stacks.ask = ask  # type: ignore[method-assign]
    return jobs, asked


def test_a_job_moving_bytes_is_never_sampled_early():
    """A slow link or a long all_sum: its counters move at every scan."""
    probe = Counting()
    jobs, asked = jobs_with(probe)
    try:
        for t in range(20):
            for pid in (4242, 4243):
                probe.moved[pid] = t * 1448
            members = job()
            # Tracked (its counters read at every scan), never asked a sample.
            assert jobs.early.track(members, float(t)) == {r.key for r, _ in members}
        assert asked == []
    finally:
        jobs.shutdown()


def test_a_still_job_is_sampled_once_a_wait_then_held_once_the_wait_returns():
    jobs, asked = jobs_with(Counting())
    try:
        for t in range(10):  # counters still from the first read
            jobs.early.track(job(), float(t))
        assert sorted(asked) == [4242, 4243]  # once each, at EARLY_STILL of stillness
        # The wait returned (a peer computing each step): the next long still wait of
        # the job is not sampled early for EARLY_HOLD seconds.
        for t in range(10, 20):
            jobs.early.track(job(wait_since_ns=2), float(t))
        assert sorted(asked) == [4242, 4243]
        later = 10.0 + EARLY_HOLD + EARLY_STILL + 2
        for t in range(4):
            jobs.early.track(job(wait_since_ns=3), later + t)
        assert sorted(asked) == [4242, 4242, 4243, 4243]
    finally:
        jobs.shutdown()


def test_no_early_sample_before_the_wait_is_long_or_where_sockets_carry_no_bytes():
    for members in (job(in_wait=0.2), job(backend="jaccl")):
        jobs, asked = jobs_with(Counting())
        try:
            for t in range(10):
                assert jobs.early.track(members, float(t)) == set()
            assert asked == []
        finally:
            jobs.shutdown()


WAITING = Reading(FrameKind.WAITING, "ring worker in recv")
COMPUTING = Reading(FrameKind.COMPUTING, "sgemm")


def sampled(jobs: Jobs, rank: Rank, at: float, reading: Reading) -> bool:
    """A sample of the rank taken at `at` and read as `reading`: is it now read twice?"""
    found = jobs.stacks.found[rank.key] = Stacks(at=at, stacks={7: ("frame",)}, busy=(7,))
    return Sightings._twice(rank, found, jobs.sightings.read.setdefault(rank.key, _Read()),
                            reading)


def asked_once(jobs: Jobs, asked: list[int]) -> tuple[list, Rank]:
    """A still job tracked 3 s: its rank 0 asked its first early sample, once."""
    members = job(wait_since_ns=1)
    for t in range(3):
        jobs.early.track(members, float(t))
    assert asked.count(4242) == 1
    return members, members[0][0]


def test_no_single_sample_makes_a_still_job_exact_two_a_second_apart_do():
    """The lower floor needs two samples of the wait, TWICE_APART apart, both reading the
    rank in its backend's wait: the second is asked early once the first read it so."""
    jobs, asked = jobs_with(Counting())
    try:
        members, rank = asked_once(jobs, asked)
        assert not sampled(jobs, rank, 2.0, WAITING)  # the first reads it waiting: not yet
        assert jobs.sightings.first_waiting(rank) == 2.0
        jobs.early.track(members, 2.5)  # under TWICE_APART after it: not asked again
        assert asked.count(4242) == 1
        jobs.early.track(members, 2.0 + TWICE_APART)
        assert asked.count(4242) == 2
        assert sampled(jobs, rank, 2.0 + TWICE_APART, WAITING)  # the second: now exact
        jobs.early.track(members, 5.0)  # read twice: no more asks
        assert asked.count(4242) == 2
        # A sample reading anything else in between starts it over.
        assert not sampled(jobs, rank, 6.0, COMPUTING)
        assert not sampled(jobs, rank, 7.0, WAITING)
        # A sample taken before the wait began never counts for it.
        later = job(wait_since_ns=int(8e9))[0][0]
        assert not sampled(jobs, later, 7.5, WAITING)
        assert jobs.sightings.first_waiting(later) is None
    finally:
        jobs.shutdown()


def test_a_first_early_sample_reading_a_rank_computing_asks_no_second():
    jobs, asked = jobs_with(Counting())
    try:
        members, rank = asked_once(jobs, asked)
        assert not sampled(jobs, rank, 2.0, COMPUTING)
        for t in range(3, 3 + 3 * EARLY_TRIES):
            jobs.early.track(members, float(t))
        assert asked.count(4242) == 1
    finally:
        jobs.shutdown()
