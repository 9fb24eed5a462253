"""The backstop and the computing flag: pure, table-driven, with fake samples.

A rank is described per tick by each thread's share of a core and the share
of that spent in the kernel; the detector sees cumulative CPU seconds, as the
probe gives them. Monotonic times sit on an absurd origin (no real clock).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from watchdog.daemon.holds import hold_reason
from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.judge.detector import NS, Detector, Verdict
from watchdog.daemon.judge.threads import python_threads
from watchdog.daemon.probes import ProcessSample
from watchdog.record import Record
from watchdog.states import Phase, State

ORIGIN = 7_000_000_000_000_000_000
PID, WORKER, NATIVE = 4242, 4250, 4260  # main thread's tid is the pid (Linux)

BASE = Record(
    pid=PID, start_time=1.7e9, uid=501, rank=0, world_size=2, dump_signal=0, status=0,
    host="node-a", job="job-1", backend="ring", seq=2, collectives=10, waits_entered=9,
    waits_completed=9, steps=0, phase=Phase.RUNNING, op="", phase_since_ns=ORIGIN,
    wait_since_ns=0, last_progress_ns=ORIGIN, last_wait_ns=0, max_wait_ns=0,
    expect_seconds=0.0, expect_since_ns=0, expect_reason="", flight=(),
    python_threads=(WORKER,),
)
RULES = Rules(deadline=10.0, blocked_deadline=30.0, spin_ratio=0.5, confirm=2)
R, SU, ST, STP, IDL = State.RUNNING, State.SUSPECT, State.STALLED, State.STOPPED, State.IDLE

KERNEL_SPIN = (1.0, 0.85)  # a ring thread polling a frozen peer (measured: ~85% kernel)
USER_SPIN = (1.0, 0.0)  # a thread computing (or JACCL polling in user space)
QUIET = (0.0, 0.0)


@dataclass(frozen=True)
class Shape:
    """How a rank looks on every tick: each thread's (share of a core, kernel share)."""

    main: tuple[float, float] = QUIET
    worker: tuple[float, float] = QUIET
    native: tuple[float, float] = KERNEL_SPIN
    record: dict = field(default_factory=dict)  # Record fields to replace
    status: str = "sleeping"
    moving: bool = False  # collectives advance every tick (progress)
    native_ids: bool = True
    main_tid: int | None = PID


def run(shape: Shape, seconds: int = 13, rules: Rules = RULES) -> list[Verdict]:
    detector = Detector(rules)
    cpu = {PID: 0.0, WORKER: 0.0, NATIVE: 0.0}
    kernel = dict.fromkeys(cpu, 0.0)
    rec = dataclasses.replace(BASE, **shape.record)
    out = []
    for t in range(seconds):
        if t:
            for tid, (share, ksh) in ((PID, shape.main), (WORKER, shape.worker),
                                      (NATIVE, shape.native)):
                cpu[tid] += share
                kernel[tid] += share * ksh
        if shape.moving:
            rec = dataclasses.replace(rec, collectives=rec.collectives + 1)
        ids = list(cpu) if shape.native_ids else [1, 2, 3]  # macOS: list positions
        sample = ProcessSample(PID, 1.7e9, 501, shape.status,
                               tuple(zip(ids, cpu.values(), strict=True)),
                               tuple(zip(ids, kernel.values(), strict=True)),
                               shape.main_tid if shape.native_ids else 1, shape.native_ids)
        out.append(detector.observe(rec, sample, ORIGIN + t * NS))
    return out


FIRES = [(R, False)] * 5 + [(SU, False)] * 5 + [(ST, False), (ST, True), (ST, True)]
NEVER = [(R, False)] * 13

