"""A straggler named (real ring ranks, the real daemon): two ranks run a training
step's shape (matmuls and an all_sum in one eval), each pinned to its own core; a
busy process pinned beside rank 1 takes half its core, so the job runs at rank 1's
pace. The daemon names rank 1 within a minute, with the job's slowdown near the one
measured and the run queue as its cause; rank 0 is never named. Nothing is ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.ranks import DaemonProc, RingJob, http_get, scrape, value, wait_for

pytestmark = pytest.mark.ranks

MATMULS = "4"  # a step of ~0.2 s on one core of the CI machine


def pin(pid: int, core: int) -> None:
    """Every thread of `pid` onto `core` (threads made later inherit it)."""
    for t in psutil.Process(pid).threads():
        os.sched_setaffinity(t.id, {core})


def pace(job: RingJob, seconds: float) -> float:
    """Rank 0's collectives per second over `seconds`: the job's pace (in step)."""
    before, began = job.records()[0].collectives, time.monotonic()
    time.sleep(seconds)
    return (job.records()[0].collectives - before) / (time.monotonic() - began)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin to")
def test_a_rank_slowed_by_a_busy_neighbour_is_named_with_its_slowdown_and_cause(
        tmp_path, record_dir, state_dir):
    cores = sorted(os.sched_getaffinity(0))[:2]
    with DaemonProc(record_dir, state_dir, interval=0.5, deadline=30) as daemon, \
            RingJob(tmp_path, record_dir, 2, "work", args=(MATMULS,)) as job:
        job.wait_running(collectives=5)
        pin(job.pids[0], cores[0])
        pin(job.pids[1], cores[1])
        healthy = pace(job, 6.0)
        assert daemon.status()["stragglers"] == []
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            os.sched_setaffinity(hog.pid, {cores[1]})
            slowed_at = time.monotonic()
            slow = pace(job, 6.0)
            named = wait_for(lambda: daemon.status()["stragglers"], 60 - 6,
                             what="rank 1 named the straggler")
            took = time.monotonic() - slowed_at
            slow = (slow + pace(job, 4.0)) / 2
            st = daemon.status()
            named = st["stragglers"]
        finally:
            hog.kill()
            hog.wait()
        assert took <= 60
        assert len(named) == 1, named
        found = named[0]
        true = healthy / slow
        assert found["rank"] == 1 and found["pid"] == job.pids[1], found
        assert abs(found["slowdown"] - true) / true <= 0.2, (found, healthy, slow)
        assert found["score"] <= 0.8, found
        assert "run queue" in found["why"], found
        assert found["summary"].startswith(f"rank 1 on {found['host']} is the straggler: "
                                           "the others wait "), found
        ranks = {r["rank"]: r for r in st["ranks"]}
        assert ranks[0]["pace_score"] == 1.0 and ranks[1]["pace_score"] <= 0.8, ranks
        assert ranks[0]["wait_share"] > ranks[1]["wait_share"] + 0.15, ranks
        assert ranks[1]["run_queue"] >= 0.15, ranks
        # Shown where people look: /metrics and `status`.
        families = scrape(daemon.url())  # type: ignore[attr-defined]
        assert (value(families, "mlx_watchdog_job_slowdown_ratio", mlx_job=found["job"],
                      rank="1") or 0) >= 1.25
        assert (value(families, "mlx_watchdog_rank_pace_score", mlx_job=found["job"],
                      rank="1") or 1) <= 0.8
        shown = subprocess.run(
            [sys.executable, "-m", "watchdog.cli", "status", "--dir", str(record_dir),
             "--state-dir", str(state_dir)], capture_output=True, text=True, timeout=60)
        assert "is the straggler" in shown.stdout, shown.stdout + shown.stderr
        # Reported, never ended.
        assert all(p.poll() is None for p in job.procs)
        assert daemon.incidents() == []
        assert http_get(daemon.url() + "/healthz")[0] == 200  # type: ignore[attr-defined]
