"""The auto deadline: learned per kind of wait, per job, shared by the job's ranks
and kept across daemon restarts. Pure (fake samples and times) but for the file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from watchdog.daemon.judge.deadlines import (
    AutoDeadline,
    Learned,
    RankWaits,
    Rules,
    WaitDeadline,
)
from watchdog.daemon.judge.detector import NS, Detector
from watchdog.daemon.probes import ProcessSample
from watchdog.daemon.store import learning
from watchdog.record import Pace, Record
from watchdog.states import Phase, State

ORIGIN = 7_000_000_000_000_000_000
BASE = Record(
    pid=4242, start_time=1.7e9, uid=501, rank=0, world_size=2, dump_signal=0, status=0,
    host="node-a", job="job-1", backend="ring", seq=2, collectives=10, waits_entered=0,
    waits_completed=0, steps=0, phase=Phase.RUNNING, op="", phase_since_ns=ORIGIN,
    wait_since_ns=0, last_progress_ns=ORIGIN, last_wait_ns=0, max_wait_ns=0,
    expect_seconds=0.0, expect_since_ns=0, expect_reason="", flight=(),
)
AUTO = Rules(deadline=None, auto_factor=4.0, auto_floor=6.0, auto_min_waits=3,
             auto_fallback=100.0, confirm=1)
JOB = f"{BASE.uid}:{BASE.job}"


class Rank:
    """One rank fed to a detector: waits of a kind, seen (or not) by a scan."""

    def __init__(self, detector: Detector, **fields) -> None:
        self.detector, self.rec = detector, dataclasses.replace(BASE, **fields)
        self.t = self.cpu = 0.0

    def observe(self, spin: float = 0.0, status: str = "sleeping", learn: bool = True):
        self.cpu += spin
        sample = ProcessSample(self.rec.pid, 1.7e9, 501, status, ((1, 0.0), (2, self.cpu)))
        return self.detector.observe(self.rec, sample, ORIGIN + round(self.t * NS),
                                     learn=learn)

    def wait(self, op: str, seconds: float, seen: bool = True, returns: bool = True, **extra):
        """A wait of `op` lasting `seconds`; a scan sees it mid-way if `seen`."""
        began = ORIGIN + round(self.t * NS)
        fields = {"phase": Phase.WAIT, "op": op, "wait_since_ns": began,
                  "waits_entered": self.rec.waits_entered + 1, **extra}
        self.rec = dataclasses.replace(self.rec, **fields)
        if seen:
            self.t += seconds / 2
            self.observe()
            self.t += seconds / 2
        else:
            self.t += seconds
        if returns:
            self.rec = dataclasses.replace(
                self.rec, phase=Phase.RUNNING, op="", wait_since_ns=0,
                waits_completed=self.rec.waits_completed + 1,
                last_wait_ns=round(seconds * NS), last_progress_ns=ORIGIN + round(self.t * NS),
                expect_seconds=0.0)
        self.t += 0.1
        return self.observe()

    def deadline_of(self, op: str) -> float:
        self.rec = dataclasses.replace(self.rec, phase=Phase.WAIT, op=op,
                                       wait_since_ns=ORIGIN + round(self.t * NS))
        return self.observe().deadline


class PacedRank(Rank):
    """A rank whose record publishes a pace table (v3): every completed wait counts."""

    def __init__(self, detector: Detector, **fields) -> None:
        super().__init__(detector, pace=(), **fields)
        self.table: dict[str, tuple[int, int]] = {}

    def complete(self, op: str, seconds: float, count: int = 1) -> None:
        """`count` waits of `op`, each `seconds` long, all between two scans."""
        waits, longest = self.table.get(op, (0, 0))
        self.table[op] = (waits + count, max(longest, round(seconds * NS)))
        self.rec = dataclasses.replace(
            self.rec, pace=tuple(Pace(o, w, m) for o, (w, m) in self.table.items()),
            waits_completed=self.rec.waits_completed + count)
        self.t += seconds * count


def test_every_completed_wait_teaches_the_pace_not_only_those_a_scan_sees():
    """An idle mlx_lm.server: evals of milliseconds every 0.1 s, never seen in progress.
    With the record's pace table the job has a learned deadline within seconds."""
    detector = Detector(AUTO)
    rank = PacedRank(detector)
    rank.observe()
    for _ in range(5):  # five scans, ten 3 ms evals between each
        rank.complete("eval", 0.003, count=10)
        rank.observe()
    assert detector.auto.learned[JOB]["eval"].count == 50
    assert rank.deadline_of("eval") == AUTO.auto_floor  # 4 x 3 ms is under the floor
    assert rank.deadline_of("item") == AUTO.auto_fallback  # a kind never seen


