"""A wedged collective (judge/wedge.py) and what the detector does with it and with a
stack sample's verdict (judge/frames.py): pure, no process, no clock."""

from __future__ import annotations

import dataclasses

import pytest

from watchdog.daemon.judge.deadlines import Learned, Rules, wedge_deadline
from watchdog.daemon.judge.detector import NS, Detector
from watchdog.daemon.judge.frames import Reading
from watchdog.daemon.judge.sighting import Sighting
from watchdog.daemon.judge.wedge import QUIET_FOR, Member, Wedge, decide, exact_reading
from watchdog.daemon.probes import ProcessSample
from watchdog.record import Record
from watchdog.states import FrameKind, Phase, State

SPIN = Reading(FrameKind.WAITING, "busy thread 7 spins in SocketThread::worker -> recv")
WORK = Reading(FrameKind.COMPUTING, "busy thread 8 computes in sgemm_")


def member(rank: int, **kw) -> Member:
    base = dict(rank=rank, world_size=2, phase=Phase.WAIT, waiting_since_ns=1,
                collectives=10, op="all_sum", stopped=False, seen=SPIN, quiet=QUIET_FOR + 1,
                unread=0, link="up")
    base.update(kw)
    return Member(**base)  # type: ignore[arg-type]


def test_every_rank_spinning_on_nothing_is_a_wedge_naming_the_rank_that_stopped_reading():
    found = decide([member(0), member(1, unread=64, collectives=9)])
    assert found is not None and found.culprit == 1
    assert "rank 1 leaves 64 B unread" in found.note
    assert "rank 0's busy thread 7 spins in SocketThread::worker -> recv" in found.note


def test_a_wedge_with_no_unread_byte_names_no_rank():
    found = decide([member(0), member(1)])
    assert found is not None and found.culprit is None


@pytest.mark.parametrize("change, why", [
    ({"stopped": True}, "a pause: a rank stopped"),
    ({"seen": WORK}, "a slow peer: a rank computing"),
    ({"seen": Reading(FrameKind.UNKNOWN, "no sampler")}, "no frame read: today's rules"),
    ({"seen": None}, "no fresh sample"),
    ({"quiet": QUIET_FOR - 1}, "bytes moved lately: a slow link"),
    ({"quiet": None}, "sockets unknown"),
    ({"link": "down 10.0.0.2:5000 (econnrefused)"}, "a link blip"),
    ({"phase": Phase.RUNNING, "waiting_since_ns": 0}, "a checkpoint: outside the wait"),
    ({"collectives": 8}, "two collectives apart"),
    ({"op": "all_gather"}, "different ops: a mismatch"),
])
def test_anything_that_explains_the_wait_is_no_wedge(change, why):
    assert decide([member(0), member(1, **change)]) is None, why


def test_a_rank_not_seen_here_is_no_wedge():
    assert decide([member(0)]) is None
    assert decide([member(0, world_size=3), member(1, world_size=3)]) is None
    assert decide([]) is None


def test_the_wedge_deadline_is_the_learned_one_without_its_floor():
    rules = Rules()
    assert wedge_deadline(rules, None) == 15.0
    assert wedge_deadline(rules, Learned(0.01, 500)) == 15.0
    assert wedge_deadline(rules, Learned(10.0, 500)) == 40.0
    assert wedge_deadline(dataclasses.replace(rules, wedge_floor=5.0), Learned(0.5, 50)) == 5.0


PARKED = Reading(FrameKind.WAITING, "main thread waits in array::wait -> futex_wait")


def test_a_wedge_read_from_byte_counters_on_every_rank_is_exact():
    assert decide([member(0, exact=True), member(1, exact=True)]).exact  # type: ignore[union-attr]
    found = decide([member(0, exact=True), member(1)])  # one rank's queues alone
    assert found is not None and not found.exact


def test_a_rank_parked_in_its_wait_is_a_member_only_on_exact_readings():
    """Issue 58: spinning or asleep is not what makes a wedge; on queues alone a parked
    job keeps the quiet hang's rule (its 60 s floor)."""
    parked = [member(0, seen=PARKED, parked=True, exact=True),
              member(1, seen=PARKED, parked=True, exact=True)]
    found = decide(parked)
    assert found is not None and found.exact and "array::wait" in found.note
    assert decide([dataclasses.replace(parked[0], exact=False), parked[1]]) is None
    # Asleep but a peer computing, or one collective too far: no wedge, as spinning.
    assert decide([parked[0], member(1, seen=WORK, exact=True)]) is None
    assert decide([parked[0], dataclasses.replace(parked[1], collectives=12)]) is None


def test_the_lower_floor_needs_the_ring_links_found_up():
    """A 30 s link blip keeps the counters still too: until the probe says up, the
    wedge floor is today's."""
    assert exact_reading(True, "ring", "up")
    assert not exact_reading(True, "ring", None)
    assert not exact_reading(True, "ring", "down 10.0.0.2:5000 (econnrefused)")
    assert not exact_reading(True, "ring", "not probed: timed out")
    assert not exact_reading(False, "ring", "up")
    assert exact_reading(True, "mpi", "not probed: the mpi backend")  # MPI: no probe


def test_an_exact_wedge_deadline_has_the_lower_floor():
    rules = Rules()
    assert wedge_deadline(rules, None, exact=True) == 4.0
    assert wedge_deadline(rules, Learned(10.0, 500), exact=True) == 40.0
    # Never above wedge_floor, whatever the setting says.
    assert wedge_deadline(dataclasses.replace(rules, wedge_floor_exact=30.0), None,
                          exact=True) == 15.0