CASES = [
    pytest.param(Shape(), FIRES, id="main quiet, a native thread polls in the kernel: fires"),
    pytest.param(Shape(main=USER_SPIN), NEVER, id="main thread computing in Python"),
    pytest.param(Shape(native=QUIET), NEVER, id="a server waiting, nothing spinning"),
    pytest.param(Shape(moving=True), NEVER, id="progress moves: between MLX calls"),
    pytest.param(Shape(native=QUIET, worker=KERNEL_SPIN), NEVER,
                 id="main in queue.get(), a Python worker loading data at 100%"),
    pytest.param(Shape(native=QUIET, worker=USER_SPIN), NEVER,
                 id="main in queue.get(), a Python worker computing at 100%"),
    pytest.param(Shape(record={"python_threads": None}), NEVER,
                 id="no thread table (an older hook): cannot tell, never fires"),
    pytest.param(Shape(record={"python_threads_overflow": True}), NEVER,
                 id="thread table overflowed: cannot tell"),
    pytest.param(Shape(main_tid=None), NEVER, id="main thread unknown: cannot tell"),
    pytest.param(Shape(native=USER_SPIN), NEVER,
                 id="ring, native thread computing in user space (a long eval in np.array)"),
    pytest.param(Shape(native=USER_SPIN, record={"backend": "jaccl"}), FIRES,
                 id="jaccl polls in user space: a native user-space spin fires"),
    pytest.param(Shape(native=USER_SPIN, record={"backend": "mpi"}), FIRES,
                 id="mpi polls in user space too: a native user-space spin fires"),
    pytest.param(Shape(native_ids=False, record={"python_threads": ()}), FIRES,
                 id="macOS ids, main the only Python thread: fires"),
    pytest.param(Shape(native_ids=False), NEVER,
                 id="macOS ids with Python worker threads: cannot map them, never fires"),
    pytest.param(Shape(status="stopped"), [(STP, False)] * 13, id="stopped: never acted on"),
    pytest.param(Shape(record={"phase": Phase.IDLE}), [(IDL, False)] * 13, id="idle"),
    pytest.param(Shape(record={"expect_seconds": 100.0, "expect_since_ns": ORIGIN}), NEVER,
                 id="hb.expect() stretches the backstop's deadline too"),
]


@pytest.mark.parametrize(("shape", "want"), CASES)
def test_backstop(shape: Shape, want: list) -> None:
    verdicts = run(shape)
    assert [(v.state, v.act) for v in verdicts] == want
    if want == FIRES:
        assert "stuck in a native call outside a known wait" in verdicts[-1].reason
        assert verdicts[-1].seconds_in_wait == pytest.approx(12.0)


def test_the_backstop_counts_time_from_the_last_progress_the_daemon_saw():
    """Collectives and steps carry no time: the clock starts when they were seen to move."""
    detector = Detector(RULES)
    rec = dataclasses.replace(BASE, last_progress_ns=ORIGIN - 1000 * NS)  # old wait
    cpu = 0.0
    states = []
    for t in range(4):
        cpu += 1.0 if t else 0.0
        sample = ProcessSample(PID, 1.7e9, 501, "sleeping", ((PID, 0.0), (NATIVE, cpu)),
                               ((PID, 0.0), (NATIVE, cpu)), PID, True)
        states.append(detector.observe(rec, sample, ORIGIN + t * NS).state)
    assert states == [R] * 4  # 3 s since first sight, not 1000 s since the old wait


def test_python_threads_in_each_id_space():
    linux = ProcessSample(PID, 0, 0, "sleeping", (), (), PID, True)
    mac = ProcessSample(PID, 0, 0, "sleeping", (), (), 1, False)
    assert python_threads(BASE, linux) == {PID, WORKER}
    assert python_threads(BASE, mac) is None
    assert python_threads(dataclasses.replace(BASE, python_threads=()), mac) == {1}


# -- the computing flag inside a wait, and the job rule ------------------------------

def wait_shape(native, **record) -> Shape:
    return Shape(native=native, record={"phase": Phase.WAIT, "op": "eval",
                                        "wait_since_ns": ORIGIN, **record})


