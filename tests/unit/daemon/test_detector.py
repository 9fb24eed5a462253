"""The detector: a pure function of (record, process sample, now).

Table-driven: each scenario is a sequence of ticks (a record and a sample at a
monotonic time) and the (state, act) expected after each one. Monotonic times
are built on absurd origins so nothing here could be read from a real clock.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import pytest

from watchdog.daemon.judge.deadlines import Learned, Rules, deadline_for
from watchdog.daemon.judge.detector import NS, Detector
from watchdog.daemon.judge.sighting import Sighting
from watchdog.daemon.judge.threads import busiest_ratio
from watchdog.daemon.probes import ProcessSample
from watchdog.record import Record
from watchdog.states import Phase, State

# ~222 years of uptime: no real CLOCK_MONOTONIC is anywhere near it.
ORIGIN = 7_000_000_000_000_000_000

BASE = Record(
    pid=4242, start_time=1.7e9, uid=501, rank=0, world_size=2, dump_signal=0, status=0,
    host="node-a", job="job-1", backend="ring", seq=2, collectives=10, waits_entered=10,
    waits_completed=9, steps=0, phase=Phase.RUNNING, op="", phase_since_ns=ORIGIN,
    wait_since_ns=0, last_progress_ns=ORIGIN, last_wait_ns=0, max_wait_ns=0,
    expect_seconds=0.0, expect_since_ns=0, expect_reason="", flight=(),
)

RULES = Rules(deadline=10.0, blocked_deadline=30.0, spin_ratio=0.5, confirm=2,
              init_deadline=100.0)

R, IDL, SU, ST, B, STP = (State.RUNNING, State.IDLE, State.SUSPECT, State.STALLED,
                        State.BLOCKED, State.STOPPED)


@dataclass(frozen=True)
class Tick:
    """One observation: at `at` seconds, in `phase`, the wait (if any) began at `wait_at`.

    `spin` is the busiest thread's share of a core over the interval ending here.
    """

    at: float
    phase: Phase = Phase.WAIT
    wait_at: float = 0.0
    spin: float = 0.0
    status: str = "sleeping"
    completed: int = 9
    expect: float = 0.0
    max_wait: float = 0.0
    load: float = 1.0  # runnable threads per core over the interval ending here
    # Thread 2's demand for a core (run + run-queue share, Linux schedstat) over the
    # interval ending here; None: the probe reports none (macOS, an old kernel).
    demand: float | None = None

    def record(self, origin: int) -> Record:
        waiting = self.phase in (Phase.WAIT, Phase.INIT)
        return dataclasses.replace(
            BASE, phase=self.phase,
            op={Phase.WAIT: "all_sum", Phase.INIT: "init"}.get(self.phase, ""),
            wait_since_ns=origin + round(self.wait_at * NS) if waiting else 0,
            phase_since_ns=origin + round(self.wait_at * NS),
            last_progress_ns=origin + round(self.wait_at * NS),
            waits_completed=self.completed, waits_entered=self.completed + int(waiting),
            expect_seconds=self.expect, expect_since_ns=origin if self.expect else 0,
            max_wait_ns=round(self.max_wait * NS))


def run(ticks: list[Tick], rules: Rules = RULES, origin: int = ORIGIN,
        churn: bool = False, learned: dict | None = None) -> list:
    """Feed the ticks to one Detector; thread 1 idles, thread 2 spins by `spin`."""
    detector = Detector(rules, learned)
    cpu = {1: 0.0, 2: 0.0}
    wanted = {1: 0.0, 2: 0.0}
    last: float | None = None
    verdicts = []
    for n, tick in enumerate(ticks):
        if last is not None:
            cpu[1] += 0.01 * (tick.at - last)
            cpu[2] += tick.spin * (tick.at - last)
            wanted[1] += 0.01 * (tick.at - last)
            wanted[2] += (tick.demand or 0.0) * (tick.at - last)
        last = tick.at
        if churn:  # macOS-style list-position ids: a fresh id every sample
            threads = ((100 + n, cpu[2]),)
        else:
            threads = tuple(cpu.items())
        demand = tuple(wanted.items()) if tick.demand is not None else ()
        sample = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, tick.status, threads,
                               demand=demand)
        verdicts.append(detector.observe(tick.record(origin), sample,
                                         origin + round(tick.at * NS), Sighting(load=tick.load)))
    return verdicts


def waits(times: list[float], **kw) -> list[Tick]:
    return [Tick(at=t, **kw) for t in times]


def outcome(verdicts: list) -> list[tuple[State, bool]]:
    return [(v.state, v.act) for v in verdicts]


SPIN_EVERY_SECOND = waits([float(t) for t in range(13)], spin=1.0)

SCENARIOS = [
    pytest.param(
        waits([0, 1, 3600, 30 * 86400], phase=Phase.RUNNING, spin=1.0),
        [(R, False)] * 4, RULES, id="outside a wait, for a month, spinning: running"),
    pytest.param(
        waits([0, 1, 600, 10**6], phase=Phase.IDLE, spin=1.0),
        [(IDL, False)] * 4, RULES, id="idle is never judged however long"),
    pytest.param(
        waits([0, 1, 2, 4.9], spin=1.0),
        [(R, False)] * 4, RULES, id="wait under half the deadline: running"),
    pytest.param(
        waits([0, 4.9, 5, 9.9]),
        [(R, False), (R, False), (SU, False), (SU, False)], RULES,
        id="past half the deadline: suspect"),
    pytest.param(
        SPIN_EVERY_SECOND,
        [(R, False)] * 5 + [(SU, False)] * 5 + [(ST, False), (ST, True), (ST, True)], RULES,
        id="past the deadline spinning: stalled, acted on the second due tick"),
    pytest.param(
        SPIN_EVERY_SECOND,
        [(R, False)] * 5 + [(SU, False)] * 5 + [(ST, False), (ST, False), (ST, True)],
        dataclasses.replace(RULES, confirm=3), id="confirm=3: third due tick"),
    pytest.param(
        SPIN_EVERY_SECOND,
        [(R, False)] * 5 + [(SU, False)] * 5 + [(ST, True)] * 3,
        dataclasses.replace(RULES, confirm=1), id="confirm=1: first due tick"),
    pytest.param(
        waits([0, 5, 10, 20, 29, 30, 31, 40]),
        [(R, False), (SU, False)] + [(B, False)] * 4 + [(B, True), (B, True)], RULES,
        id="past the deadline at ~0 CPU: blocked, acted on only past blocked_deadline"),
    pytest.param(
        [Tick(at=t, spin=1.0 if t in (3, 7, 11) else 0.02) for t in range(13)],
        [(R, False)] * 5 + [(SU, False)] * 5 + [(B, False)] * 3, RULES,
        id="spinning in a minority of samples is not stalled"),
    pytest.param(
        waits([0, 5, 10, 11, 50, 1000], spin=0.0, status="stopped"),
        [(STP, False)] * 6, RULES, id="stopped is never acted on"),
    pytest.param(
        waits([0, 5, 10, 11, 50, 1000], spin=0.0, status="tracing-stop"),
        [(STP, False)] * 6, RULES, id="traced (tracing-stop) is never acted on"),
    pytest.param(
        waits([0, 10, 49, 50, 100, 101], phase=Phase.INIT, spin=1.0),
        [(R, False)] * 3 + [(SU, False), (ST, False), (ST, True)], RULES,
        id="init waits on init_deadline, not the fixed deadline"),
    pytest.param(
        waits([0, 10, 29, 30, 60, 61], spin=1.0, expect=60.0),
        [(R, False)] * 3 + [(SU, False), (ST, False), (ST, True)], RULES,
        id="expect() extends the deadline"),
]


@pytest.mark.parametrize(("ticks", "expected", "rules"), SCENARIOS)
def test_scenarios(ticks: list[Tick], expected: list[tuple[State, bool]], rules: Rules) -> None:
    assert outcome(run(ticks, rules)) == expected


def test_no_single_due_tick_acts_with_default_confirm() -> None:
    verdicts = run(SPIN_EVERY_SECOND)
    first_due = next(v for v in verdicts if v.state == ST)
    assert first_due.act is False
    assert Rules().confirm == 2


def test_verdict_figures_come_from_the_record_and_now_only() -> None:
    verdicts = run(SPIN_EVERY_SECOND)
    last = verdicts[-1]
    assert last.deadline == 10.0
    assert last.seconds_in_wait == pytest.approx(12.0)
    assert last.seconds_since_progress == pytest.approx(12.0)
    assert last.busiest_cpu == pytest.approx(1.0)
    assert "all_sum" in last.reason and "spinning" in last.reason
    outside = run(waits([0, 1], phase=Phase.RUNNING))[-1]
    assert outside.seconds_in_wait == 0.0


@pytest.mark.parametrize("origin", [1, 10**9, ORIGIN, 18_000_000_000_000_000_000])
def test_detector_never_reads_a_clock(origin: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same scenario on any origin, with every clock broken: same verdicts."""

    def no_clock(*_args: object) -> float:
        raise AssertionError("the detector read a clock")

    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter",
                 "perf_counter_ns", "clock_gettime", "clock_gettime_ns"):
        if hasattr(time, name):
            monkeypatch.setattr(time, name, no_clock)
    verdicts = run(SPIN_EVERY_SECOND, origin=origin)
    monkeypatch.undo()
    assert outcome(verdicts) == outcome(run(SPIN_EVERY_SECOND))
    assert verdicts[-1].seconds_in_wait == pytest.approx(12.0)