def test_the_pace_table_learns_the_longest_and_counts_each_wait_once():
    detector = Detector(AUTO)
    rank = PacedRank(detector)
    rank.complete("eval", 4.0)  # a long first step...
    rank.observe()
    for _ in range(3):
        rank.complete("async_eval", 0.01, count=5)  # ...then short ones (eval's kind)
        rank.observe()
        rank.observe()  # a scan with nothing new adds nothing
    assert detector.auto.learned[JOB]["eval"].count == 16
    assert detector.auto.learned[JOB]["eval"].longest == pytest.approx(4.0)
    assert rank.deadline_of("eval") == pytest.approx(16.0)


def test_a_wait_that_spanned_a_stop_counts_but_does_not_stretch_the_pace():
    """A rank paused under a debugger for 10 minutes: the wait it was in lasted 10
    minutes, which is not how long its job's waits take."""
    detector = Detector(AUTO)
    rank = PacedRank(detector)
    rank.complete("eval", 0.5, count=10)
    rank.observe()
    rank.observe(status="stopped")
    rank.complete("eval", 600.0)  # the wait the stop was in ends after SIGCONT
    rank.observe()
    assert detector.auto.learned[JOB]["eval"].count == 11
    assert detector.auto.learned[JOB]["eval"].longest == pytest.approx(0.5)
    rank.observe()  # the record's longest is still the stop's: never learned later either
    assert detector.auto.learned[JOB]["eval"].longest == pytest.approx(0.5)


def test_a_wait_ended_under_a_response_counts_but_does_not_stretch_the_pace():
    """A rank waiting on a frozen peer, its hang acted on: the response's SIGCONT lets
    the peer finish the collective, and the 61 s wait ends before SIGTERM lands. That
    is the hang's length; learned, it made exo's recreated instance wait 4 minutes."""
    detector = Detector(AUTO)
    rank = PacedRank(detector, workload="w1")
    rank.complete("eval", 0.5, count=10)
    rank.observe()
    rank.complete("eval", 61.0)
    rank.observe(learn=False)
    assert detector.auto.learned[JOB]["eval"].count == 11
    workload = f"{BASE.uid}:w:w1:{BASE.world_size}"
    assert detector.auto.learned[workload]["eval"].longest == pytest.approx(0.5)
    rank.observe()  # released (the peer was only slow): the hang's wait is not learned late
    assert detector.auto.learned[JOB]["eval"].longest == pytest.approx(0.5)
    rank.complete("eval", 0.5, count=4)  # the job's own waits count again
    rank.observe()
    assert detector.auto.learned[JOB]["eval"].count == 15


def test_a_wait_seen_under_a_response_is_not_learned_from_an_older_record():
    """The same for a record without a pace table (learned from waits a scan saw)."""
    detector = Detector(AUTO)
    rank = Rank(detector)
    for _ in range(3):
        rank.wait("eval", 0.5)
    rank.rec = dataclasses.replace(rank.rec, phase=Phase.WAIT, op="eval",
                                   wait_since_ns=ORIGIN + round(rank.t * NS))
    rank.t += 30
    rank.observe()  # seen in progress, then its hang acted on
    rank.t += 31
    rank.observe(learn=False)
    rank.rec = dataclasses.replace(rank.rec, phase=Phase.RUNNING, op="", wait_since_ns=0,
                                   waits_completed=rank.rec.waits_completed + 1,
                                   last_wait_ns=61 * NS)
    rank.observe(learn=False)
    rank.observe()
    assert detector.auto.learned[JOB]["eval"].longest == pytest.approx(0.5)


def test_paced_ranks_of_one_job_learn_together_and_another_owner_apart():
    detector = Detector(AUTO)
    one, two = PacedRank(detector), PacedRank(detector, pid=4243, rank=1)
    stranger = PacedRank(detector, pid=4244, uid=502)
    one.complete("item", 0.2, count=2)
    two.complete("item", 3.0, count=2)
    stranger.complete("item", 50.0, count=10)
    for rank in (one, two, stranger):
        rank.observe()
    assert detector.auto.learned[JOB]["item"].count == 4
    assert detector.auto.learned[JOB]["item"].longest == pytest.approx(3.0)
    assert detector.auto.learned[f"502:{BASE.job}"]["item"].longest == pytest.approx(50.0)


def test_tiny_waits_never_seen_teach_nothing_and_a_long_eval_is_not_judged_at_the_floor():
    """The reported bug: 20 waits of 50 ms, then a CPU-bound eval, acted on at 61 s."""
    rank = Rank(Detector(AUTO))
    for _ in range(50):
        rank.wait("item", 0.05, seen=False)
    assert rank.deadline_of("eval") == 100.0  # the fallback: nothing known of evals
    assert rank.deadline_of("item") == 100.0  # never seen in progress: not learned either


