"""The straggler judge (daemon/judge/pacing.py, stragglers.py), pure, on synthetic jobs:
ranks in step, one slowed to half pace, ordinary jitter, mlx_lm.server's roles."""

from __future__ import annotations

import dataclasses
import random

import pytest

from watchdog.daemon.judge import pacing
from watchdog.daemon.judge.pacing import Pace, judge, summary, tick, why
from watchdog.daemon.judge.stragglers import Stragglers
from watchdog.daemon.probes import ProcessSample
from watchdog.record import Record
from watchdog.states import Phase

BASE = Record(
    pid=4242, start_time=1.7e9, uid=501, rank=0, world_size=2, dump_signal=0, status=0,
    host="node-a", job="job-1", backend="ring", seq=2, collectives=0, waits_entered=0,
    waits_completed=0, steps=0, phase=Phase.WAIT, op="eval", phase_since_ns=0,
    wait_since_ns=1, last_progress_ns=0, last_wait_ns=0, max_wait_ns=0,
    expect_seconds=0.0, expect_since_ns=0, expect_reason="", flight=(),
)
COMPUTE, POLL = 11, 12  # thread ids: the stream computing, the one polling its peers
POLL_SYSTEM = 0.7  # the share of a polling thread's CPU in the kernel (ring: 60-85%)


@dataclasses.dataclass
class SimRank:
    """One rank's counters as its process samples would show them."""

    rank: int
    cpu: dict[int, float] = dataclasses.field(default_factory=lambda: {COMPUTE: 0., POLL: 0.})
    system: dict[int, float] = dataclasses.field(
        default_factory=lambda: {COMPUTE: 0., POLL: 0.})
    demand: dict[int, float] = dataclasses.field(
        default_factory=lambda: {COMPUTE: 0., POLL: 0.})
    collectives: int = 0
    faults: int = 0
    idle: bool = False
    phase: Phase = Phase.WAIT  # at the scan: in an eval (working or waiting)
    mac: bool = False  # sampled as macOS gives it: no thread's demand, the process's runnable

    def sample(self) -> ProcessSample:
        if self.mac:
            runnable = sum(self.demand.values()) - sum(self.cpu.values())
            return ProcessSample(1000 + self.rank, 1.7e9, 501, "running",
                                 tuple(self.cpu.items()), tuple(self.system.items()),
                                 major_faults=self.faults, runnable=runnable)
        return ProcessSample(1000 + self.rank, 1.7e9, 501, "running",
                             tuple(self.cpu.items()), tuple(self.system.items()),
                             demand=tuple(self.demand.items()), major_faults=self.faults)

    def record(self) -> Record:
        return dataclasses.replace(BASE, pid=1000 + self.rank, rank=self.rank,
                                   collectives=self.collectives,
                                   phase=Phase.IDLE if self.idle else self.phase)

    def work(self, seconds: float, waiting: float, collectives: int,
             queue: float = 0.0) -> None:
        """`seconds` of which `waiting` polling its peers, the rest computing (and
        `queue` of it waiting for a core)."""
        computing = seconds - waiting
        self.cpu[COMPUTE] += computing - queue
        self.demand[COMPUTE] += computing
        self.cpu[POLL] += waiting
        self.system[POLL] += waiting * POLL_SYSTEM
        self.demand[POLL] += waiting
        self.collectives += collectives


class Job:
    """Ranks of one job fed to a `Stragglers` one scan a second."""

    def __init__(self, size: int, **kw: float) -> None:
        self.ranks = [SimRank(r) for r in range(size)]
        self.judge = Stragglers(**kw)
        self.now = 100.0
        self.scan()

    def scan(self) -> pacing.Scored | None:
        for r in self.ranks:
            self.judge.observe(r.rank, r.record(), r.sample(), self.now)
        _, worst = self.judge.judge_job("job", [r.rank for r in self.ranks], self.now)
        return worst

    def second(self, work: list[float], comm: float = 0.01, per_step: int = 4,
               jitter: float = 0.0, rng: random.Random | None = None,
               queue: list[float] | None = None) -> pacing.Scored | None:
        """One second of a job in step: rank r needs work[r] s a step (jittered), each
        step takes the slowest one's time plus `comm`; the others poll meanwhile."""
        rng = rng or random.Random(0)
        need = [w * (1 + rng.uniform(-jitter, jitter)) for w in work]
        step = max(need) + comm
        steps = 1.0 / step
        for r, n in zip(self.ranks, need, strict=True):
            waiting = (step - n) * steps
            r.work(1.0, waiting, round(per_step * steps),
                   queue=(queue[r.rank] if queue else 0.0))
        self.now += 1.0
        return self.scan()


