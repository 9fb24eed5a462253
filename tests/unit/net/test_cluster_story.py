"""`cluster status` tells one story (issue 56): a job whose ranks progressed within their
node's last scan is not suspect, a straggler a daemon names is shown whether the job is
healthy or suspect, this node's daemon down exits 1 with its records sampled here, and
this node's daemon among the peers is told by its address and port, not its host name."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from watchdog import procstat
from watchdog.cli.look.cluster import _answers_here, render_text
from watchdog.daemon.judge import cluster as judge
from watchdog.status import NodeAnswer, NodeStatus, RankStatus, Straggler

REPO = Path(__file__).resolve().parents[3]


def rank(n: int, state: str = "running", phase: str = "wait", **fields: object) -> RankStatus:
    return RankStatus(**{"job": "j", "uid": 0, "rank": n, "world_size": 2, "host": f"h{n}",
                         "pid": 100 + n, "state": state, "phase": phase, "progress": 9,
                         **fields})


def view(*ranks_of_nodes: tuple[RankStatus, ...], interval: float = 1.0,
         stragglers: tuple[Straggler, ...] = ()):
    nodes = [NodeAnswer(f"h{i}:1", True, NodeStatus(host=f"h{i}", interval=interval,
                                                    ranks=ranks, stragglers=stragglers))
             for i, ranks in enumerate(ranks_of_nodes)]
    (job,) = judge.analyze(nodes).jobs
    return job


@pytest.mark.parametrize("since, interval, state", [
    (0.3, 1.0, "healthy"),  # rank 0's wait returned within its node's last scan
    (1.5, 1.0, "suspect"),  # it has waited longer than a scan: the stop is real
    (0.3, 0.25, "suspect"),  # a node scanning every 0.25 s
    (None, 1.0, "suspect"),  # not known: as before
])
def test_a_job_that_progressed_within_the_last_scan_is_not_suspect(since, interval, state):
    job = view((rank(0, seconds_since_progress=since),), (rank(1, "stopped"),),
               interval=interval)
    assert job.state.value == state, job
    assert (job.culprit is None) is (state == "healthy")


def test_a_named_straggler_is_shown_whenever_the_job_is_not_hung():
    named = Straggler(job="j", uid=0, rank=1, host="h1", pid=101, slowdown=1.8,
                      summary="rank 1 on h1 is the straggler: the others wait 44% of each step")
    healthy = view((rank(0),), (rank(1),), stragglers=(named,))
    assert healthy.state.value == "healthy" and healthy.straggler == named
    suspect = view((rank(0, seconds_since_progress=5.0),), (rank(1, "stopped"),),
                   stragglers=(named,))
    assert suspect.state.value == "suspect" and suspect.straggler == named
    assert "straggler: rank 1 on h1" in render_text(judge.analyze([NodeAnswer(
        "h1:1", True, NodeStatus(host="h1", ranks=(rank(0), rank(1)), stragglers=(named,)))]))
    hung = view((rank(0, "stalled"),), (rank(1, "stopped"),), stragglers=(named,))
    assert hung.state.value == "hung" and hung.straggler is None


def test_this_nodes_daemon_is_told_by_its_address_and_port_not_its_host_name():
    here = "127.0.0.1"
    other = NodeAnswer(f"{here}:9001", True, NodeStatus(host="same-name"))
    mine = NodeAnswer(f"{here}:9000", True, NodeStatus(host="same-name"))
    assert not _answers_here([other], f"{here}:9000")  # another daemon of this host
    assert _answers_here([other, mine], f"{here}:9000")
    assert _answers_here([mine], "0.0.0.0:9000")  # listening on every address
    assert not _answers_here([NodeAnswer(f"{here}:9000", False, error="down")], f"{here}:9000")
    assert not _answers_here([mine], None)


@pytest.mark.slow
def test_this_nodes_daemon_down_exits_1_with_its_records_sampled(tmp_path):
    """No daemon publishes in the state directory: `cluster status` says DOWN, shows the
    node's ranks read from its records as `status` does, and exits 1."""
    records = tmp_path / "rec"
    records.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from tests.support.records import SyntheticWriter
        from watchdog.record import OP_CODE
        from watchdog.states import Phase

        writer = SyntheticWriter(
            str(records / f"{child.pid}.rec"), pid=child.pid,
            start_time=psutil.Process(child.pid).create_time(), uid=os.getuid(), host="here",
            job="mine", rank=0, world_size=1, backend="ring", dump_signal=0,
            start_ticks=procstat.read_start_ticks(child.pid))
        since = time.monotonic_ns() - int(5e9)
        writer.begin()
        writer.write_hot(5, 5, 4, 0, Phase.WAIT, OP_CODE["eval"], since, since, since, 0, 0)
        writer.end()
        (tmp_path / "state").mkdir()
        done = subprocess.run(
            [sys.executable, "-m", "watchdog.cli", "cluster", "status", "--dir", str(records),
             "--state-dir", str(tmp_path / "state")], capture_output=True, text=True,
            timeout=60, cwd=REPO,
            env={k: v for k, v in os.environ.items() if not k.startswith("MLX_WATCHDOG")})
    finally:
        child.kill()
        child.wait()
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "this node's daemon: DOWN" in done.stdout
    assert "this node's records: sampled here" in done.stdout
    assert f"job mine of uid {os.getuid()} (1 rank)" in done.stdout, done.stdout
    assert str(child.pid) in done.stdout