def test_async_eval_and_synchronize_learn_with_eval_but_item_does_not():
    """mlx-lm's generation alternates async_eval and eval: both wait for the graph."""
    rank = Rank(Detector(AUTO))
    for _ in range(3):
        rank.wait("async_eval", 2.0)
    assert rank.deadline_of("eval") == 8.0  # 4 x 2 s, learned from async_eval
    assert rank.deadline_of("synchronize") == 8.0
    assert rank.deadline_of("async_eval") == 8.0
    assert rank.deadline_of("item") == 100.0  # a conversion stays its own kind


def test_each_kind_has_its_own_deadline():
    rank = Rank(Detector(AUTO))
    for _ in range(3):
        rank.wait("item", 0.5)  # a tiny item(), caught in progress by a scan
        rank.wait("eval", 10.0)  # a step
    assert rank.deadline_of("item") == 6.0  # the floor: 4 x 0.5 is less
    assert rank.deadline_of("eval") == 40.0  # 4 x the longest eval


def test_the_exact_duration_comes_from_the_record_when_one_wait_ended():
    rank = Rank(Detector(AUTO))
    for _ in range(3):
        rank.wait("eval", 5.0)  # seen at 2.5 s; the record says 5 s
    assert rank.detector.auto.learned[JOB]["eval"] == Learned(5.0, 3)


def test_a_long_first_step_then_short_ones_keeps_the_long_one():
    rank = Rank(Detector(AUTO))
    rank.wait("eval", 30.0)  # the first step compiles: long
    assert rank.deadline_of("eval") == 100.0  # one sighting: still the fallback
    rank.wait("eval", 1.0)
    rank.wait("eval", 1.0)
    assert rank.deadline_of("eval") == 120.0  # a prefill as long as the first step holds


def test_what_one_rank_learned_holds_for_its_job_and_owner_only():
    detector = Detector(AUTO)
    teacher = Rank(detector)
    for _ in range(3):
        teacher.wait("eval", 10.0)
    peer = Rank(detector, pid=4243, rank=1)
    assert peer.deadline_of("eval") == 40.0
    other_job = Rank(detector, pid=4244, job="job-2")
    assert other_job.deadline_of("eval") == 100.0
    other_user = Rank(detector, pid=4245, uid=502)  # same job name, another owner
    assert other_user.deadline_of("eval") == 100.0


@pytest.mark.parametrize("extra", [
    pytest.param({"expect_seconds": 500.0}, id="inside expect()"),
    pytest.param({"phase": Phase.INIT}, id="mx.distributed.init"),
    pytest.param({"phase": Phase.IDLE}, id="inside idle()"),
])
def test_waits_that_are_not_the_jobs_pace_are_not_learned(extra):
    rank = Rank(Detector(AUTO))
    for _ in range(3):
        rank.wait("eval", 50.0, **extra)
    assert JOB not in rank.detector.auto.learned


def test_a_wait_that_never_returned_teaches_nothing():
    detector = Detector(AUTO)
    rank = Rank(detector)
    rank.wait("eval", 80.0, returns=False)  # the hang itself, then the rank is gone
    rank.rec = dataclasses.replace(rank.rec, phase=Phase.RUNNING, wait_since_ns=0)
    rank.observe()
    assert JOB not in detector.auto.learned


def test_a_hang_is_still_caught_after_learning():
    rank = Rank(Detector(AUTO))
    for _ in range(3):
        rank.wait("all_sum", 2.0)
    rank.rec = dataclasses.replace(rank.rec, phase=Phase.WAIT, op="all_sum",
                                   wait_since_ns=ORIGIN + round(rank.t * NS))
    states = []
    for _ in range(12):
        rank.t += 1.0
        states.append(rank.observe(spin=1.0))
    assert states[-1].deadline == 8.0
    assert states[-1].state == State.STALLED and states[-1].act


def test_the_backstop_uses_every_kind_together():
    detector = Detector(AUTO)
    rank = Rank(detector)
    rank.wait("eval", 10.0)
    rank.wait("item", 1.0)
    rank.wait("item", 1.0)
    assert detector.auto.known(rank.rec, "native") == Learned(10.0, 3)