def run(job: Job, seconds: int, **kw: object) -> list[tuple[float, pacing.Scored | None]]:
    return [(job.now, job.second(**kw)) for _ in range(seconds)]  # type: ignore[arg-type]


def test_in_step_ranks_none_named() -> None:
    job = Job(2)
    rng = random.Random(1)
    named = [w for _, w in run(job, 180, work=[0.1, 0.1], jitter=0.15, rng=rng) if w]
    assert named == []
    scored, _ = job.judge.judge_job("job", [0, 1], job.now)
    assert all(s.score > 0.85 for s in scored)


def test_one_rank_at_half_pace_named_with_its_slowdown() -> None:
    job = Job(2)
    run(job, 10, work=[0.1, 0.1])
    began = job.now
    history = run(job, 60, work=[0.1, 0.2])
    named = [(at, w) for at, w in history if w is not None]
    assert named, "the slow rank was never named"
    at, worst = named[0]
    assert at - began <= 60 and worst.key == 1
    # Its figure once the window holds only the slow minute (at first naming it still
    # averages in the seconds before).
    worst = history[-1][1]
    assert worst is not None and worst.key == 1
    true = (0.2 + 0.01) / (0.1 + 0.01)  # the job's step now, and at the others' pace
    assert abs(worst.slowdown - true) / true <= 0.2
    assert worst.score == pytest.approx(0.5, abs=0.1)
    scored, _ = job.judge.judge_job("job", [0, 1], job.now)
    assert {s.key: s.score for s in scored}[0] == 1.0


def test_four_ranks_one_slow_only_it_named() -> None:
    job = Job(4)
    rng = random.Random(2)
    history = run(job, 60, work=[0.1, 0.1, 0.15, 0.1], jitter=0.05, rng=rng)
    worst = history[-1][1]
    assert worst is not None and worst.key == 2
    assert worst.slowdown == pytest.approx(0.16 / 0.11, rel=0.2)
    scored, _ = job.judge.judge_job("job", [0, 1, 2, 3], job.now)
    assert sorted(s.key for s in scored if s.score < 0.9) == [2]


def test_jitter_with_a_slightly_slower_rank_not_named() -> None:
    """Ordinary imbalance (10% slower, 20% jitter) is no straggler."""
    job = Job(2)
    rng = random.Random(3)
    assert not [w for _, w in run(job, 180, work=[0.1, 0.11], jitter=0.2, rng=rng) if w]


def test_server_roles_rank_zero_reading_requests_not_named() -> None:
    """mlx_lm.server: rank 0 waits for requests outside any collective while the others
    wait in one (polling); then a generation runs in step. The wait for a request is
    not work held back."""
    job = Job(2)
    rng = random.Random(4)
    named = []
    for _ in range(20):
        for _ in range(rng.randint(3, 8)):  # between requests: rank 1 polls, no progress
            job.ranks[1].work(1.0, 1.0, 0)
            job.ranks[0].work(1.0, 0.0, 0, queue=0.0)
            job.ranks[0].cpu[COMPUTE] -= 1.0  # asleep on its socket, not computing
            job.ranks[0].demand[COMPUTE] -= 1.0
            job.now += 1.0
            named.append(job.scan())
        # The request comes mid-interval: part of it rank 1 still waited for it.
        job.ranks[1].work(1.0, 0.6, 10)
        job.ranks[0].work(1.0, 0.05, 10)
        job.now += 1.0
        named.append(job.scan())
        named += [w for _, w in run(job, rng.randint(1, 3), work=[0.012, 0.01],
                                    per_step=40, jitter=0.1, rng=rng)]
    assert [w for w in named if w] == []