@pytest.mark.parametrize(("shape", "computing"), [
    pytest.param(wait_shape(KERNEL_SPIN), False, id="ring rank polling a peer"),
    pytest.param(wait_shape(USER_SPIN), True, id="ring rank in a long CPU eval"),
    pytest.param(wait_shape(USER_SPIN, backend="jaccl"), False,
                 id="jaccl in user space: cannot tell computing from polling"),
    pytest.param(wait_shape(USER_SPIN, backend="mpi"), False,
                 id="mpi in user space: its wait polls there too (the JACCL shape)"),
    pytest.param(wait_shape(USER_SPIN, backend="single", world_size=1), True,
                 id="a group of one has no peer to wait on"),
    pytest.param(wait_shape(QUIET), False, id="a quiet wait"),
])
def test_computing_in_a_wait(shape: Shape, computing: bool) -> None:
    verdicts = run(shape)
    # Per rank a spin past the deadline is stalled either way: the job rule holds it.
    assert verdicts[-1].state == (State.BLOCKED if shape.native == QUIET else ST)
    assert verdicts[-1].computing is computing


def verdict(state: State = ST, in_wait: float = 12.0, computing: bool = False,
            since: float | None = None) -> Verdict:
    return Verdict(state, 10.0, in_wait, in_wait if since is None else since, 1.0, True,
                   "in all_sum", computing)


@pytest.mark.parametrize(("job", "in_wait", "held"), [
    pytest.param([(0, verdict()), (1, verdict(computing=True))], 12.0, True,
                 id="a peer computing holds the waiting rank"),
    pytest.param([(0, verdict()), (1, verdict(State.STOPPED))], 12.0, False,
                 id="a stopped peer holds nothing"),
    pytest.param([(0, verdict()), (1, verdict())], 12.0, False, id="every rank waits: hung"),
    pytest.param([(0, verdict(computing=True))], 12.0, True,
                 id="the rank itself computes (a long eval of its own)"),
    pytest.param([(0, verdict()), (1, verdict(computing=True))], 30.0, False,
                 id="the excuse ends at the blocked deadline"),
    pytest.param([(0, verdict()), (1, verdict(State.STOPPED, computing=True))], 12.0, False,
                 id="a stopped rank's old computing flag holds nothing"),
    pytest.param([(0, verdict()), (1, verdict(state=R, in_wait=0.0, since=0.5))], 12.0, True,
                 id="a peer still completing waits (a slow peer between its evals)"),
    pytest.param([(0, verdict()), (1, dataclasses.replace(verdict(R, 0.0, since=50.0),
                                                          deadline=600.0))], 12.0, False,
                 id="a peer on a long fallback deadline, idle past the due rank's deadline"),
    pytest.param([(0, verdict(since=0.5)), (1, verdict())], 12.0, False,
                 id="the due rank's own progress excuses nothing"),
    pytest.param([(0, verdict()), (1, verdict(STP, since=0.5))], 12.0, False,
                 id="a stopped rank's recent progress holds nothing"),
])
def test_hold_reason(job, in_wait, held):
    why = hold_reason(verdict(in_wait=in_wait), job, RULES, rank=0)
    assert bool(why) is held
    if held:
        assert "computing" in why or "progress" in why


def test_the_computing_flag_survives_short_evals_between_long_ones():
    """A slow rank going from eval to eval (one scan each) stays computing."""
    detector = Detector(RULES)
    rec = dataclasses.replace(BASE, phase=Phase.WAIT, op="eval")
    cpu, kernel, out = 0.0, 0.0, []
    for t in range(12):
        cpu += 1.0 if t else 0.0  # one thread computing in user space throughout
        since = 0 if t < 4 else t  # a long eval, then a new one every scan
        rec = dataclasses.replace(rec, wait_since_ns=ORIGIN + since * NS,
                                  waits_completed=9 + max(0, t - 3))
        sample = ProcessSample(PID, 1.7e9, 501, "running", ((PID, 0.0), (NATIVE, cpu)),
                               ((PID, 0.0), (NATIVE, kernel)), PID, True)
        out.append(detector.observe(rec, sample, ORIGIN + t * NS).computing)
    assert out[3:] == [True] * 9
