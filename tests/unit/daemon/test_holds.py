"""The hold rule's parts outside the local judgement (test_own_wait.py and
test_detector_backstop.py cover `hold_reason`): the peers' view, the recheck, the bound,
and a transfer under way (`flowing`)."""

from __future__ import annotations

from types import SimpleNamespace

from watchdog.daemon.holds import (
    FLOW_WITHIN,
    HOLD_RECHECK,
    flowing,
    hold_reason,
    past_bound,
    peer_held,
    peer_hold,
    shown_held,
)
from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.lifecycle import Edge, Rank, transition
from watchdog.daemon.probes.stacksampler import StackSampler
from watchdog.record import Record
from watchdog.states import Phase, State
from watchdog.status import PeerView

OURS = SimpleNamespace(ranks=[SimpleNamespace(collectives=7), SimpleNamespace(collectives=None)])
REC = Record(pid=10, start_time=1.7e9, uid=501, rank=0, world_size=2, dump_signal=0,
             status=0, host="h", job="j", backend="ring", seq=0, collectives=7,
             waits_entered=0, waits_completed=0, steps=0, phase=Phase.WAIT, op="all_sum",
             phase_since_ns=0, wait_since_ns=0, last_progress_ns=0, last_wait_ns=0,
             max_wait_ns=0, expect_seconds=0.0, expect_since_ns=0, expect_reason="",
             flight=())


def test_the_peers_view_holds_for_a_rank_computing_or_in_a_wait_of_its_own_not_ahead():
    assert peer_hold(None, OURS) == ""  # type: ignore[arg-type]
    assert peer_hold(PeerView(error="unreachable"), OURS) == ""  # type: ignore[arg-type]
    computing = PeerView.from_json({"computing": [{"rank": 1, "host": "b", "pid": 5}]})
    assert peer_hold(computing, OURS) == (  # type: ignore[arg-type]
        "held: rank 1 on b of the job is computing (a slow peer, not a hang)")
    saving = PeerView.from_json({"holding": [{"rank": 1, "host": "b", "pid": 5,
                                              "what": "saving", "collectives": 7}]})
    assert peer_hold(saving, OURS) == "held: rank 1 on b is saving"  # type: ignore[arg-type]
    ahead = PeerView.from_json({"holding": [{"rank": 1, "host": "b", "pid": 5,
                                             "what": "saving", "collectives": 8}]})
    assert peer_hold(ahead, OURS) == ""  # type: ignore[arg-type]


def test_no_hold_outlasts_the_blocked_deadline_or_the_waits_own_when_longer():
    rules = Rules(blocked_deadline=30.0)

    def waited(seconds: float, deadline: float) -> Verdict:
        return Verdict(State.STALLED, deadline, seconds, seconds, 1.0, True, "in all_sum")

    assert not past_bound(waited(29.9, 5.0), rules)
    assert past_bound(waited(30.0, 5.0), rules)
    assert not past_bound(waited(30.0, 60.0), rules) and past_bound(waited(60.0, 60.0), rules)


def test_a_peer_hold_lasts_its_recheck_and_stays_shown_while_the_peers_are_asked_again():
    stalled = Verdict(State.STALLED, 5.0, 7.0, 7.0, 1.0, True, "in all_sum for 7.0s")
    rank = Rank("/d/10.rec", REC)
    transition(rank, Edge.JUDGED, 1.0, verdict=stalled)
    transition(rank, Edge.ESCALATED, 1.0)
    peer_held([rank], "held: rank 1 on b is saving", 2.0)
    assert rank.held_until == 2.0 + HOLD_RECHECK and not rank.escalating
    assert rank.reason == "in all_sum for 7.0s; held: rank 1 on b is saving"
    transition(rank, Edge.JUDGED, 3.0, verdict=stalled)  # the next scan's verdict
    shown_held(rank, 2.0 + HOLD_RECHECK + 1.0)  # escalated again just after: still shown held
    assert rank.state == State.SUSPECT
    transition(rank, Edge.JUDGED, 4.0, verdict=stalled)
    shown_held(rank, 2.0 + 3 * HOLD_RECHECK)  # long after: the verdict's state stands
    assert rank.state == State.STALLED


def test_a_transfer_on_every_rank_holds_past_the_bound_a_server_s_clients_do_not():
    """Every rank of the job here in a collective's wait with bytes moving on its
    sockets (a 32 MB all_sum over a slow link): held, up to the blocked deadline (a
    rank's other connections may move too). One rank's sockets still (wedged), a rank
    stopped, a reading too old, no counters, or outside a collective's wait: nothing
    held by it."""
    rules = Rules(blocked_deadline=300.0)

    def waiting(seconds: float = 100.0, flowing: float | None = 1.0,
                state: State = State.STALLED, wedge: float = 15.0) -> Verdict:
        return Verdict(state, 60.0, seconds, seconds, 1.0, True, "in all_sum",
                       wedge_deadline=wedge, flowing=flowing)

    both = [(0, waiting()), (1, waiting(flowing=FLOW_WITHIN - 0.5))]
    why = hold_reason(both[0][1], both, rules, 0)
    assert why == "held: bytes move on the sockets of ranks 0, 1 (a long transfer, not a hang)"
    late = [(0, waiting(300.0)), (1, waiting(300.0))]
    assert past_bound(late[0][1], rules) and hold_reason(late[0][1], late, rules, 0) == ""
    for other in (waiting(flowing=None), waiting(flowing=FLOW_WITHIN),
                  waiting(state=State.STOPPED), waiting(wedge=0.0)):
        job = [(0, waiting()), (1, other)]
        assert flowing(job[0][1], job) == "", other
        assert hold_reason(job[0][1], job, rules, 0) == "", other


def test_the_sampler_sees_a_transfer_only_on_a_socket_open_at_two_reads():
    """`Queues.flowed`: bytes grew on a socket seen at the read before; a new socket
    (a client's connection) moving bytes is no transfer of the job's."""
    counters = {"now": ((11, 100, 100),)}

    class Probe:
        def socket_queues(self, pid):
            return ((11, 0, 0),)

        def socket_counters(self, pid):
            return counters["now"]

    sampler = StackSampler(Probe(), lambda fn: None)  # type: ignore[arg-type]
    key = (1, 1.0)
    assert sampler.track_queues(key, 1, 0.0, "ring").flowed is None
    counters["now"] = ((11, 100, 100), (12, 0, 5000))  # a new socket, bytes on it
    assert sampler.track_queues(key, 1, 1.0, "ring").flowed is None
    counters["now"] = ((11, 1548, 100), (12, 0, 5000))  # the old one moves
    assert sampler.track_queues(key, 1, 2.0, "ring").flowed == 2.0
    counters["now"] = ((11, 1548, 100), (12, 0, 5000))  # still: when it last moved stands
    q = sampler.track_queues(key, 1, 3.0, "ring")
    assert q.flowed == 2.0 and q.since == 2.0