def test_server_rank_zero_sharing_nothing_while_it_reads_requests_not_named() -> None:
    """mlx_lm.server at rest: rank 0 shares "nothing" in a tiny all_sum every 0.1 s and
    sleeps on its request queue in between (outside any wait, no CPU), while rank 1
    polls in that all_sum: a steady pace, rank 1 waiting 95% of the time for rank 0.
    Not a straggler: rank 0 sleeps by design."""
    job = Job(2)
    zero, one = job.ranks
    named = []
    for second in range(120):
        generating = second % 40 >= 30  # 10 s of a generation in each 40
        if generating:
            named.append(job.second(work=[0.011, 0.01], per_step=40))
            zero.phase = Phase.WAIT
            continue
        zero.phase = Phase.RUNNING  # asleep on its queue at the scan
        zero.work(0.05, 0.0, 10)  # 50 ms of work a second: sharing "nothing"
        one.work(1.0, 0.95, 10)
        job.now += 1.0
        named.append(job.scan())
    assert [w for w in named if w] == []
    rests = job.judge.pace(0)
    assert rests is not None and rests.active < 0.8  # it slept most of its intervals


def test_a_rank_at_half_pace_outside_waits_but_computing_is_named() -> None:
    """A straggler computing in Python (outside any wait, a core busy) is active."""
    job = Job(2)
    job.ranks[1].phase = Phase.RUNNING
    history = run(job, 60, work=[0.1, 0.2])
    worst = history[-1][1]
    assert worst is not None and worst.key == 1 and worst.pace.active == 1.0


def test_scans_shorter_than_a_step_still_count_its_time() -> None:
    """The bed scans every 0.25 s and a slow step takes 0.6 s: most scans see no new
    collective. A tick lasts until one is issued (at least a second), so the ranks'
    time is counted all the same and the straggler named."""
    job = Job(2)
    step, done = 0.6, 0.0
    named = None
    for _ in range(4 * 60):
        before = int(done)
        done += 0.25 / step
        for r, waiting in zip(job.ranks, (0.5, 0.02), strict=True):
            r.work(0.25, 0.25 * waiting, int(done) - before)
        job.now += 0.25
        named = job.scan()
    assert named is not None and named.key == 1
    assert named.slowdown == pytest.approx(1 / (1 - 0.48), rel=0.05)


def test_idle_intervals_are_not_counted() -> None:
    job = Job(2)
    job.ranks[0].idle = True
    run(job, 60, work=[0.1, 0.2])
    assert job.judge.pace(0) is None
    job.ranks[0].idle = False
    assert [w for _, w in run(job, 15, work=[0.1, 0.2]) if w] == []  # not enough yet


def test_named_straggler_holds_through_a_dip_then_clears() -> None:
    job = Job(2)
    history = run(job, 60, work=[0.1, 0.2])
    assert history[-1][1] is not None
    # A lighter stretch (still over the clear line): still named, no flapping.
    assert all(w is not None for _, w in run(job, 20, work=[0.1, 0.125]))
    # Back in step: cleared once the window forgets the slow minute.
    tail = run(job, 70, work=[0.1, 0.1])
    assert tail[-1][1] is None
    assert all(w is None for _, w in tail[-10:])


def test_a_user_space_spinning_backend_gets_no_figures() -> None:
    """JACCL's wait spins in user space: polling cannot be told from computing."""
    judge = Stragglers()
    r = SimRank(0)
    rec = dataclasses.replace(r.record(), backend="jaccl")
    judge.observe(0, rec, r.sample(), 0.0)
    r.work(1.0, 0.5, 4)
    judge.observe(0, dataclasses.replace(rec, collectives=4), r.sample(), 1.0)
    assert judge.pace(0) is None


def test_tick_counts_kernel_heavy_threads_as_waiting() -> None:
    before = ProcessSample(1, 0.0, 0, "running", ((1, 0.0), (2, 0.0), (3, 0.0)),
                           ((1, 0.0), (2, 0.0), (3, 0.0)),
                           demand=((1, 0.0), (2, 0.0)), major_faults=10)
    after = ProcessSample(1, 0.0, 0, "running", ((1, 0.6), (2, 0.4), (3, 0.01)),
                          ((1, 0.01), (2, 0.3), (3, 0.01)),
                          demand=((1, 0.9), (2, 0.45)), major_faults=60)
    t = tick(before, after, 1.0, 8, at=1.0)
    # Thread 2 only (3 is under the floor), by its demand: it wanted 0.45 of a core,
    # got 0.4 (issue 47: on a busy machine its CPU alone under-reads the waiting).
    assert t.wait == pytest.approx(0.45)
    assert t.queue == pytest.approx(0.3)  # thread 1 wanted 0.9, got 0.6
    assert t.faults == 50 and t.collectives == 8


