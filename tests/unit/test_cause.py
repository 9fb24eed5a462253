"""The cause of a hung job (watchdog/cause.py), row by row of its decision table, with
the evidence in conflict and a node answering late; and the same decision through the
cluster view (`cluster status`, the daemon's peers' view)."""

from __future__ import annotations

import pytest

from watchdog import cause
from watchdog.cli.look.cluster import render_text
from watchdog.daemon.judge import cluster
from watchdog.status import LastCollective, NodeAnswer, NodeStatus, RankStatus

MIB16 = 16 << 20


def rank(n: int, state: str = "stalled", phase: str = "wait", number: int = 8,
         op: str = "all_sum", cpu: float | None = None, **more: object) -> RankStatus:
    """Rank n on host hN, pid 100+n, its last collective `op #number` of 16 MiB."""
    if cpu is None:
        cpu = 1.0 if state == "stalled" else 0.0
    fields: dict = dict(job="j", pid=100 + n, host=f"h{n}", uid=0, rank=n, world_size=2,
                        state=state, phase=phase, busiest_thread_cpu=cpu,
                        last_collective=LastCollective(number, op, MIB16))
    fields.update(more)
    return RankStatus(**fields)


def test_a_stopped_rank_is_peer_stopped_and_named_first():
    found = cause.decide([rank(0), rank(1, "stopped", "wait", number=7)])
    assert found.cause == cause.Cause.PEER_STOPPED and found.culprit.rank == 1
    assert found.summary == ("rank 1 on h1 (pid 101) is stopped at all_sum #7 (16 MiB); "
                             "rank 0 on h0 (pid 100) waits for it in all_sum #8 (16 MiB)")


def test_a_gone_rank_while_another_waits_is_peer_dead():
    found = cause.decide([rank(0), rank(1, "exited", "running", reason="died (SIGKILL)")])
    assert found.cause == cause.Cause.PEER_DEAD and found.culprit.pid == 101
    assert "rank 1 on h1 (pid 101) is gone (exited: died (SIGKILL))" in found.summary
    assert "rank 0 on h0 (pid 100) waits for it in all_sum #8" in found.summary


def test_a_rank_behind_an_unreachable_node_is_node_unreachable():
    found = cause.decide([rank(0)], missing=[1], unreachable=["10.0.0.2:9753"])
    assert found.cause == cause.Cause.NODE_UNREACHABLE and found.culprit is None
    assert found.summary.startswith("rank 1 is behind unreachable node 10.0.0.2:9753")
    assert "rank 0 on h0 (pid 100) waits in all_sum #8 (16 MiB)" in found.summary


def test_a_rank_behind_a_node_refusing_this_nodes_secret_is_secret_refused():
    """A node that answers unsigned by this node's secret is no unreachable host: its own
    cause, in the words `doctor` is the fix for, in the view and `cluster status`."""
    from watchdog.cause import REFUSED

    found = cause.decide([rank(0)], missing=[1], unreachable=["10.0.0.2:9753"],
                         refused=["10.0.0.2:9753"])
    assert found.cause == cause.Cause.SECRET_REFUSED and found.culprit is None
    assert found.summary.startswith("10.0.0.2:9753 answers but refuses this node's secret "
                                    "(bad signature), so rank 1 behind it is not seen; ")
    nodes = [NodeAnswer("local", True, NodeStatus(host="h0", ranks=(rank(0),))),
             NodeAnswer("10.0.0.2:9753", False, error=REFUSED)]
    view = cluster.analyze(nodes)
    (job,) = view.jobs
    assert job.cause == "secret_refused" and "refuses this node's secret" in job.summary
    assert "10.0.0.2:9753 answers but refuses" in job.culprit.reason
    assert "((" not in job.culprit.reason and "))" not in job.culprit.reason
    shown = render_text(view)
    assert "secret_refused" in shown and "answers but refuses this node's secret" in shown


