"""Issue 55, item 4: a GPU (or the cores) shared with another job is slow, not hung.

macOS: a rank whose own GPU time stands still while another process's advances on a GPU
busy at working power waits behind that work: no quiet hang, it holds its job as a rank
computing does (to the blocked bound), and its status says what it waits behind.
Linux: a rank starved of cores by another user's heavy work still wants a core all the
time (schedstat's run + run-queue time): computing, and its job held. Pure.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.daemon.test_detector import BASE, NS, ORIGIN
from watchdog.daemon.holds import hold_reason
from watchdog.daemon.judge import gpuwork
from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.judge.detector import Detector
from watchdog.daemon.judge.frames import Reading
from watchdog.daemon.judge.sighting import Sighting, Sockets
from watchdog.daemon.probes import ProcessSample
from watchdog.daemon.probes.stacksampler import _advanced
from watchdog.daemon.sample import GpuPower
from watchdog.states import FrameKind, Phase, State

RULES = Rules(deadline=10.0, blocked_deadline=30.0)
WORKING = GpuPower(active_percent=99.0, milliwatts=9100.0)
LOADING = ((812, "python3.12"),)


@pytest.mark.parametrize(("others", "power", "explained"), [
    pytest.param(LOADING, WORKING, True, id="another's GPU time advancing at working power"),
    pytest.param(LOADING, None, True, id="power not read: never end on a guess"),
    pytest.param(LOADING, GpuPower(99.0, 0.0), True, id="0 W is no reading"),
    pytest.param(LOADING, GpuPower(4.0, 30.0), False, id="the GPU near idle: not theirs"),
    pytest.param((), WORKING, False, id="no other process's GPU time advancing"),
])
def test_what_a_flat_gpu_waits_behind(others, power, explained):
    said = gpuwork.behind(others, power)
    assert bool(said) == explained, said
    if explained and power is WORKING:
        assert said == "pid 812 (python3.12)'s GPU work, GPU 99% resident at 9100 mW"


def test_the_processes_whose_gpu_time_advanced_most_first():
    before = {1: (100, "a"), 2: (100, "b"), 3: (100, "c")}
    assert _advanced(before, {1: (100, "a"), 2: (500, "b"), 3: (150, "c"), 4: (9, "d")}) \
        == ((2, "b"), (3, "c"))
    assert _advanced(None, before) == () and _advanced(before, None) == ()


def quiet_wait(behind: str) -> list:
    """A rank asleep in its eval's wait (a Mac's GPU wait), nothing moving, past its
    deadline; `behind`: what its GPU work waits behind."""
    d = Detector(RULES)
    rec = dataclasses.replace(BASE, phase=Phase.WAIT, op="eval", wait_since_ns=ORIGIN,
                              waits_entered=BASE.waits_completed + 1)
    asleep = Reading(FrameKind.WAITING, "main thread in waitUntilSignaledValue")
    out = []
    for t in [0, 1, 6, 11, 12, 13, 31, 32]:
        s = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "running", ((1, 0.0),),
                          io=(10, 10))
        out.append(d.observe(rec, s, ORIGIN + round(t * NS), Sighting(
            asleep=asleep, sockets=Sockets(float(t), 0, False), age=0.0, behind=behind)))
    return out


def test_incident_2_a_runner_whose_gpu_work_waits_behind_a_siblings_load_is_held():
    """exo fork, incident 2: a runner killed at 298 s of silence while a sibling runner on
    the same Mac loaded its weights. Without what it waits behind, the same wait is a
    quiet hang at its deadline; with it, slow: held to the blocked bound."""
    hang = quiet_wait("")
    assert hang[4].state == State.STALLED and hang[5].act and hang[4].quiet
    behind = "pid 812 (python3.12)'s GPU work, GPU 99% resident at 9100 mW"
    held = quiet_wait(behind)
    assert [v.act for v in held[:6]] == [False] * 6
    assert held[4].state == State.BLOCKED and not held[4].quiet and held[4].computing
    assert held[4].behind == behind and f"waits behind {behind}" in held[4].reason
    assert held[-1].act  # the blocked bound (30 s here) still ends a wait that never moves
    # Its peers, spinning on it, are held while it waits behind the other job.
    spinning = dataclasses.replace(hang[5], computing=False)
    why = hold_reason(spinning, [(0, spinning), (1, held[4])], RULES, 0)
    assert why.startswith("held: rank 1 of the job is computing"), why


def test_a_rank_starved_of_cores_by_another_users_work_computes_and_holds_its_job():
    """The Linux analogue: its compute thread got a quarter of a core (another user's
    burners on the same cores) but wanted one all the time, in user space: computing."""
    d = Detector(RULES)
    rec = dataclasses.replace(BASE, phase=Phase.WAIT, op="eval", wait_since_ns=ORIGIN,
                              waits_entered=BASE.waits_completed + 1)
    verdicts = []
    for t in range(0, 15):
        s = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "running",
                          ((1, 0.0), (2, 0.25 * t)), system=((1, 0.0), (2, 0.0)),
                          demand=((1, 0.0), (2, 1.0 * t)))
        verdicts.append(d.observe(rec, s, ORIGIN + t * NS, Sighting(load=1.0)))
    assert verdicts[-1].computing
    peer = dataclasses.replace(verdicts[-1], state=State.STALLED, computing=False)
    assert "is computing" in hold_reason(peer, [(0, peer), (1, verdicts[-1])], RULES, 0)
