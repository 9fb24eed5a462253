"""A peer's malformed /status drops a rank, never the cluster view: each malformed rank
judged alone, and `cluster status` run as a process with no node answering.
tests/ranks/net/test_cluster_input.py serves the malformed peer over HTTP.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Any

import pytest

from watchdog.cli.look.cluster import render_text
from watchdog.daemon.judge import cluster
from watchdog.status import NodeAnswer


def rank(**fields: Any) -> dict[str, Any]:
    good = {"job": "j", "host": "peer", "pid": 10, "uid": 0, "rank": 1, "world_size": 2,
            "state": "running", "phase": "running", "progress": 5, "computing": True,
            "last_collective": {"number": 3, "op": "all_sum"}, "reason": ""}
    return {**good, **fields}


MALFORMED = [rank(host=["x"]), rank(pid="10"), rank(rank=[1]), rank(world_size={"a": 1}),
             rank(uid=True), rank(last_collective={"number": "3"}), rank(last_collective=[1]),
             rank(state=["hung"]), rank(job=None), "not a rank", rank(computing="yes"),
             rank(progress=1.5)]


@pytest.mark.parametrize("bad", MALFORMED, ids=range(len(MALFORMED)))
def test_each_malformed_rank_is_dropped_and_the_rest_judged(bad):
    local = {"host": "here", "ranks": [rank(host="here", pid=20, rank=0, state="suspect",
                                            phase="wait", computing=False)]}
    typed = cluster.analyze([NodeAnswer.from_json(n) for n in (
        {"peer": "p", "ok": True, "status": {"host": ["h"], "ranks": [bad, rank(pid=11)]}},
        {"peer": "local", "ok": True, "status": local})])
    view = typed.to_json()
    (job,) = view["jobs"]
    assert sorted(r["pid"] for r in job["ranks"]) == [11, 20]
    assert job["state"] == "healthy" and job["missing_ranks"] == []
    assert view["nodes"][0]["host"] is None  # a non-text host is not shown
    render_text(typed)


@pytest.mark.slow
def test_cluster_status_fails_when_no_node_answers():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    out = subprocess.run([sys.executable, "-m", "watchdog.cli", "cluster", "status",
                          f"127.0.0.1:{port}", "--timeout", "2"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 4, (out.stdout, out.stderr)  # 2 is a usage error
    assert "UNREACHABLE" in out.stdout and "no node answered" in out.stderr