# -- the detector ---------------------------------------------------------------------

ORIGIN = 7_000_000_000_000_000_000
WAITING_REC = Record(
    pid=4242, start_time=1.7e9, uid=501, rank=0, world_size=2, dump_signal=0, status=0,
    host="node-a", job="job-1", backend="ring", seq=2, collectives=10, waits_entered=10,
    waits_completed=9, steps=0, phase=Phase.WAIT, op="eval", phase_since_ns=ORIGIN,
    wait_since_ns=ORIGIN, last_progress_ns=ORIGIN, last_wait_ns=0, max_wait_ns=0,
    expect_seconds=0.0, expect_since_ns=0, expect_reason="", flight=(),
)


FAST = Learned(0.05, 100)  # the job's evals: 100 seen, the longest 50 ms


def run(seconds: list[float], backend: str = "ring", user: bool = True,
        seen: Reading | None = None, wedge: Wedge | None = None,
        learned: Learned | None = FAST, record: Record = WAITING_REC) -> list:
    """One rank whose thread 2 spins a whole core, in user space (`user`) or the kernel."""
    rules = Rules()
    known = {"501:job-1": {"eval": learned}} if learned else {}
    detector = Detector(rules, known)
    rec = dataclasses.replace(record, backend=backend)
    out = []
    for t in seconds:
        cpu, system = ((2, t),), ((2, 0.0 if user else 0.9 * t),)
        sample = ProcessSample(rec.pid, rec.start_time, rec.uid, "running", cpu, system)
        out.append(detector.observe(rec, sample, ORIGIN + round(t * NS), Sighting(seen=seen),
                                    wedge))
    return out


TICKS = [float(t) for t in range(0, 20)]


def test_a_user_space_spin_on_ring_computes_until_its_stack_says_it_waits():
    assert run(TICKS)[-1].computing  # today's per-backend rule: a slow peer
    assert not run(TICKS, seen=SPIN)[-1].computing


def test_compute_frames_make_a_jaccl_rank_compute():
    assert not run(TICKS, backend="jaccl")[-1].computing  # JACCL polls in user space
    assert run(TICKS, backend="jaccl", seen=WORK)[-1].computing


def test_an_unknown_sample_leaves_the_per_backend_rule():
    unknown = Reading(FrameKind.UNKNOWN, "no native stack sampler installed")
    assert run(TICKS, seen=unknown)[-1].computing
    assert not run(TICKS, backend="jaccl", seen=unknown)[-1].computing
    assert run(TICKS, seen=unknown)[-1].seen == "no native stack sampler installed"


def test_a_wedged_job_is_judged_at_the_wedge_deadline():
    plain = run(TICKS)
    assert plain[-1].deadline == 60.0 and plain[-1].wedge_deadline == 15.0
    assert not any(v.act for v in plain)
    wedged = run(TICKS, seen=SPIN, wedge=Wedge("collective wedged: ...", 1))
    assert wedged[-1].deadline == 15.0
    assert wedged[-1].state == State.STALLED and wedged[-1].act
    assert wedged[-1].wedge is not None and "wedged collective" in wedged[-1].reason
    # Acted on at the second due scan past 15 s, not before.
    assert [t for t, v in zip(TICKS, wedged, strict=True) if v.act][0] == 16.0


def test_an_exact_wedge_is_judged_at_the_lower_floor():
    wedged = run(TICKS, seen=SPIN, wedge=Wedge("collective wedged: ...", 1, exact=True))
    assert wedged[-1].deadline == 4.0 and wedged[-1].wedge_deadline == 4.0
    assert [t for t, v in zip(TICKS, wedged, strict=True) if v.act][0] == 5.0
    # Without a wedge the shown wedge deadline stays today's (no early sampling on it).
    assert run(TICKS, seen=SPIN)[-1].wedge_deadline == 15.0


def test_an_expect_window_has_no_wedge_deadline():
    rec = dataclasses.replace(WAITING_REC, expect_seconds=300.0, expect_since_ns=ORIGIN)
    found = run(TICKS, seen=SPIN, wedge=Wedge("w"), record=rec)
    assert found[-1].deadline == 300.0 and found[-1].wedge_deadline == 0.0
    assert not any(v.act for v in found)


def test_an_interval_the_sampler_held_the_rank_stopped_is_not_counted():
    def last(traced: bool):
        detector = Detector(Rules(), {"501:job-1": {"eval": FAST}})
        cpu, found = 0.0, None
        for t in TICKS:
            held = traced and t >= 10  # gdb held it for most of these intervals
            cpu += 0.1 if held else 1.0
            sample = ProcessSample(4242, 1.7e9, 501, "running", ((2, cpu),), ((2, 0.0),))
            found = detector.observe(WAITING_REC, sample, ORIGIN + round(t * NS),
                                     Sighting(traced=held))
        return found

    assert last(traced=False).busiest_cpu == pytest.approx(1.0)
    assert last(traced=True).busiest_cpu == pytest.approx(1.0)  # the held ones not counted
    untold = Detector(Rules(), {"501:job-1": {"eval": FAST}})
    cpu = 0.0
    for t in TICKS:  # the same held intervals, not said to be held: they read quiet
        cpu += 0.1 if t >= 10 else 1.0
        sample = ProcessSample(4242, 1.7e9, 501, "running", ((2, cpu),), ((2, 0.0),))
        found = untold.observe(WAITING_REC, sample, ORIGIN + round(t * NS))
    assert found.busiest_cpu == pytest.approx(0.1)