# -- a new wait starts from nothing --------------------------------------------------


def test_a_new_wait_resets_the_due_count() -> None:
    """Wait A is due twice (confirm 3), then returns; wait B must earn its 3 ticks anew."""
    rules = dataclasses.replace(RULES, confirm=3)
    ticks = waits([0, 5, 10, 11], spin=1.0) + [
        Tick(at=11.5, wait_at=11.5, completed=10, spin=1.0),
        Tick(at=16.5, wait_at=11.5, completed=10, spin=1.0),
        Tick(at=21.5, wait_at=11.5, completed=10, spin=1.0),
        Tick(at=22.5, wait_at=11.5, completed=10, spin=1.0),
        Tick(at=23.5, wait_at=11.5, completed=10, spin=1.0),
    ]
    assert outcome(run(ticks, rules)) == [
        (R, False), (SU, False), (ST, False), (ST, False),  # A: due twice, not yet acted
        (R, False), (SU, False), (ST, False), (ST, False), (ST, True)]  # B: from zero


def test_a_new_wait_forgets_the_cpu_history() -> None:
    """Wait A spun; wait B is quiet: B's verdict must not borrow A's spinning samples."""
    ticks = [Tick(at=float(t), spin=1.0) for t in range(11)] + [
        Tick(at=11.5, wait_at=11.5, completed=10, spin=0.0),
        Tick(at=21.5, wait_at=11.5, completed=10, spin=0.0),
        Tick(at=22.5, wait_at=11.5, completed=10, spin=0.0),
    ]
    verdicts = run(ticks)
    assert verdicts[10].state == ST
    assert [v.state for v in verdicts[-2:]] == [B, B]
    assert not any(v.act for v in verdicts[-3:])


