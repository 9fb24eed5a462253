"""The rank lifecycle: every edge of `transition`, taken from where the table allows it
and refused from everywhere else."""

from __future__ import annotations

import dataclasses

import pytest

from watchdog.daemon.detector import Verdict
from watchdog.daemon.ranks import ALLOWED, Edge, Rank, transition
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
        State.ABANDONED]


def rank(state: State, escalating: bool = False) -> Rank:
    return Rank("/d/10.rec", REC, state=state, escalating=escalating)


# (edge, from state, escalating) -> (to state, gone_at set, still escalating)
TAKEN = [
    (Edge.JUDGED, State.RUNNING, False, State.STALLED, False, False),
    (Edge.ABANDONED, State.STALLED, False, State.ABANDONED, False, False),
    (Edge.HELD, State.STALLED, False, State.SUSPECT, False, False),
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
    assert r.reason == (STALLED.reason if edge is Edge.JUDGED else "why")


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
    if edge in (Edge.KILLED, Edge.UNKILLABLE):
        assert allowed == (escalating and before in LIVE)
    if edge in (Edge.JUDGED, Edge.ABANDONED, Edge.HELD, Edge.EXITED):
        assert allowed == (not escalating and before in LIVE)
