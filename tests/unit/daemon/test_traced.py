"""Issue 55, item 1: traced is not stopped.

A rank a person traces (a debugger, a profiler) is `traced`: never acted on, its job
held however long, and judged afresh from the detach; a rank merely SIGSTOPped keeps
today's rule (named the culprit, its job ended at the deadline). The daemon's own stack
sampler is no tracer. Pure: the detector, the hold and the peers' view.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from tests.unit.daemon.test_detector import BASE, NS, ORIGIN, RULES
from watchdog.daemon.holds import hold_reason, peer_hold, peer_traced
from watchdog.daemon.judge.detector import Detector, Verdict, foreign_tracer
from watchdog.daemon.judge.sighting import Sighting
from watchdog.daemon.probes import ProcessSample
from watchdog.states import Phase, State
from watchdog.status import HoldingRank, PeerView


def sample(at: float, status: str = "sleeping", tracer: int | None = 0, name: str = "",
           own: bool | None = None) -> ProcessSample:
    # thread 2 spins a whole core: a survivor polling its frozen peer
    return ProcessSample(BASE.pid, BASE.start_time, BASE.uid, status,
                         ((1, 0.01 * at), (2, 1.0 * at)), tracer=tracer,
                         tracer_name=name, tracer_own=own)


def waiting(wait_at: float = 0.0):
    return dataclasses.replace(BASE, phase=Phase.WAIT, op="all_sum",
                               wait_since_ns=ORIGIN + round(wait_at * NS),
                               waits_entered=BASE.waits_completed + 1)


def at(seconds: float) -> int:
    return ORIGIN + round(seconds * NS)


def test_a_rank_a_person_traces_is_traced_with_its_tracer_and_never_due():
    d = Detector(RULES)
    got = [d.observe(waiting(), sample(t, "tracing-stop", 777, "gdb", False), at(t))
           for t in (0, 5, 11, 60, 3600)]
    assert {v.state for v in got} == {State.TRACED}
    assert not any(v.act for v in got)
    assert got[-1].tracer == 777 and got[-1].tracer_name == "gdb"
    assert "traced by pid 777 (gdb)" in got[-1].reason


def test_a_rank_stopped_without_a_tracer_stays_stopped():
    d = Detector(RULES)
    v = d.observe(waiting(), sample(0, "stopped"), at(0))
    assert v.state == State.STOPPED and v.tracer == 0


def test_the_daemons_own_sampler_is_no_tracer_and_an_unknown_one_is():
    assert not foreign_tracer(sample(0, tracer=0))
    assert not foreign_tracer(sample(0, tracer=55, own=True))
    assert foreign_tracer(sample(0, tracer=55, own=False))
    assert foreign_tracer(sample(0, tracer=55, own=None))  # never the wrong kill
    assert not foreign_tracer(sample(0, tracer=None))  # no reading: no tracer seen


def test_a_survivors_wait_is_judged_from_the_detach():
    """Its peer was under a debugger from 1 s to 150 s: at 155 s its wait (150 s long)
    counts 5 s, suspect only once past half its deadline from the detach, acted on past
    the deadline from the detach, not at once."""
    d = Detector(RULES)
    detach = at(150)
    states = []
    for t in [0, 1, 2, 150, 151, 152, 155, 156, 160.5, 161, 162]:
        v = d.observe(waiting(), sample(t), at(t),
                      Sighting(judged_from_ns=detach if t >= 150 else at(t)))
        states.append((t, v.state, v.act, round(v.seconds_in_wait)))
    assert [s for s in states if s[0] < 155] == [
        (0, State.RUNNING, False, 0), (1, State.RUNNING, False, 0),
        (2, State.RUNNING, False, 0), (150, State.RUNNING, False, 0),
        (151, State.RUNNING, False, 1), (152, State.RUNNING, False, 2)]
    assert states[6][1:3] == (State.SUSPECT, False)  # 5 s after the detach
    # 10.5 s and 11 s after the detach: due, then acted on at the second due tick
    assert [s[1:3] for s in states[-3:-1]] == [(State.STALLED, False), (State.STALLED, True)]


def test_since_traced_is_shown_until_the_deadline_passes_after_the_detach():
    d = Detector(RULES)
    v = d.observe(waiting(), sample(100), at(100), Sighting(judged_from_ns=at(95)))
    assert v.since_traced == 5.0
    v = d.observe(waiting(), sample(120), at(120), Sighting(judged_from_ns=at(95)))
    assert v.since_traced is None  # past the 10 s deadline since: judged as any wait


def verdict(state: State, reason: str = "", seconds: float = 2000.0) -> Verdict:
    return Verdict(state=state, deadline=10.0, seconds_in_wait=seconds,
                   seconds_since_progress=seconds, busiest_cpu=1.0, act=True, reason=reason)


def test_a_traced_mate_holds_the_job_past_every_bound_and_a_stopped_one_does_not():
    due = verdict(State.STALLED)  # past the blocked deadline (30 s): no other excuse holds
    traced = verdict(State.TRACED, "traced by pid 777 (gdb)")
    why = hold_reason(due, [(0, due), (1, traced)], RULES, 0)
    assert why.startswith("held: rank 1 is traced by pid 777 (gdb)")
    assert hold_reason(due, [(0, due), (1, verdict(State.STOPPED, "process is stopped"))],
                       RULES, 0) == ""


def test_a_rank_traced_on_a_peer_holds_ours_and_says_where():
    incident = SimpleNamespace(ranks=[SimpleNamespace(collectives=5)])
    view = PeerView(traced=(HoldingRank(rank=1, host="mac-02", pid=9,
                                        what="traced by pid 777 (lldb)"),))
    assert peer_traced(view) == peer_hold(view, incident)  # type: ignore[arg-type]
    assert "rank 1 on mac-02 is traced by pid 777 (lldb)" in peer_traced(view)
    assert peer_traced(PeerView()) == "" and peer_traced(None) == ""
    # On the wire: no key without a traced rank (an older peer's view reads the same).
    assert "traced" not in PeerView().to_json()
    assert PeerView.from_json(view.to_json()) == view


def test_the_cluster_view_names_a_traced_rank_and_its_tracer_on_a_held_job():
    from watchdog.daemon.judge.cluster import ReportedRank, judge_job
    from watchdog.status import RankStatus

    def rank(n: int, state: str, **more: object) -> ReportedRank:
        return ReportedRank(f"h{n}", RankStatus(job="j", pid=100 + n, host=f"h{n}", uid=0,
                                                rank=n, world_size=2, state=state,
                                                phase="wait", **more))
    view = judge_job("j", [rank(0, "running"),
                           rank(1, "traced", tracer_pid=777, tracer="lldb")], [])
    assert view.state.value == "healthy" and view.cause is None
    assert view.evidence == "rank 1 on h1 is traced by pid 777 (lldb): the job is held"


def test_a_wait_that_spanned_a_trace_teaches_nothing_of_the_jobs_pace():
    """Its peer under a debugger 150 s, a survivor's wait lasted as long: learned, it
    would stretch the job's deadline to 4 x 150 s, and a SIGSTOP after the detach would
    be caught at 600 s instead of at the floor."""
    from watchdog.daemon.judge.deadlines import Learned, Rules

    key = f"{BASE.uid}:{BASE.job}"
    d = Detector(Rules(), {key: {"all_sum": Learned(longest=2.0, count=40)}})
    for t in [0, 1, 50, 149, 150]:  # traced until 149 s
        d.observe(waiting(), sample(t), at(t), Sighting(judged_from_ns=at(min(t, 149))))
    done = dataclasses.replace(BASE, waits_completed=BASE.waits_completed + 1,
                               last_wait_ns=round(150.5 * NS), phase=Phase.RUNNING)
    v = d.observe(done, sample(151), at(151), Sighting(judged_from_ns=at(149)))
    assert d.auto.learned[key]["all_sum"].longest == 2.0
    nxt = d.observe(waiting(152), sample(153), at(153), Sighting(judged_from_ns=at(149)))
    assert nxt.deadline == 60.0 and v.state == State.RUNNING