def test_judge_needs_two_ranks() -> None:
    assert judge([("a", Pace(30.0, 0.1, 10.0, 0.0, None))]) == []


def test_why_and_summary() -> None:
    pace = Pace(30.0, 0.0, 5.0, run_queue=0.45, faults=120.0)
    cause = why(pace, "CPU speed limit 70% (thermal)")
    assert cause == ("run queue 45% (CPU contention); 120 major faults/s (memory pressure); "
                     "CPU speed limit 70% (thermal)")
    assert why(Pace(30.0, 0.0, 5.0, 0.05, 1.0)) == ""
    assert why(Pace(30.0, 0.0, 5.0, 0.0, None, stopped=0.5)) == (
        "stopped 50% of the time (a signal or a debugger)")
    assert summary(2, "mac-3", 0.38, "run queue 45% (CPU contention)") == (
        "rank 2 on mac-3 is the straggler: the others wait 38% of each step for it; "
        "run queue 45% (CPU contention)")


def test_cause_of_a_contended_rank() -> None:
    job = Job(2)
    history = run(job, 60, work=[0.1, 0.2], queue=[0.0, 0.45])
    worst = history[-1][1]
    assert worst is not None and worst.key == 1
    assert worst.pace.run_queue == pytest.approx(0.45, abs=0.02)
    assert "run queue 45%" in why(worst.pace)


def test_tick_on_a_mac_reads_the_run_queue_of_the_process() -> None:
    """macOS keeps no per-thread run-queue time (proc_threadinfo has none): the process's
    ri_runnable_time, shared out by each thread's CPU, gives each thread's demand."""
    before = ProcessSample(1, 0.0, 0, "running", ((1, 0.0), (2, 0.0)), ((1, 0.0), (2, 0.0)),
                           major_faults=3, runnable=10.0)
    after = ProcessSample(1, 0.0, 0, "running", ((1, 0.5), (2, 0.3)), ((1, 0.01), (2, 0.2)),
                          major_faults=3, runnable=10.4)
    t = tick(before, after, 1.0, 8, at=1.0)
    # 0.4 s runnable over 0.8 s run: each thread wanted 1.5 times the CPU it got. Thread 2
    # polls (mostly kernel time): it wanted 0.45 of a core; thread 1 waited 0.25 for one.
    assert t.wait == pytest.approx(0.45) and t.queue == pytest.approx(0.25)
    # Unknown on either side (no libproc, not permitted): the CPU alone, no run queue.
    unknown = tick(dataclasses.replace(before, runnable=None), after, 1.0, 8, at=1.0)
    assert unknown.queue == 0 and unknown.wait == pytest.approx(0.3)


def test_cause_of_a_contended_rank_on_a_mac() -> None:
    job = Job(2)
    for r in job.ranks:
        r.mac = True
    job.scan()  # a fresh sample of the macOS shape on both sides of every tick
    history = run(job, 60, work=[0.1, 0.2], queue=[0.0, 0.45])
    worst = history[-1][1]
    assert worst is not None and worst.key == 1
    # Rank 1's compute thread waited 0.45 s a second for a core; the process's run queue
    # shared by CPU gives it most of that (its poller ran a little too).
    assert 0.35 <= worst.pace.run_queue <= 0.45, worst.pace
    assert "(CPU contention)" in why(worst.pace)
    assert job.judge.pace(0).run_queue == pytest.approx(0.0, abs=0.01)  # type: ignore[union-attr]


def test_forgotten_rank_drops_its_window() -> None:
    job = Job(2)
    run(job, 30, work=[0.1, 0.2])
    job.judge.forget(1)
    assert job.judge.pace(1) is None
    job.judge.forget(1)  # twice is fine