def test_the_auto_deadline_learns_and_answers_without_a_detector():
    """The learning is one object (judge/deadlines.AutoDeadline): a wait a scan saw in
    progress is learned when it returns; the deadlines follow, the fallback and cold
    until enough waits of the kind, then factor x the longest over the floor, the wedge's
    under it; a wait that spanned a person's trace is not learned."""
    auto, rank = AutoDeadline(lambda: AUTO), RankWaits()
    for n in range(3):
        waiting = dataclasses.replace(BASE, phase=Phase.WAIT, op="eval", waits_completed=n,
                                      wait_since_ns=ORIGIN + n * 10 * NS)
        if n == 0:
            assert auto.deadline(waiting, True) == WaitDeadline(100.0, 15.0, cold=True)
        auto.learn(waiting, rank, True, False, True, in_wait=1.0)
        returned = dataclasses.replace(BASE, waits_completed=n + 1, last_wait_ns=2 * NS)
        auto.learn(returned, rank, False, False, True, in_wait=0.0)
    assert auto.learned[JOB]["eval"] == Learned(2.0, 3) and auto.changed == {JOB}
    assert auto.deadline(waiting, True) == WaitDeadline(8.0, 8.0, cold=False)
    assert auto.deadline(returned, False).deadline == 8.0  # the backstop: every kind
    auto.learn(waiting, rank, True, False, True, in_wait=1.0)
    traced = dataclasses.replace(BASE, waits_completed=3, last_wait_ns=30 * NS)
    auto.learn(traced, rank, False, False, True, in_wait=0.0, spanned=20.0)
    assert auto.learned[JOB]["eval"] == Learned(2.0, 3)


# -- kept across restarts --------------------------------------------------------


def test_save_and_load_round_trip(tmp_path: Path):
    learned = {JOB: {"eval": Learned(12.5, 40)}}
    learning.save(str(tmp_path), learned, {JOB: 1000.0})
    got, when = learning.load(str(tmp_path), 1000.0 + 60)
    assert got == learned and when == {JOB: 1000.0}


def test_old_jobs_expire_and_the_file_is_bounded(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(learning, "MAX_JOBS", 2)
    learned = {f"1:j{i}": {"eval": Learned(1.0, 1)} for i in range(4)}
    updated = {"1:j0": 0.0, "1:j1": 5e6, "1:j2": 5e6 + 1, "1:j3": 5e6 + 2}
    learning.prune(learned, updated, now=5e6 + 10)
    assert sorted(learned) == ["1:j2", "1:j3"]  # j0 too old, then the oldest past 2


@pytest.mark.parametrize("content", [
    "not json", json.dumps([1]), json.dumps({"version": 9, "jobs": {}}),
    json.dumps({"version": 1, "jobs": {"1:j": {"updated": 1.0, "kinds": {
        "eval": {"longest": -1, "count": 3}, "item": {"longest": "x", "count": 1}}}}}),
])
def test_a_bad_file_is_ignored(tmp_path: Path, content: str):
    (tmp_path / learning.FILE).write_text(content)
    learned, _ = learning.load(str(tmp_path), 2.0)
    assert learned == {}


def test_a_relaunch_under_a_new_job_id_starts_from_what_its_workload_taught():
    """exo recreates an instance with a new id and new ports: its first waits are judged
    by what the last instance of the same program showed, not by the fallback."""
    detector = Detector(AUTO)
    first = PacedRank(detector, job="exo-inst-1", workload="wabc")
    first.complete("eval", 0.4, count=10)
    first.observe()
    assert first.deadline_of("eval") == AUTO.auto_floor
    again = PacedRank(detector, pid=5252, job="exo-inst-2", workload="wabc")
    again.observe()
    assert again.deadline_of("eval") == AUTO.auto_floor  # not AUTO.auto_fallback
    assert again.deadline_of("item") == AUTO.auto_fallback  # a kind it never showed
    # Its own job takes over once it has shown enough: a slower pace of its own counts.
    again.complete("eval", 3.0, count=5)
    again.observe()
    assert again.deadline_of("eval") == pytest.approx(12.0)
    # Another program (another digest) or no digest (an older hook): the fallback.
    other = PacedRank(detector, pid=6262, job="exo-inst-3", workload="wzzz")
    older = PacedRank(detector, pid=6263, job="exo-inst-4")
    for rank in (other, older):
        rank.observe()
        assert rank.deadline_of("eval") == AUTO.auto_fallback


def test_a_workload_learned_by_one_user_never_sets_another_users_deadline():
    """The workload key is its owner's: a user who runs the same program (same digest:
    a record says what it likes) with waits of 0.1 s shrinks nobody else's deadline,
    and one whose waits take 500 s stretches nobody else's."""
    detector = Detector(AUTO)
    shrinker = PacedRank(detector, uid=502, job="a", workload="wsame")
    stretcher = PacedRank(detector, pid=4300, uid=503, job="b", workload="wsame")
    shrinker.complete("eval", 0.1, count=50)
    stretcher.complete("eval", 500.0, count=50)
    for rank in (shrinker, stretcher):
        rank.observe()
    victim = PacedRank(detector, pid=4400, job="c", workload="wsame")
    victim.observe()
    assert victim.deadline_of("eval") == AUTO.auto_fallback
    assert set(detector.auto.learned) >= {"502:w:wsame:2", "503:w:wsame:2"}
    assert not any(key.startswith(f"{BASE.uid}:w:") for key in detector.auto.learned)
