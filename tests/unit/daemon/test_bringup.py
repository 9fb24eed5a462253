"""Issue 55, item 2: bring-up waits for a late peer, and says so.

A rank in mx.distributed.init waits for its peers up to the bring-up bound
(`init_deadline`), shown with the ranks not seen yet and for how long; at the bound the
ranks that came are ended, spinning or not, cause `peer_never_joined` naming the ranks
that never came. Pure: the detector and the cause table.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.daemon.test_detector import BASE, NS, ORIGIN
from watchdog import cause
from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.judge.detector import Detector
from watchdog.daemon.judge.sighting import Sighting
from watchdog.daemon.probes import ProcessSample
from watchdog.states import Phase, State
from watchdog.status import RankStatus

DEFAULTS = Rules()  # the defaults: init_deadline 600 s, blocked_deadline 900 s


def at_init(world: int = 3):
    return dataclasses.replace(BASE, phase=Phase.INIT, op="init", world_size=world,
                               wait_since_ns=ORIGIN, collectives=0, waits_completed=0,
                               waits_entered=1)


def judge(times: list[float], spin: float = 0.0, seen: frozenset[int] | None = None,
          where: str = "on this node", world: int = 3):
    d = Detector(DEFAULTS)
    out = []
    for t in times:
        s = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "sleeping",
                          ((1, 0.01 * t), (2, spin * t)))
        out.append(d.observe(at_init(world), s, ORIGIN + round(t * NS),
                             Sighting(present=seen, where=where)))
    return out


@pytest.mark.parametrize("spin", [0.0, 1.0], ids=["quiet (ring's accept)", "spinning"])
def test_incident_5_a_late_peer_at_bring_up_is_waited_for_up_to_the_bound_then_ended(spin):
    """exo fork, incident 5: a runner killed at 69 s while its JACCL side channel waited
    for a late peer. Here: held at 69 s and 120 s (a peer relaunched late), and for the
    whole 600 s bound; past it, ended (a quiet wait too: not at the 900 s blocked bound)."""
    got = judge([0, 1, 69, 120, 299, 300, 599, 600, 601, 602], spin, frozenset({0}))
    assert [v.state for v in got[:5]] == [State.RUNNING] * 5
    assert [v.state for v in got[5:7]] == [State.SUSPECT] * 2
    assert not any(v.act for v in got[:8])
    assert got[7].state == (State.STALLED if spin else State.BLOCKED)
    assert [v.act for v in got[7:]] == [False, True, True]
    assert got[2].awaiting == (1, 2)
    assert got[2].reason == ("at bring-up (mx.distributed.init) for 69.0s, waiting for "
                             "ranks 1, 2 (not seen on this node); bring-up bound 600s")


def test_what_a_rank_at_bring_up_waits_for_as_far_as_it_can_be_known():
    peers = judge([0, 10], seen=frozenset({0, 2}), where="on this node or its peers")[-1]
    assert peers.awaiting == (1,)
    assert "waiting for rank 1 (not seen on this node or its peers)" in peers.reason
    every = judge([0, 10], seen=frozenset({0, 1, 2}))[-1]
    assert every.awaiting == () and "its peers to connect (every rank seen)" in every.reason
    unknown = judge([0, 10], seen=None)[-1]  # no one looked: the count only
    assert unknown.awaiting is None and "waiting for its 2 peers" in unknown.reason


def status(n: int, phase: str, state: str, waited: float | None = None) -> RankStatus:
    return RankStatus(job="j", pid=100 + n, host=f"h{n}", uid=0, rank=n, world_size=4,
                      state=state, phase=phase, busiest_thread_cpu=0.0,
                      seconds_in_wait=waited)


def test_peers_that_never_came_are_the_cause_and_named():
    found = cause.decide([status(0, "init", "blocked", 601.0), status(2, "init", "running")],
                         missing=[1, 3])
    assert found.cause == cause.Cause.PEER_NEVER_JOINED and found.culprit is None
    assert found.summary == ("ranks 1, 3 never joined the group: rank 0 on h0 (pid 100) "
                             "waited for them at bring-up (mx.distributed.init) for 601s")


def test_a_stopped_or_dead_peer_at_bring_up_and_an_unreachable_node_keep_their_causes():
    waiting = status(0, "init", "blocked", 601.0)
    assert cause.decide([waiting, status(1, "init", "stopped")], missing=[2]).cause \
        == cause.Cause.PEER_STOPPED
    assert cause.decide([waiting, status(1, "init", "exited")], missing=[2]).cause \
        == cause.Cause.PEER_DEAD
    assert cause.decide([waiting], missing=[1], unreachable=["h1"]).cause \
        == cause.Cause.NODE_UNREACHABLE
    # Every rank there, none at bring-up: not this cause.
    assert cause.decide([status(0, "wait", "blocked", 601.0)], missing=[1]).cause \
        != cause.Cause.PEER_NEVER_JOINED