def test_every_rank_shows_its_figures_and_why_it_is_not_judged() -> None:
    """Issue 47: a pace for every live job, and in words why a rank is not judged."""
    job = Job(2)
    run(job, 12, work=[0.1, 0.1])
    early = job.judge.figures[0]
    # Shown before the judgement is ripe, with how much is still missing.
    assert early.pace is not None and early.score is not None and not early.judged
    assert early.unjudged == "too_few_seconds"
    assert early.note is not None and "of 20 s needed" in early.note
    run(job, 20, work=[0.1, 0.1])
    ripe = job.judge.figures[1]
    assert ripe.judged and ripe.note is None and ripe.score is not None


def test_a_loop_that_sleeps_between_steps_shows_its_pace_unjudged() -> None:
    """examples/train.py sleeps every step: its pace is shown, no one can be named."""
    job = Job(2)
    for _ in range(40):
        for r in job.ranks:
            r.phase = Phase.RUNNING  # asleep outside any wait at the scans
            r.work(0.2, 0.02, 2)  # a fifth of a core: asleep the rest
        job.now += 1.0
        assert job.scan() is None
    shown = job.judge.figures[0]
    assert shown.pace is not None and shown.pace.pace == pytest.approx(2.0)
    assert shown.score == pytest.approx(1.0)
    assert shown.unjudged == "sleeps"
    assert shown.note == "not judged: idle between steps 100% of the time"


def test_at_its_start_a_loop_is_not_said_to_sleep_between_steps() -> None:
    """Issue 56: a few seconds in, "idle between steps 100%" was said of any loop."""
    job = Job(2)
    for _ in range(4):
        for r in job.ranks:
            r.phase = Phase.RUNNING
            r.work(0.2, 0.02, 2)
        job.now += 1.0
        job.scan()
    shown = job.judge.figures[0]
    assert shown.unjudged == "too_few_seconds", shown
    assert shown.note is not None and shown.note.startswith("not judged yet: only ")
    assert "idle between steps" not in shown.note


def test_a_single_process_is_not_said_to_poll_in_user_space() -> None:
    judge = Stragglers()
    r = SimRank(0)
    rec = dataclasses.replace(r.record(), backend="single")
    for second in range(3):
        judge.observe(0, dataclasses.replace(rec, collectives=4 * second), r.sample(),
                      float(second))
        judge.judge_job("job", [0], float(second))
    shown = judge.figures[0]
    assert shown.note == "not judged: a single process, no peer to keep pace with", shown


def test_a_user_space_backend_says_why_it_has_no_wait_share() -> None:
    judge = Stragglers()
    r = SimRank(0)
    rec = dataclasses.replace(r.record(), backend="mpi")
    for second in range(3):
        judge.observe(0, dataclasses.replace(rec, collectives=4 * second), r.sample(),
                      float(second))
        judge.judge_job("job", [0, 1], float(second))
    shown = judge.figures[0]
    assert shown.unjudged == "user_space_wait" and shown.pace is None
    assert shown.note is not None and "mpi backend polls in user space" in shown.note


def test_uneven_work_is_named_as_more_work_per_step() -> None:
    job = Job(2)
    worst = [w for _, w in run(job, 60, work=[0.1, 0.2])][-1]
    assert worst is not None and worst.key == 1
    assert why(worst.pace).startswith("more work per step: its core flat out")
    assert "no run queue, no faults" in why(worst.pace)
    # A contended rank is not also called uneven work.
    contended = dataclasses.replace(worst.pace, run_queue=0.4)
    assert "more work" not in why(contended)


def test_the_only_rank_of_its_job_here_is_left_to_the_cluster_view() -> None:
    judge = Stragglers()
    r = SimRank(0)
    for second in range(40):
        r.work(1.0, 0.3, 4)
        judge.observe(0, r.record(), r.sample(), float(second))
        judge.judge_job("job", [0], float(second))
    shown = judge.figures[0]
    assert shown.unjudged == "alone" and shown.score is None
    assert shown.pace is not None and shown.pace.wait_share == pytest.approx(0.3)