def test_same_wait_start_but_more_waits_completed_is_a_new_wait() -> None:
    """Two waits can share a start stamp (coarse clock); the completed count tells them apart."""
    ticks = waits([0, 5, 10], spin=1.0) + [Tick(at=11, completed=10, spin=1.0)]
    verdicts = run(ticks)
    assert outcome(verdicts)[2:] == [(ST, False), (B, False)]  # one interval: not yet spinning


def test_stopped_resets_the_due_count() -> None:
    ticks = waits([0, 5, 10], spin=1.0) + [Tick(at=11, status="stopped"),
                                          Tick(at=12, spin=1.0), Tick(at=13, spin=1.0)]
    assert outcome(run(ticks))[2:] == [(ST, False), (STP, False), (ST, False), (ST, True)]


def test_the_first_observation_is_not_a_cpu_sample() -> None:
    """Seen for the first time already past the deadline (say, after a daemon restart).

    The first tick has no earlier CPU reading, so it measures nothing; `stalled`
    needs two measured intervals of spinning. With confirm=1 a rank must not be
    acted on after a single measured interval.
    """
    rules = dataclasses.replace(RULES, confirm=1)
    ticks = [Tick(at=20.0), Tick(at=21.0, spin=1.0), Tick(at=22.0, spin=1.0)]
    verdicts = run(ticks, rules)
    assert verdicts[0].busiest_cpu == 0.0
    assert (verdicts[1].state, verdicts[1].act) == (B, False)
    assert (verdicts[2].state, verdicts[2].act) == (ST, True)