def test_a_failed_probe_of_the_data_path_with_every_daemon_answering_is_data_link_down():
    down = "down 10.0.0.2:5151 (connect timed out after 1s)"
    found = cause.decide([rank(0, data_link=down), rank(1, data_link=down)])
    assert found.cause == cause.Cause.DATA_LINK_DOWN and found.culprit.rank == 0
    assert "10.0.0.2:5151" in found.summary and "ranks 0, 1 wait in all_sum #8" in found.summary


@pytest.mark.parametrize("peer, doing", [
    (rank(1, "idle", "idle", number=7), "idle"),
    (rank(1, "running", "running", number=7, computing=False), "outside any wait"),
    (rank(1, "running", "running", number=7), "outside any wait"),  # computing unknown
])
def test_a_wait_while_a_peer_is_idle_or_outside_a_wait_is_mismatch(peer, doing):
    found = cause.decide([rank(0, op="recv"), peer])
    assert found.cause == cause.Cause.MISMATCH and found.culprit.rank == 1
    assert found.summary.startswith("rank 0 on h0 (pid 100) waits in recv #8 (16 MiB) while "
                                    "rank 1 on h1 (pid 101) is ")
    assert doing in found.summary


def test_two_ranks_in_different_ops_at_the_same_number_is_mismatch():
    found = cause.decide([rank(0, op="recv"), rank(1, op="all_sum")])
    assert found.cause == cause.Cause.MISMATCH and "different collectives" in found.summary


def test_a_quiet_wait_is_local_blocked_and_the_quiet_rank_is_named_among_spinning_peers():
    assert cause.decide([rank(0, "blocked"), rank(1, "blocked")]).cause == cause.Cause.LOCAL_BLOCKED
    # Quiet past half its deadline, as a peer node's lagging scan may still show it.
    found = cause.decide([rank(0, "stalled"), rank(1, "suspect", cpu=0.02)])
    assert found.cause == cause.Cause.LOCAL_BLOCKED and found.culprit.rank == 1
    # A rank not yet past half its deadline tells nothing by its quiet.
    assert cause.decide([rank(0), rank(1, "running", cpu=0.0)]).cause != cause.Cause.LOCAL_BLOCKED
    found = cause.decide([rank(0, "stalled"), rank(1, "blocked")])
    assert found.cause == cause.Cause.LOCAL_BLOCKED and found.culprit.rank == 1
    assert found.summary == ("rank 1 on h1 (pid 101) waits quietly in all_sum #8 (16 MiB), no "
                             "thread spinning (a wedged GPU or a broken group); rank 0 on h0 "
                             "(pid 100) spins in all_sum #8 (16 MiB) waiting on it")


def test_every_rank_spinning_in_one_collective_with_everything_reachable_is_wedged():
    found = cause.decide([rank(0), rank(1, "suspect", cpu=0.97)])
    assert found.cause == cause.Cause.COLLECTIVE_WEDGED and found.culprit is None
    assert found.summary.startswith("ranks 0, 1 spin in all_sum #8 (16 MiB)")


def test_what_does_not_decide_is_unknown_never_a_guess():
    # A rank no node reports though every node answered: not watched there, perhaps.
    found = cause.decide([rank(0)], missing=[1])
    assert found.cause == cause.Cause.UNKNOWN and "not reported by any node" in found.summary
    # Spinning in different collectives: someone is behind, but why is not known.
    found = cause.decide([rank(0, number=8), rank(1, number=9)])
    assert found.cause == cause.Cause.UNKNOWN and found.culprit.rank == 0
    # A spinning rank whose peers no node was asked about (a daemon without peers).
    assert cause.decide([rank(0)], missing=[1]).cause == cause.Cause.UNKNOWN