def test_a_user_space_backend_shows_its_pace_and_causes_never_a_score() -> None:
    """MPI (JACCL's stand-in): no wait share, so never scored or named; its pace and a
    cause the node sees (here: stopped most of the time) are shown all the same."""
    job = Job(2)
    for r in job.ranks:
        r.record = (lambda rec: lambda: dataclasses.replace(rec(), backend="mpi"))(r.record)
    for second in range(40):
        job.ranks[0].work(1.0, 0.0, 4)
        job.ranks[1].work(0.2, 0.0, 4)
        job.now += 1.0
        stopped = second % 5 != 0
        for r in job.ranks:
            sample = r.sample()
            if r.rank == 1 and stopped:
                sample = dataclasses.replace(sample, status="stopped")
            job.judge.observe(r.rank, r.record(), sample, job.now)
        scored, worst = job.judge.judge_job("job", [0, 1], job.now)
        assert scored == [] and worst is None
    shown = job.judge.figures[1]
    assert shown.unjudged == "user_space_wait" and shown.score is None
    assert shown.pace is not None and not shown.pace.wait_known
    assert shown.pace.pace == pytest.approx(4.0)
    assert why(shown.pace).startswith("stopped 8")  # ~80% of its scans
    assert "more work" not in why(job.judge.figures[0].pace)  # a poller is always flat out


def stopped_in_part(job: Job, seconds: int, step: float, fast_work: float,
                    stopped: float) -> list[pacing.Scored | None]:
    """Rank 1 stopped `stopped` of the time (SIGSTOP in bursts), running otherwise: the
    job's steps take `step` s, of which rank 0 computes `fast_work` and polls the rest;
    rank 1 never waits. Every scan samples rank 1 stopped in that share of them."""
    out, issued, lapsed = [], 0.0, 0.0
    for second in range(seconds):
        issued += 4 / step
        n = int(issued) - int(issued - 4 / step)
        job.ranks[0].work(1.0, 1.0 - fast_work / step, n)
        job.ranks[1].work(1.0 - stopped, 0.0, n)
        job.now += 1.0
        lapsed += stopped
        is_stopped = lapsed >= 1.0
        lapsed -= is_stopped
        for r in job.ranks:
            sample = r.sample()
            if r.rank == 1 and is_stopped:
                sample = dataclasses.replace(sample, status="stopped")
            job.judge.observe(r.rank, r.record(), sample, job.now)
        out.append(job.judge.judge_job("job", [0, 1], job.now)[1])
        del second
    return out


@pytest.mark.parametrize("stopped", [0.5, 0.83])
def test_a_stopped_ranks_slowdown_is_the_jobs_not_the_freed_cores(stopped: float) -> None:
    """Where ranks share cores, a rank stopped most of the time frees one, and its peer
    then computes a step in half the time it took in the healthy job: the wait shares
    alone read the job's loss two-fold (+114% measured at 83% stopped). The job's pace
    before the rank held it back against its pace now is the job's own slowdown."""
    job = Job(2)
    run(job, 40, work=[0.24, 0.24])  # healthy, contended: 0.25 s a step
    healthy_step = 0.24 + 0.01
    step = 0.24 / (1 - stopped)  # rank 1's healthy running time, spread by its stops
    history = stopped_in_part(job, 60, step, fast_work=0.12, stopped=stopped)
    worst = history[-1]
    assert worst is not None and worst.key == 1
    true = step / healthy_step
    assert worst.estimate > 1.5 * true  # the wait shares over-read it...
    assert worst.measured is not None
    assert abs(worst.slowdown - true) / true <= 0.2, (worst.slowdown, true)  # ...not shown
    assert "stopped" in why(worst.pace)


def test_a_stopped_rank_whose_job_keeps_its_healthy_pace_is_not_named() -> None:
    """A rank stopped half the time on a crowded machine, its peer waiting most of each
    step (the wait shares say 4x), while the job runs at its healthy pace all the same
    (the stopped rank gets its core back with priority): it holds no one back."""
    job = Job(2)
    run(job, 90, work=[0.24, 0.24])
    history = stopped_in_part(job, 60, 0.25, fast_work=0.06, stopped=0.5)
    assert all(w is None for w in history)
    scored, _ = job.judge.judge_job("job", [0, 1], job.now)
    slow = {s.key: s for s in scored}[1]
    assert slow.estimate >= 2 * pacing.NAME_SLOWDOWN  # what the shares alone said
    assert job.judge.jobs["job"].named  # held, shown again once the job slows


def test_a_job_slow_from_its_start_keeps_the_wait_shares_estimate() -> None:
    job = Job(2)
    worst = [w for _, w in run(job, 60, work=[0.1, 0.2])][-1]
    assert worst is not None and worst.measured is None
    assert worst.slowdown == worst.estimate
    true = (0.2 + 0.01) / (0.1 + 0.01)
    assert abs(worst.slowdown - true) / true <= 0.2


