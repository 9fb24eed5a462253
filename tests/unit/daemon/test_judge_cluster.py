"""The cluster judgement (watchdog/daemon/judge/cluster.py): pure, and what the peers'
verdict on a job of ours says holds it (the ranks on the peers, never our own)."""

from __future__ import annotations

import ast
from pathlib import Path

from watchdog.daemon.judge import cluster
from watchdog.status import (
    ComputingRank,
    HoldingRank,
    JobState,
    NodeAnswer,
    NodeStatus,
    RankStatus,
)

JUDGE = Path(cluster.__file__)


def test_the_judgement_imports_no_asking():
    imported = set()
    for node in ast.walk(ast.parse(JUDGE.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not {m for m in imported
                if m.startswith(("watchdog.net", "urllib", "socket", "http", "concurrent"))}


def rank(n: int, host: str, **fields: object) -> RankStatus:
    shown: dict = {"job": "j", "uid": 0, "rank": n, "world_size": 4, "host": host,
                   "pid": 100 + n, "state": "running", "phase": "wait", "collectives": 7}
    return RankStatus(**{**shown, **fields})


def test_the_peers_verdict_names_their_computing_and_holding_ranks_not_ours():
    nodes = [
        NodeAnswer(cluster.LOCAL, True, NodeStatus(host="a", ranks=(
            rank(0, "a", state="stalled", computing=True, holding="saving"),))),
        NodeAnswer("b:1", True, NodeStatus(host="b", ranks=(
            rank(1, "b", computing=True, phase="running"),
            rank(2, "b", holding="writing a checkpoint"),
            rank(3, "b", state="exited", computing=True, holding="x")))),
        NodeAnswer("c:1", False, error="timed out"),
    ]
    (job,) = cluster.analyze(nodes).jobs
    assert job.state is JobState.HUNG  # rank 3 exited while others wait
    verdict = cluster.peer_view(job, ["c:1"])
    assert verdict.computing == (ComputingRank(rank=1, host="b", pid=101),)
    assert verdict.holding == (HoldingRank(rank=2, host="b", pid=102,
                                           what="writing a checkpoint", collectives=7),)
    assert verdict.unreachable == ("c:1",) and verdict.culprit is not None
    assert (verdict.cause, verdict.summary) == (job.cause, job.summary)
    assert verdict.to_json()["culprit"] == job.to_json()["culprit"]