@pytest.mark.parametrize("ranks, missing, unreachable, want", [
    # A stopped rank is a fact; an unreachable node only silence.
    ([rank(0), rank(1, "stopped")], [2], ["h2:9753"], cause.Cause.PEER_STOPPED),
    # A stopped rank and a gone one: the stopped one is named (the gone one may be
    # the watchdog's own doing after it).
    ([rank(0), rank(1, "stopped"), rank(2, "killed", "running")], [], [], cause.Cause.PEER_STOPPED),
    # A dead rank and a failed link probe: the death explains the failed connect.
    ([rank(0, data_link="down 1.2.3.4:5 (x)"), rank(1, "exited", "running")], [], [],
     cause.Cause.PEER_DEAD),
    # A node gone and a probe failing toward it: the node, not the link.
    ([rank(0, data_link="down 1.2.3.4:5 (x)")], [1], ["h1:9753"], cause.Cause.NODE_UNREACHABLE),
    # A link down and a quiet rank: the link (the quiet rank may wait on it).
    ([rank(0, "blocked", data_link="down 1.2.3.4:5 (x)"), rank(1)], [], [],
     cause.Cause.DATA_LINK_DOWN),
    # An idle peer and a quiet waiter: the program, not the GPU.
    ([rank(0, "blocked"), rank(1, "idle", "idle")], [], [], cause.Cause.MISMATCH),
    # A probe that could not run (JACCL) is no evidence either way.
    ([rank(0, data_link="not probed: no TCP connection"), rank(1)], [], [],
     cause.Cause.COLLECTIVE_WEDGED),
])
def test_conflicting_evidence(ranks, missing, unreachable, want):
    assert cause.decide(ranks, missing, unreachable).cause == want


def test_a_computing_peer_is_never_a_mismatch():
    found = cause.decide([rank(0), rank(1, "running", "running", computing=True)])
    assert found.cause != cause.Cause.MISMATCH


def node(peer: str, *ranks: RankStatus) -> NodeAnswer:
    return NodeAnswer(peer, True, NodeStatus(host=peer, ranks=ranks))


def down(peer: str) -> NodeAnswer:
    return NodeAnswer(peer, False, error="timed out")


def analyze(nodes: list[NodeAnswer]) -> dict:
    """The cluster view, as `cluster status --json` gives it."""
    return cluster.analyze(nodes).to_json()


def test_the_cluster_view_gives_each_hung_job_its_cause_and_summary():
    typed = cluster.analyze([node("a:1", rank(0)), node("b:1", rank(1, "stopped"))])
    view = typed.to_json()
    job = view["jobs"][0]
    assert job["state"] == "hung" and job["cause"] == cause.Cause.PEER_STOPPED
    assert job["summary"].startswith("rank 1 on h1 (pid 101) is stopped at all_sum #8")
    text = render_text(typed)
    assert "  cause: peer_stopped: rank 1 on h1 (pid 101) is stopped" in text
    healthy = analyze([node("a:1", rank(0, "running", "running"),
                                    rank(1, "running", "running"))])["jobs"][0]
    assert healthy["state"] == "healthy" and healthy["cause"] is None


def test_a_node_answering_late():
    # Within the timeout it did not answer: its rank is behind an unreachable node.
    job = analyze([node("a:1", rank(0)), down("b:1")])["jobs"][0]
    assert job["cause"] == cause.Cause.NODE_UNREACHABLE and "b:1" in job["summary"]
    # A background ask failed, the fresh one answered late: it is reachable, and what
    # it says decides (its rank is stopped), not the old silence.
    job = analyze([down("b:1"), node("a:1", rank(0)),
                           node("b:1", rank(1, "stopped"))])["jobs"][0]
    assert job["cause"] == cause.Cause.PEER_STOPPED, job
    # It answered, but its rank's last word is an older scan's, still running and not
    # known to compute: a rank outside a wait while its peer waits.
    job = analyze([node("a:1", rank(0)),
                           node("b:1", rank(1, "running", "running"))])["jobs"][0]
    assert job["cause"] == cause.Cause.MISMATCH


def test_sizes_are_told_in_units():
    assert [cause.size(n) for n in (16, 2048, 16 << 20, 3 << 30)] == [
        "16 B", "2.0 KiB", "16 MiB", "3.0 GiB"]


def test_every_cause_has_its_runbook_section():
    from pathlib import Path
    doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    for name in cause.CAUSES:
        assert f'<a id="cause-{name}"></a>\n### `{name}`' in doc, name
        assert f"| `{name}` |" in doc, name  # a row of the decision table
