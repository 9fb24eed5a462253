"""Memory pressure as a straggler's cause, on a real rank (issue 47): two ring ranks of
tests/support/rank_prog.py `work` read random pages of their own memory-mapped dataset
each step; rank 1 is squeezed into a memory cgroup smaller than its dataset, so its
pages are read back from storage at every step. The probe's two samples a scan apart
give the judge's interval: rank 1 pages (major faults), is counted at work though it
sleeps on the disk, and its why says memory pressure; rank 0, whose dataset fits, does
not. (Naming it takes the daemon's 30 s window: benchmarks/straggler_causes.py.)"""

from __future__ import annotations

import time

import pytest

from tests.support import squeeze
from tests.support.ranks import RingJob, wait_for
from watchdog.daemon.judge import pacing
from watchdog.daemon.probes.linux import LinuxProbe

pytestmark = [pytest.mark.ranks,
              pytest.mark.skipif(squeeze.where() is None,
                                 reason="needs root and a memory cgroup controller")]


def test_a_rank_whose_dataset_does_not_fit_shows_memory_pressure(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    squeeze.dataset(data, [1, 64])
    probe = LinuxProbe()
    (tmp_path / "records").mkdir()
    with RingJob(tmp_path, tmp_path / "records", 2, "work", args=("2",),
                 env={"MLX_TEST_DATASET": f"{data},256"}) as job:
        job.wait_running(collectives=2)
        with squeeze.Squeeze(job.pids[1], 16 << 20, data / "data-1.bin",
                             f"mlxwd-test-{job.pids[1]}"):
            (data / "go").touch()
            # Warm up first: the healthy rank maps every page of its 1 MiB dataset in
            # its first steps after go (from the page cache, or from storage when the
            # machine had dropped them: major faults of a cold start, not pressure).
            warm = {r: rec.collectives for r, rec in job.records().items()}
            wait_for(lambda: all(rec.collectives >= warm[r] + 8
                                 for r, rec in job.records().items()), 30,
                     what="both ranks stepped through their warm-up")
            began = [(time.monotonic(), probe.sample(pid), job.records()[r].collectives)
                     for r, pid in enumerate(job.pids)]
            wait_for(lambda: time.monotonic() - began[0][0] >= 2.0
                     and all(rec.collectives > began[r][2]
                             for r, rec in job.records().items()), 20,
                     what="both ranks stepped for 2 s")
            ticks = []
            for r, pid in enumerate(job.pids):
                at, before, collectives = began[r]
                now, after = time.monotonic(), probe.sample(pid)
                assert before is not None and after is not None
                ticks.append(pacing.tick(before, after, now - at,
                                             job.records()[r].collectives - collectives,
                                             now))
    fast, slow = ticks
    assert slow.faults is not None and slow.faults / slow.seconds >= pacing.FAULTS_CAUSE
    assert fast.faults is not None and fast.faults / fast.seconds < pacing.FAULTS_CAUSE
    assert slow.active  # asleep on the disk, but not by design
    pace = pacing.summarise([slow])
    assert pace is not None
    cause = pacing.why(pace)
    assert cause.endswith("major faults/s (memory pressure)"), cause
    assert "memory" not in pacing.why(pacing.summarise([fast]) or pace)
