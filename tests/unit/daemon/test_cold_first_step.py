"""Issue 55, item 3: a cold first step is slow, not hung.

A rank's first wait of a kind (the auto deadline has learned nothing of it) is judged on
the fallback (600 s), and past every bound it is held while its work shows at a fresh
stack sample (compute frames, or GPU time advancing: `Verdict.works`); a first wait
with nothing moving is still a hang. Pure: the detector's flag and the hold rule.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.daemon.test_detector import BASE, NS, ORIGIN
from watchdog.daemon.holds import hold_reason
from watchdog.daemon.judge.deadlines import Learned, Rules
from watchdog.daemon.judge.detector import Detector, Verdict
from watchdog.daemon.judge.frames import Reading
from watchdog.daemon.judge.sighting import Sighting
from watchdog.daemon.probes import ProcessSample
from watchdog.states import FrameKind, Phase, State

RULES = Rules()  # the defaults: auto, floor 60 s, fallback 600 s, blocked bound 900 s


def in_eval(wait_at: float = 0.0):
    return dataclasses.replace(BASE, phase=Phase.WAIT, op="eval",
                               wait_since_ns=ORIGIN + round(wait_at * NS),
                               waits_entered=BASE.waits_completed + 1)


def observe(t: float, learned: dict | None = None, seen: Reading | None = None) -> Verdict:
    d = Detector(RULES, learned)
    s = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "running", ((1, 0.0), (2, 0.0)))
    d.observe(in_eval(), s, ORIGIN)
    s = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "running", ((1, t), (2, 0.0)))
    return d.observe(in_eval(), s, ORIGIN + round(t * NS), Sighting(seen=seen))


def test_incident_3_a_cold_prefill_47s_into_its_first_chunk_is_not_judged():
    """exo fork, incident 3: a cold 106,579-token prefill killed 47 s into its first
    chunk. Nothing learned of `eval`: the 600 s fallback, and the wait is cold."""
    v = observe(47.0)
    assert (v.state, v.act, v.deadline, v.cold) == (State.RUNNING, False, 600.0, True)
    learned = {f"{BASE.uid}:{BASE.job}": {"eval": Learned(longest=15.0, count=40)}}
    warm = observe(47.0, learned)
    assert warm.cold is False and warm.deadline == 60.0  # 4 x 15 s, the floor


def verdict(state: State, *, cold: bool = False, computing: bool = False,
            works: bool = False, seconds: float = 950.0, seen: str = "") -> Verdict:
    return Verdict(state=state, deadline=600.0, seconds_in_wait=seconds,
                   seconds_since_progress=seconds, busiest_cpu=1.0, act=True,
                   reason="in eval", computing=computing, cold=cold, works=works, seen=seen)


COMPUTES = verdict(State.SUSPECT, computing=True, works=True, cold=True,
                   seen="thread 7 in cblas_sgemm")


@pytest.mark.parametrize(("due", "mate", "held"), [
    pytest.param(verdict(State.STALLED, cold=True), COMPUTES, True,
                 id="incident 3/4/6: past the 900 s bound, a rank's work shows: held"),
    pytest.param(verdict(State.STALLED, cold=True),
                 verdict(State.SUSPECT, computing=True, cold=True), False,
                 id="busy by the CPU split alone, no sample: the bound stands"),
    pytest.param(verdict(State.STALLED, cold=True),
                 verdict(State.BLOCKED, cold=True), False,
                 id="a first wait with nothing moving: a hang"),
    pytest.param(verdict(State.STALLED), COMPUTES, False,
                 id="a learned kind past the bound: the bound stands"),
])
def test_a_cold_first_wait_is_held_past_the_bound_while_its_work_shows(due, mate, held):
    why = hold_reason(due, [(0, due), (1, mate)], RULES, 0)
    assert bool(why) == held, why
    if held:
        assert why == ("held: rank 1 computes its first step of this kind (nothing learned "
                       "yet, a cold first step, not a hang): thread 7 in cblas_sgemm")


def test_works_is_a_fresh_sample_of_named_compute_frames_or_gpu_time_not_a_guess():
    named = Reading(FrameKind.COMPUTING, "thread 7 in cblas_sgemm")
    assert observe(30.0, seen=named).works
    assert not observe(30.0, seen=Reading(FrameKind.COMPUTING, "unnamed", guessed=True)).works
    assert not observe(30.0, seen=Reading(FrameKind.WAITING, "in recv")).works
    assert not observe(30.0).works


@pytest.mark.parametrize("op", ["load", "eval"])
def test_incident_4_a_model_load_after_a_relaunch_reading_its_weights_is_held(op):
    """exo fork, incident 4: fresh model loads killed at 46-49 s on two relaunches (17-27
    of 46 layers loaded, the killed runner's memory still being reclaimed). A relaunch
    starts from its workload's learning (a 60 s deadline from short evals); its load
    reading its weights is never a quiet hang: `mx.load` (a wait of its own moving bytes)
    is held however long, an `eval` of the weights to the blocked bound (900 s)."""
    d = Detector(RULES, {f"{BASE.uid}:{BASE.job}": {op: Learned(longest=2.0, count=40)}})
    got = []
    for n, t in enumerate([0, 1, 30, 49, 61, 62, 90, 300, 899, 901, 902]):
        s = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "running", ((1, 0.1 * t),),
                          io=((1 << 20) * n, 0))  # a MiB of its weights read every scan
        got.append(d.observe(dataclasses.replace(in_eval(), op=op), s,
                             ORIGIN + round(t * NS)))
    assert got[3].deadline == 60.0 and got[3].state == State.SUSPECT and not got[3].act
    assert not any(v.act or v.quiet for v in got[:9]), [v.reason for v in got]
    if op == "load":
        assert all(v.state == State.SUSPECT and not v.act for v in got[4:])
        assert "bytes moving" in got[-1].reason
    else:
        assert got[4].state == State.BLOCKED and got[-1].act  # the blocked bound