def test_the_healthy_pace_kept_is_from_before_the_straggler_stood_out() -> None:
    """The pace measured by is a window's that ended before the rank stood out, not one
    the first slow steps already dragged down; and a job gone for good forgets it."""
    job = Job(2)
    run(job, 90, work=[0.24, 0.24])
    step = 0.24 / (1 - 0.5)
    worst = stopped_in_part(job, 60, step, fast_work=0.2, stopped=0.5)[-1]
    assert worst is not None and worst.measured is not None
    true = step / 0.25
    assert abs(worst.measured - true) / true <= 0.05, (worst.measured, true)
    job.judge.forget_jobs([])
    assert job.judge.healthy == {}


def test_a_rank_on_its_core_keeps_the_wait_shares_estimate() -> None:
    """Uneven work (its core flat out, never stopped, no faults) frees no core: its
    estimate is shown, also where the job was seen healthy first."""
    job = Job(2)
    run(job, 90, work=[0.1, 0.1])
    worst = run(job, 60, work=[0.1, 0.2])[-1][1]
    assert worst is not None and worst.measured is None
    assert worst.slowdown == worst.estimate


@pytest.mark.parametrize(("faults", "active"), [(0, False), (10, False), (80, True)])
def test_a_rank_paging_its_memory_back_in_is_at_work(faults: int, active: bool) -> None:
    """Asleep on the disk outside any wait (its memory-mapped data read back: major
    faults), a rank is at work, not asleep by design; a few faults are not enough."""
    before = ProcessSample(1, 0.0, 0, "sleeping", ((1, 0.0),), ((1, 0.0),),
                           demand=((1, 0.0),), major_faults=100)
    after = dataclasses.replace(before, threads=((1, 0.1),), system=((1, 0.05),),
                                demand=((1, 0.1),), major_faults=100 + faults)
    t = tick(before, after, 2.0, 3, at=2.0)
    assert t.active is active
    pace = pacing.summarise([t], strict=False)
    assert pace is not None
    assert ("(memory pressure)" in why(pace)) is active


def test_a_healthy_pace_long_before_is_not_measured_by() -> None:
    """Seen healthy, then slowed a little for minutes (not named), then stopped: the
    healthy pace is too old to measure by, and the wait shares' estimate is shown."""
    job = Job(2)
    run(job, 60, work=[0.24, 0.24])
    run(job, 150, work=[0.24, 0.29])  # 1.2x: clear of health, under a name
    assert "job" not in job.judge.jobs
    worst = stopped_in_part(job, 60, 0.48, fast_work=0.12, stopped=0.5)[-1]
    assert worst is not None and worst.measured is None
    assert worst.slowdown == worst.estimate


def test_a_rank_paging_whose_wait_shares_under_read_it_is_named_by_the_jobs_pace() -> None:
    """A rank paging its memory back in sleeps on the disk and waits on its peer too: the
    wait shares alone say 1.15 (under the 1.25 that names), while the job runs 1.8x
    slower than it did healthy. A rank off its core is named by the larger figure (a
    memory-squeezed rank on a quiet machine was named only at 60 s before, or not at
    all in 90 s)."""
    job = Job(2)
    run(job, 90, work=[0.24, 0.24])
    steps = 1.0 / 0.45  # a step of 0.45 s, from 0.25 s healthy
    named = []
    for _ in range(60):
        fast, paging = job.ranks
        fast.work(0.45 * steps, 0.21 * steps, round(4 * steps))
        paging.work(0.39 * steps, 0.15 * steps, round(4 * steps))  # asleep on the disk the rest
        paging.faults += 200
        job.now += 1.0
        named.append(job.scan())
    scored, _ = job.judge.judge_job("job", [0, 1], job.now)
    assert {s.key: s for s in scored}[1].estimate < pacing.NAME_SLOWDOWN
    first = next(n for n, w in enumerate(named) if w is not None)
    assert first <= 30, first
    worst = named[-1]
    assert worst is not None and worst.key == 1 and "(memory pressure)" in why(worst.pace)
    assert abs(worst.slowdown - 1.8) / 1.8 <= 0.05, worst.slowdown
