"""A slow peer is not a hang (real ring ranks, the real daemon): while rank 1
computes a long eval, rank 0 spins in the all_sum waiting for it exactly like a
survivor of a frozen peer. The job is left alone; the same shape with rank 1
stopped is ended, and the stopped rank is blamed."""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.ranks import DaemonProc, RingJob, free_ports, torn_down, wait_for

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
        assert torn_down(inc["outcome"]), inc["outcome"]


# -- one rank per node: the peers' view ------------------------------------------------


def _two_nodes(tmp_path, **options):
    """Two daemons, each watching its own record directory, peers of each other."""
    ports = free_ports(2)
    peers = [f"127.0.0.1:{p}" for p in ports]
    daemons = []
    for i, port in enumerate(ports):
        d = DaemonProc(tmp_path / f"node{i}" / "records", tmp_path / f"node{i}" / "state",
                       "--peers", peers[1 - i], listen=f"127.0.0.1:{port}", peer_timeout=2,
                       **options)
        d.record_dir.mkdir(parents=True)
        daemons.append(d.start())
    return daemons


def test_with_peers_a_rank_computing_on_another_node_holds_the_job(tmp_path):
    daemons = _two_nodes(tmp_path, deadline=DEADLINE)
    try:
        with RingJob(tmp_path, [d.record_dir for d in daemons], 2, "slowpeer",
                     args=(str(2.5 * DEADLINE),)) as job:
            job.wait_running(collectives=1)
            wait_for(lambda: "slowpeer:" in job.log(1), 60, what="rank 1 computing")
            held = False
            while any(p.poll() is None for p in job.procs):
                r0 = daemons[0].ranks().get(job.procs[0].pid)
                held = held or bool(r0 and "held: rank 1 on" in r0["reason"])
                time.sleep(0.2)
            assert [p.returncode for p in job.procs] == [0, 0], job.log(0) + job.log(1)
            assert daemons[0].incidents() == [] and daemons[1].incidents() == []
            assert held, "node 0 never held rank 0: the test proved nothing"
    finally:
        for d in daemons:
            d.stop()


def test_with_peers_a_stopped_rank_on_another_node_holds_nothing(tmp_path):
    daemons = _two_nodes(tmp_path, deadline=DEADLINE)
    try:
        with RingJob(tmp_path, [d.record_dir for d in daemons], 2, "slowpeer",
                     args=("600",)) as job:
            job.wait_running(collectives=1)
            wait_for(lambda: "slowpeer:" in job.log(1), 60, what="rank 1 computing")
            job.signal(1, signal.SIGSTOP)
            wait_for(lambda: job.procs[0].poll() is not None, 60, what="rank 0 ended")
            inc = wait_for(daemons[0].incidents, 10, what="node 0's incident")[-1]
            assert inc["cluster"]["culprit"]["rank"] == 1
            assert inc["cluster"]["culprit"]["state"] == "stopped"
            assert inc["cluster"]["computing"] == []
    finally:
        for d in daemons:
            d.stop()
