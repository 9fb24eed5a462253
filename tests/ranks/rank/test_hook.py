"""The hook inside real 3-rank MLX ring jobs on 127.0.0.1: what the records show.

Every job runs in its own temporary directories and is ended by pid (RingJob.stop).
Waits are bounded polls; the machine is small, so jobs are short and at most 3 ranks.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.support.ranks import RingJob, wait_for
from watchdog import record
from watchdog.rank import hook  # noqa: E402
from watchdog.record import Record
from watchdog.states import Phase

pytestmark = pytest.mark.ranks

SIZE = 3


def hostfile_of(job: RingJob) -> Path:
    (path,) = job.workdir.glob(f"hosts-{id(job)}.json")
    return path


def advanced_past(job: RingJob, before: dict[int, Record], by: int = 3) -> dict[int, Record]:
    """Wait until every rank's collectives, completed waits and steps have moved on."""
    def moved() -> dict[int, Record] | None:
        now = job.records()
        if len(now) == SIZE and all(
                now[r].collectives >= before[r].collectives + by
                and now[r].waits_completed >= before[r].waits_completed + by
                and now[r].steps >= before[r].steps + by
                for r in range(SIZE)):
            return now
        return None
    return wait_for(moved, 30, what="counters to advance on every rank")


def logs(job: RingJob) -> str:
    return "\n".join(job.log(r) for r in range(job.size))


def no_wrong_results(job: RingJob) -> None:
    text = logs(job)
    assert "WRONG" not in text, text


def test_counters_advance_and_every_rank_agrees_on_the_job(tmp_path: Path,
                                                           record_dir: Path) -> None:
    with RingJob(tmp_path, record_dir, SIZE, "loop") as job:
        first = job.wait_running()
        later = advanced_past(job, first)
        assert sorted(later) == [0, 1, 2]
        jobs = {r.job for r in later.values()}
        assert len(jobs) == 1, jobs
        assert jobs == {hook.job_id({"MLX_HOSTFILE": str(hostfile_of(job))})}
        for rank, rec in later.items():
            assert rec.pid == job.procs[rank].pid
            assert rec.start_time == psutil.Process(rec.pid).create_time()
            assert (rec.rank, rec.world_size, rec.backend) == (rank, SIZE, "ring")
            assert rec.uid == os.getuid() and rec.status == record.STATUS_OPEN
            assert rec.dump_signal == signal.SIGUSR2
            assert rec.phase in (Phase.RUNNING, Phase.WAIT)
            # Each round: one all_sum; eval + item, two waits; one step.
            assert rec.waits_completed >= 2 * rec.steps
            tail = rec.flight[-3:]
            assert [c.number for c in tail] == list(range(rec.collectives - 2,
                                                          rec.collectives + 1))
            assert {(c.op, c.dtype, c.nbytes) for c in tail} == {("all_sum", "float32", 64)}
            issued = [c.issued_ns for c in rec.flight]
            assert issued == sorted(issued) and issued[-1] <= time.monotonic_ns()
            assert rec.last_progress_ns <= time.monotonic_ns()
        no_wrong_results(job)


def test_every_ring_collective_is_recorded(tmp_path: Path, record_dir: Path) -> None:
    with RingJob(tmp_path, record_dir, SIZE, "allops") as job:
        def done() -> bool:
            for rank, proc in enumerate(job.procs):
                if proc.poll() is not None:
                    raise AssertionError(f"rank {rank} exited ({proc.returncode}):\n"
                                         + job.log(rank))
            return all("allops done" in job.log(r) for r in range(SIZE))
        wait_for(done, 60, what="one round of every collective")
        recs = wait_for(lambda: (lambda r: r if len(r) == SIZE and all(
            x.phase is Phase.IDLE for x in r.values()) else None)(job.records()), 10,
            what="every rank idle")
        common = [("all_sum", 24), ("all_gather", 72), ("all_max", 24), ("all_min", 24)]
        for rank, rec in recs.items():
            p2p = ([("send", 24), ("recv", 24), ("send", 24), ("recv_like", 24)] if rank == 0
                   else [("recv", 24), ("send", 24), ("recv_like", 24), ("send", 24)])
            assert [(c.op, c.nbytes) for c in rec.flight] == common + p2p, rank
            assert {c.dtype for c in rec.flight} == {"float32"}
            assert [c.number for c in rec.flight] == list(range(1, 9))
            assert rec.collectives == 8 and rec.steps == 1
        no_wrong_results(job)


def test_zero_code_activation_instruments_a_rank_that_never_imports_watchdog(
        tmp_path: Path, record_dir: Path) -> None:
    with RingJob(tmp_path, record_dir, SIZE, "zero", env={"MLX_WATCHDOG": "1"}) as job:
        first = job.wait_running()
        later = wait_for(lambda: (lambda r: r if len(r) == SIZE and all(
            r[k].collectives > first[k].collectives + 3 for k in range(SIZE)) else None)(
            job.records()), 30, what="collectives to advance")
        assert len({r.job for r in later.values()}) == 1
        for rank, rec in later.items():
            assert (rec.pid, rec.rank, rec.world_size, rec.backend) == (
                job.procs[rank].pid, rank, SIZE, "ring")
            assert rec.steps == 0  # nobody calls hb.step() in a script that knows nothing
            assert rec.waits_completed > first[rank].waits_completed
        assert "mlx-watchdog:" not in logs(job)  # no warning either