def test_a_spinner_starved_by_load_is_still_spinning() -> None:
    """Three runnable threads per core give a spinning thread a third of one:
    scaled by the load of each tick, it still counts as spinning."""
    starved = waits([float(t) for t in range(13)], spin=0.34, load=3.0)
    assert outcome(run(starved))[-1] == (ST, True)
    # The same share of a core on an idle machine is not a spin.
    assert outcome(run(waits([float(t) for t in range(13)], spin=0.34)))[-1] == (B, False)


def test_load_scales_each_tick_by_its_own_load() -> None:
    """Load that arrives late does not turn earlier quiet ticks into spinning ones."""
    quiet_then_loaded = (waits([float(t) for t in range(10)], spin=0.1)
                         + waits([10.0, 11.0, 12.0], spin=0.1, load=8.0))
    assert outcome(run(quiet_then_loaded))[-1] == (B, False)


def test_a_thread_that_wants_a_core_is_spinning_whatever_share_it_gets() -> None:
    """Linux: a survivor's thread polling a frozen peer on a loaded machine ran 16-88 %
    of a core per sample but wanted one all the time (run + run-queue time): spinning,
    even where the load figure lags and says the machine is idle."""
    starved = waits([float(t) for t in range(13)], spin=0.2, demand=1.0)
    assert outcome(run(starved))[-1] == (ST, True)
    # A thread that sleeps in its wait wants no core: blocked, however loaded the machine
    # (the load-scaled CPU share would have called 0.1 of a core at load 8 a spin).
    sleeping = waits([float(t) for t in range(13)], spin=0.1, demand=0.1, load=8.0)
    assert outcome(run(sleeping))[-1] == (B, False)
    verdicts = run(starved)
    assert verdicts[-1].busiest_cpu == pytest.approx(0.2)  # the report stays the CPU share


def test_thread_churn_is_not_spinning() -> None:
    """macOS thread ids are list positions: a new id with a big total is not a spin."""
    verdicts = run(waits([float(t) for t in range(13)], spin=1.0), churn=True)
    assert {v.busiest_cpu for v in verdicts} == {0.0}
    assert verdicts[-1].state == B


def test_forget_drops_the_rank_memory() -> None:
    detector = Detector(RULES)
    sample = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "running", ((1, 0.0),))
    detector.observe(BASE, sample, ORIGIN)
    assert (BASE.pid, BASE.start_time) in detector.tracks
    detector.forget((BASE.pid, BASE.start_time))
    detector.forget((BASE.pid, BASE.start_time))  # twice is fine
    assert detector.tracks == {}


# -- deadlines -------------------------------------------------------------------------


def rec(**kw) -> Record:
    return dataclasses.replace(BASE, **kw)


AUTO = Rules(deadline=None, auto_factor=4.0, auto_floor=60.0, auto_min_waits=20,
             auto_fallback=600.0, init_deadline=900.0)


