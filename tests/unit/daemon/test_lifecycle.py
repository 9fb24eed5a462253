"""The rank lifecycle: every edge of `transition`, taken from where the table allows it
and refused from everywhere else, and no other code writing a rank's lifecycle."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import watchdog
from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.lifecycle import ALLOWED, Edge, Rank, transition
from watchdog.record import Record
from watchdog.states import Phase, State

REC = Record(pid=10, start_time=1.7e9, uid=501, rank=0, world_size=2, dump_signal=0,
             status=0, host="h", job="j", backend="ring", seq=0, collectives=0,
             waits_entered=0, waits_completed=0, steps=0, phase=Phase.RUNNING, op="",
             phase_since_ns=0, wait_since_ns=0, last_progress_ns=0, last_wait_ns=0,
             max_wait_ns=0, expect_seconds=0.0, expect_since_ns=0, expect_reason="",
             flight=())
STALLED = Verdict(State.STALLED, 5.0, 7.0, 7.0, 1.0, True, "in all_sum for 7.0s")
LIVE = [State.RUNNING, State.IDLE, State.SUSPECT, State.STALLED, State.BLOCKED, State.STOPPED,
        State.TRACED, State.ABANDONED]


def rank(state: State, escalating: bool = False) -> Rank:
    return Rank("/d/10.rec", REC, state=state, escalating=escalating)


# (edge, from state, escalating) -> (to state, gone_at set, still escalating)
TAKEN = [
    (Edge.JUDGED, State.RUNNING, False, State.STALLED, False, False),
    (Edge.REJUDGED, State.BLOCKED, True, State.BLOCKED, False, True),
    (Edge.ABANDONED, State.STALLED, False, State.ABANDONED, False, False),
    (Edge.HELD, State.STALLED, False, State.SUSPECT, False, False),
    (Edge.ESCALATED, State.STALLED, False, State.STALLED, False, True),
    (Edge.PEER_HELD, State.STALLED, True, State.SUSPECT, False, False),
    (Edge.RELEASED, State.BLOCKED, True, State.BLOCKED, False, False),
    (Edge.RETRIED, State.BLOCKED, True, State.BLOCKED, False, False),
    (Edge.REARMED, State.STALLED, False, State.STALLED, False, False),
    (Edge.EXITED, State.RUNNING, False, State.EXITED, True, False),
    (Edge.EXITED, State.STOPPED, False, State.EXITED, True, False),
    (Edge.KILLED, State.STALLED, True, State.KILLED, True, False),
    (Edge.UNKILLABLE, State.BLOCKED, True, State.UNKILLABLE, False, False),
    (Edge.WENT_LATE, State.UNKILLABLE, False, State.KILLED, True, False),
]


@pytest.mark.parametrize(("edge", "before", "escalating", "after", "gone", "still"), TAKEN,
                         ids=[f"{t[0].value}-from-{t[1].value}" for t in TAKEN])
def test_each_edge_where_it_may_be_taken(edge, before, escalating, after, gone, still):
    r = rank(before, escalating)
    assert transition(r, edge, 100.0, "why", verdict=STALLED)
    assert r.state == after and (r.gone_at == 100.0) == gone and r.escalating == still
    kept = edge in (Edge.ESCALATED, Edge.RELEASED, Edge.RETRIED, Edge.REARMED)  # state stays
    judged = edge in (Edge.JUDGED, Edge.REJUDGED)
    assert r.reason == (STALLED.reason if judged else "" if kept else "why")
    if judged:
        assert r.verdict is STALLED


@pytest.mark.parametrize("edge", list(Edge))
@pytest.mark.parametrize("before", list(State))
@pytest.mark.parametrize("escalating", [False, True])
def test_every_edge_is_refused_where_the_table_says_so(edge, before, escalating):
    r = rank(before, escalating)
    allowed = ALLOWED[edge](r)
    snapshot = dataclasses.replace(r)
    assert transition(r, edge, 100.0, "why", verdict=STALLED) == allowed
    if not allowed:
        assert r == snapshot  # a refused edge changes nothing
    # Final states are final, but for an unkillable rank that went after all.
    if before in (State.KILLED, State.EXITED):
        assert not allowed
    if before == State.UNKILLABLE:
        assert allowed == (edge is Edge.WENT_LATE)
    # The ladder's results only for a rank under escalation; the scan's never.
    if edge in (Edge.KILLED, Edge.UNKILLABLE, Edge.PEER_HELD, Edge.RELEASED, Edge.RETRIED,
                Edge.REJUDGED):
        assert allowed == (escalating and before in LIVE)
    if edge in (Edge.JUDGED, Edge.ABANDONED, Edge.HELD, Edge.EXITED, Edge.ESCALATED,
                Edge.REARMED):
        assert allowed == (not escalating and before in LIVE)


def test_escalated_marks_the_wait_acted_on_and_ends_its_local_hold():
    r = rank(State.STALLED)
    assert transition(r, Edge.HELD, 1.0, "in all_sum; rank 1 computes", note="rank 1 computes")
    assert r.hold_note == "rank 1 computes" and r.state == State.SUSPECT
    assert transition(r, Edge.ESCALATED, 2.0, wait=(7, 3))
    assert r.escalating and r.acted_on == (7, 3) and r.hold_note == ""
    # Escalated without a wait (a fence, a job mate): an earlier mark stays.
    assert transition(r, Edge.RELEASED, 3.0) and r.acted_on == (7, 3)
    assert transition(r, Edge.ESCALATED, 4.0) and r.acted_on == (7, 3)


def test_a_retried_rank_is_judged_afresh_and_a_peer_hold_lasts_until_its_time():
    r = rank(State.STALLED)
    transition(r, Edge.ESCALATED, 1.0, wait=(7, 3))
    assert transition(r, Edge.RETRIED, 2.0)
    assert not r.escalating and r.acted_on is None
    transition(r, Edge.ESCALATED, 3.0, wait=(7, 3))
    assert transition(r, Edge.PEER_HELD, 4.0, "held: rank 1 computes", until=9.0)
    assert (r.state, r.reason, r.held_until, r.held_reason) == (
        State.SUSPECT, "held: rank 1 computes", 9.0, "held: rank 1 computes")
    assert not r.escalating and r.acted_on is None


def test_a_rearmed_rank_forgets_the_wait_only_observed_and_keeps_the_rest():
    r = rank(State.STALLED)
    transition(r, Edge.ESCALATED, 1.0, wait=(7, 3))
    assert transition(r, Edge.RELEASED, 2.0) and r.acted_on == (7, 3)  # observed
    assert transition(r, Edge.REARMED, 3.0)
    assert r.acted_on is None and r.state == State.STALLED and not r.escalating
    transition(r, Edge.ESCALATED, 4.0, wait=(7, 3))
    assert not transition(r, Edge.REARMED, 5.0)  # a response has it: its own to end
    assert r.acted_on == (7, 3)


LIFECYCLE = {"state", "escalating", "gone_at", "acted_on", "held_until", "held_reason",
             "hold_note", "verdict", "reason"}


@pytest.mark.slow
def test_only_transition_writes_a_ranks_lifecycle():
    """Every write of a lifecycle field in the package is in lifecycle.py's `transition`:
    no module sets a flag beside the table."""
    package = Path(watchdog.__file__).parent
    writes = []
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                       else [])
            for target in targets:
                for leaf in ast.walk(target):
                    # Any object's: no other class in the package has these names.
                    if isinstance(leaf, ast.Attribute) and leaf.attr in LIFECYCLE:
                        writes.append((path.name, node.lineno))
    ranks_py = (package / "daemon" / "lifecycle.py").read_text().splitlines()
    start = next(i for i, line in enumerate(ranks_py, 1) if line.startswith("def transition("))
    assert writes, "the scan found no writes at all: it is broken"
    assert all(name == "lifecycle.py" and line > start for name, line in writes), writes