def test_without_mlx_watchdog_a_rank_has_no_record(tmp_path: Path, record_dir: Path) -> None:
    with RingJob(tmp_path, record_dir, SIZE, "zero") as job:
        def up() -> bool:
            for rank, proc in enumerate(job.procs):
                if proc.poll() is not None:
                    raise AssertionError(f"rank {rank} exited ({proc.returncode}):\n"
                                         + job.log(rank))
            return all(f"rank {r} of {SIZE} up" in job.log(r) for r in range(SIZE))
        wait_for(up, 60, what="the ranks to join the ring")
        cpu = [sum(psutil.Process(p).cpu_times()[:2]) for p in job.pids]
        time.sleep(1.0)
        assert all(p.poll() is None for p in job.procs)
        later = [sum(psutil.Process(p).cpu_times()[:2]) for p in job.pids]
        assert all(b > a for a, b in zip(cpu, later, strict=True)), "the ranks are not looping"
        assert os.listdir(record_dir) == []
        no_wrong_results(job)


def test_a_frozen_peer_leaves_the_survivors_in_a_growing_wait(tmp_path: Path,
                                                              record_dir: Path) -> None:
    with RingJob(tmp_path, record_dir, SIZE, "loop") as job:
        running = job.wait_running()
        frozen, survivors = 1, (0, 2)
        job.signal(frozen, signal.SIGSTOP)
        stopped = psutil.Process(job.procs[frozen].pid)
        wait_for(lambda: stopped.status() == psutil.STATUS_STOPPED, 10,
                 what="the rank to be stopped")

        streak: dict[int, Record] = {}
        streak_since = [0.0]

        def stuck() -> dict[int, Record] | None:
            """The survivors in eval with nothing moving, for a second of reads in a row.

            A survivor may still finish the round rank 1 had already fed (late, on a busy
            machine), but no round after it: a second without change is the hang.
            """
            now = job.records()
            same = streak and all(
                r in now and r in streak
                and now[r].phase is Phase.WAIT and now[r].op == "eval"
                and now[r].wait_since_ns == streak[r].wait_since_ns != 0
                and now[r].waits_completed == streak[r].waits_completed
                for r in survivors)
            if not same:
                streak.clear()
                streak.update(now)
                streak_since[0] = time.monotonic()
                return None
            return now if time.monotonic() - streak_since[0] >= 1.0 else None

        first = wait_for(stuck, 30, interval=0.2, what="the survivors to hang in eval")
        time.sleep(1.5)
        later = job.records()
        now_ns = time.monotonic_ns()
        for r in survivors:
            a, b = first[r], later[r]
            assert b.phase is Phase.WAIT and b.op == "eval", b
            assert (b.collectives, b.waits_entered, b.waits_completed, b.steps) == (
                a.collectives, a.waits_entered, a.waits_completed, a.steps), "counters moved"
            assert b.wait_since_ns == a.wait_since_ns
            assert now_ns - b.wait_since_ns >= 1.5e9  # the wait age grows with the clock
            assert b.last_progress_ns == a.last_progress_ns
            assert b.last_progress_ns <= b.wait_since_ns
            assert psutil.Process(b.pid).status() != psutil.STATUS_STOPPED
        assert stopped.status() == psutil.STATUS_STOPPED

        job.signal(frozen, signal.SIGCONT)
        # The stopped rank's own record may be unreadable while it is stopped (stopped
        # inside its seqlock window, it stays odd): compare it with before the stop.
        advanced_past(job, {**running, **{r: later[r] for r in survivors}})
        resumed = job.records()
        for r in survivors:
            assert resumed[r].last_progress_ns > later[r].wait_since_ns
            assert resumed[r].max_wait_ns >= 1.5e9  # the hang shows as the longest wait
        no_wrong_results(job)


def test_a_clean_exit_removes_the_record(tmp_path: Path, record_dir: Path) -> None:
    with RingJob(tmp_path, record_dir, SIZE, "rounds", args=("100",)) as job:
        wait_for(lambda: all(p.poll() is not None for p in job.procs), 60,
                 what="the ranks to finish")
        assert [p.returncode for p in job.procs] == [0] * SIZE, logs(job)
        for rank in range(SIZE):
            assert f"{job.procs[rank].pid}.rec exists=True" in job.log(rank)
        assert os.listdir(record_dir) == []  # record and empty .stacks gone
        no_wrong_results(job)


def test_a_killed_rank_leaves_its_record_behind(tmp_path: Path, record_dir: Path) -> None:
    with RingJob(tmp_path, record_dir, SIZE, "loop") as job:
        job.wait_running()
        victim = job.procs[2]
        job.signal(2, signal.SIGKILL)
        victim.wait(timeout=10)
        assert victim.returncode == -signal.SIGKILL
        rec = record.read_path(str(record_dir / f"{victim.pid}{record.SUFFIX}"))
        assert rec.pid == victim.pid and rec.rank == 2
        assert rec.status == record.STATUS_OPEN and not rec.closed


def test_the_dump_signal_writes_python_stacks_next_to_the_record(tmp_path: Path,
                                                                 record_dir: Path) -> None:
    with RingJob(tmp_path, record_dir, SIZE, "loop") as job:
        recs = job.wait_running()
        rec = recs[1]
        assert rec.dump_signal == signal.SIGUSR2
        stacks = record_dir / f"{rec.pid}.stacks"
        assert stacks.exists() and stacks.stat().st_size == 0
        os.kill(rec.pid, rec.dump_signal)

        def dumped() -> str | None:
            text = stacks.read_text(errors="replace")
            return text if "rank_prog.py" in text else None

        text = wait_for(dumped, 15, what="the stack dump")
        assert "most recent call first" in text
        assert "Thread 0x" in text or "Current thread" in text
        # The dump does not disturb the rank.
        assert job.procs[1].poll() is None
        advanced_past(job, job.records())
        no_wrong_results(job)