@pytest.mark.parametrize(("record", "rules", "learned", "expected"), [
    pytest.param(rec(phase=Phase.WAIT), dataclasses.replace(AUTO, deadline=10.0), None, 10.0,
                 id="fixed"),
    pytest.param(rec(phase=Phase.WAIT, waits_completed=500, max_wait_ns=100 * NS), AUTO,
                 Learned(100.0, 19), 600.0,
                 id="auto before min waits of this kind: fallback"),
    pytest.param(rec(phase=Phase.WAIT, waits_completed=500, max_wait_ns=100 * NS), AUTO,
                 None, 600.0,
                 id="auto, this kind never seen: fallback, however many other waits"),
    pytest.param(rec(phase=Phase.WAIT), AUTO, Learned(1.0, 20), 60.0,
                 id="auto after min waits, short waits: floor"),
    pytest.param(rec(phase=Phase.WAIT), AUTO, Learned(30.0, 20), 120.0,
                 id="auto after min waits: factor x longest"),
    pytest.param(rec(phase=Phase.WAIT), dataclasses.replace(AUTO, auto_floor=1.0),
                 Learned(0.5, 500), 2.0, id="auto: sub-second waits"),
    pytest.param(rec(phase=Phase.WAIT, expect_seconds=500.0),
                 dataclasses.replace(AUTO, deadline=10.0), None, 500.0,
                 id="expect overrides fixed"),
    pytest.param(rec(phase=Phase.WAIT, expect_seconds=5.0), AUTO, Learned(100.0, 50), 5.0,
                 id="expect overrides auto"),
    pytest.param(rec(phase=Phase.INIT, expect_seconds=5.0),
                 dataclasses.replace(AUTO, deadline=10.0), None, 900.0,
                 id="init phase: init_deadline"),
])
def test_deadline_for(record: Record, rules: Rules, learned: Learned | None,
                      expected: float) -> None:
    assert deadline_for(record, rules, learned) == pytest.approx(expected)


def test_auto_deadline_is_used_by_the_detector() -> None:
    rules = dataclasses.replace(AUTO, auto_floor=1.0, confirm=1)
    ticks = [Tick(at=float(t), spin=1.0, completed=25) for t in range(10)]
    detector_learned = {f"{BASE.uid}:{BASE.job}": {"all_sum": Learned(2.0, 20)}}
    verdicts = run(ticks, rules, learned=detector_learned)
    assert verdicts[0].deadline == 8.0
    assert [v.state for v in verdicts[:9]] == [R] * 4 + [SU] * 4 + [ST]
    assert verdicts[8].act is True


# -- busiest_ratio -------------------------------------------------------------------


@pytest.mark.parametrize(("before", "after", "seconds", "expected"), [
    pytest.param({1: 1.0, 2: 5.0}, {1: 1.1, 2: 5.9}, 1.0, 0.9, id="busiest of two"),
    pytest.param({1: 0.0}, {1: 0.5}, 2.0, 0.25, id="over the elapsed time"),
    pytest.param({1: 0.0, 2: 0.0}, {2: 0.1, 3: 100.0}, 1.0, 0.1,
                 id="a thread that appears is skipped"),
    pytest.param({1: 0.0, 2: 0.0, 3: 0.0}, {2: 0.2}, 1.0, 0.2,
                 id="a thread that disappears is skipped"),
    pytest.param({1: 50.0}, {1: 0.5}, 1.0, 0.0,
                 id="an id reused by another thread (cpu went down) is skipped"),
    pytest.param({1: 0.0}, {1: 5.0}, 1.0, 1.0, id="clamped to one core"),
    pytest.param({1: 0.0}, {1: 5.0}, 0.0, 0.0, id="zero elapsed"),
    pytest.param({1: 0.0}, {1: 5.0}, -1.0, 0.0, id="negative elapsed"),
    pytest.param({}, {}, 1.0, 0.0, id="no threads (access denied)"),
    pytest.param({1: 3.0}, {1: 3.0}, 1.0, 0.0, id="idle"),
])
def test_busiest_ratio(before: dict[int, float], after: dict[int, float], seconds: float,
                       expected: float) -> None:
    assert busiest_ratio(before, after, seconds) == pytest.approx(expected)
