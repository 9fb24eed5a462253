"""A slow peer is not a hang (real ring ranks, the real daemon): while rank 1
computes a long eval, rank 0 spins in the all_sum waiting for it exactly like a
survivor of a frozen peer. The job is left alone; the same shape with rank 1
stopped is ended, and the stopped rank is blamed."""

from __future__ import annotations

import signal
import time

import pytest
from ranks import DaemonProc, RingJob, wait_for

pytestmark = pytest.mark.ranks

DEADLINE = 2.0


def test_a_rank_computing_past_its_peers_deadline_is_not_a_hang(
        tmp_path, record_dir, state_dir):
    compute = 2.5 * DEADLINE
    with DaemonProc(record_dir, state_dir, deadline=DEADLINE) as daemon, \
            RingJob(tmp_path, record_dir, 2, "slowpeer", args=(str(compute),)) as job:
        job.wait_running(collectives=1)
        wait_for(lambda: "slowpeer:" in job.log(1), 60, what="rank 1 computing")
        began = time.monotonic()
        held = False
        while any(p.poll() is None for p in job.procs):
            ranks = daemon.ranks()
            r0 = ranks.get(job.procs[0].pid)
            if r0 and "held" in r0["reason"]:
                held = True
                assert r0["state"] == "suspect", r0
            time.sleep(0.2)
            assert time.monotonic() - began < 120, "the slow round never finished"
        assert [p.returncode for p in job.procs] == [0, 0], job.log(0) + job.log(1)
        assert "slowpeer done 2.0" in job.log(0)
        assert time.monotonic() - began >= DEADLINE  # it did outlast the deadline
        assert daemon.incidents() == []
        assert held, "rank 0 was never seen past its deadline: the test proved nothing"


def test_the_same_shape_with_the_slow_rank_stopped_is_ended(tmp_path, record_dir, state_dir):
    with DaemonProc(record_dir, state_dir, deadline=DEADLINE) as daemon, \
            RingJob(tmp_path, record_dir, 2, "slowpeer", args=("600",)) as job:
        job.wait_running(collectives=1)
        wait_for(lambda: "slowpeer:" in job.log(1), 60, what="rank 1 computing")
        stopped = job.procs[1].pid
        job.signal(1, signal.SIGSTOP)
        wait_for(lambda: all(p.poll() is not None for p in job.procs), 60,
                 what="the job ended")
        inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
        assert inc["verdict"] == "stalled"
        assert inc["culprit"]["pid"] == stopped and inc["culprit"]["state"] == "stopped"
        assert set(inc["outcome"].values()) == {"killed"}
