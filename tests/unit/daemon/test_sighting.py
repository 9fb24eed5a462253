"""What one scan saw of a rank (daemon/sightings.py, judge/sighting.py): one frozen value,
built in one place with one freshness rule, and the wedge's member built from it. Pure: a
stack sampler whose state the test sets, nothing sampled, no process."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.fakes import FakeProbe
from tests.unit.daemon.test_wedge_early import REC
from watchdog.daemon.config import Live, Settings
from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.judge.sighting import FRESH, NOTHING, Sighting, Sockets
from watchdog.daemon.lifecycle import Rank
from watchdog.daemon.probes.stacksampler import Queues, Stacks, StackSampler
from watchdog.daemon.sample import ProcessSample
from watchdog.daemon.sightings import Sightings, member
from watchdog.states import FrameKind, State

MAIN = REC.pid
EVAL = ("pthread_cond_wait", "std::condition_variable::wait",
        "mlx::core::eval_impl(std::vector<mlx::core::array>, bool)", "mlx::core::eval")
RING = ("__GI___poll", "recv", "mlx::core::distributed::ring::SocketThread::worker()",
        "start_thread")
SPINNING = ("recv", "mlx::core::distributed::ring::SocketThread::worker()", "start_thread")
JOB = Sighting(load=2.0, judged_from_ns=5, present=None, where="")


def sighted(found: Stacks | None, now: float, hot: tuple[int, ...] = (),
            queues: Queues | None = None, link: str | None = "up"
            ) -> tuple[Sightings, Rank, ProcessSample, Sighting]:
    stacks = StackSampler(FakeProbe(), lambda *_: None, lambda: now)
    rank = Rank(path="r", record=REC, verdict=Verdict(State.RUNNING, 60.0, 2.0, 2.0, 1.0,
                                                      False, "r", hot=hot))
    if found is not None:
        stacks.found[rank.key] = found
    if queues is not None:
        stacks.queues[rank.key] = queues
    sample = ProcessSample(REC.pid, REC.start_time, REC.uid, "sleeping", ((MAIN, 0.0),),
                           native_ids=True)
    sightings = Sightings(Live(Settings()), FakeProbe(), stacks)
    return sightings, rank, sample, sightings.of(rank, sample, now, JOB, traced=True,
                                                 link=link)


def test_a_rank_parked_at_a_fresh_sample_is_a_wedge_member_its_stale_sample_is_not():
    asleep = Stacks(at=100.0, stacks={MAIN: EVAL, 7: RING}, busy=())
    counted = Queues(queues=((1, 0, 0),), since=95.0, unread=64, counters=((1, 10, 10),))
    sightings, rank, sample, once = sighted(asleep, 100.0 + FRESH, queues=counted)
    # One sample read it parked: not exact yet (no single sample decides the lower floor).
    assert once.parked and once.sockets == Sockets(FRESH + 5.0, 64, False)
    # A second, a second later, reads it parked too: now exact.
    sightings.stacks.found[rank.key] = dataclasses.replace(asleep, at=101.0)
    seen = sightings.of(rank, sample, 100.0 + FRESH, JOB, traced=True, link="up")
    assert seen.fresh and seen.seen is None and seen.parked
    assert seen.asleep is not None and seen.asleep.kind == FrameKind.WAITING
    assert seen.sockets == Sockets(FRESH + 5.0, 64, True)
    # What the job gave it, and what the probers found, ride along unchanged.
    assert (seen.load, seen.judged_from_ns, seen.traced, seen.link) == (2.0, 5, True, "up")
    one = member(rank, sample, seen)
    assert one.parked and one.seen is seen.asleep and one.exact and one.unread == 64
    assert one.quiet == FRESH + 5.0 and not one.stopped
    # A moment older, the same sample no longer speaks for it (the one freshness rule).
    _, rank, sample, stale = sighted(asleep, 100.0 + FRESH + 0.1, queues=counted)
    assert not stale.fresh and not stale.parked and stale.asleep == seen.asleep
    assert member(rank, sample, stale).seen is None
    # On queues alone, or with its ring link not found up, its stillness is not exact.
    queued = dataclasses.replace(counted, counters=None)
    _, rank, sample, seen = sighted(asleep, 101.0, queues=queued)
    assert seen.sockets == Sockets(6.0, 64, False) and not member(rank, sample, seen).exact
    _, rank, sample, seen = sighted(asleep, 101.0, queues=counted, link=None)
    assert not member(rank, sample, seen).exact


def test_a_rank_whose_threads_were_busy_a_scan_ago_is_not_parked():
    asleep = Stacks(at=100.0, stacks={MAIN: EVAL, 7: RING}, busy=())
    _, _, _, seen = sighted(asleep, 101.0, hot=(7,))
    assert not seen.parked and seen.asleep is not None


def test_busy_threads_are_read_once_per_sample_and_forgotten_with_the_rank():
    spinning = Stacks(at=100.0, stacks={MAIN: EVAL, 7: SPINNING}, busy=(7,))
    sightings, rank, sample, first = sighted(spinning, 101.0)
    assert first.seen is not None and first.seen.kind == FrameKind.WAITING
    assert first.asleep is None and not first.parked and first.age == pytest.approx(1.0)
    again = sightings.of(rank, sample, 102.0, JOB, traced=False, link=None)
    assert again.seen is first.seen  # the same reading: not classified again
    sightings.forget(rank.key)
    assert rank.key not in sightings.read


def test_nothing_sampled_is_nothing_seen():
    _, _, _, seen = sighted(None, 100.0)
    assert seen.age is None and not seen.fresh and seen.sockets is None
    assert (seen.seen, seen.asleep, seen.parked, seen.behind, seen.gpu) == \
        (None, None, False, "", "")
    assert not NOTHING.fresh and NOTHING.load == 1.0
