"""A Mac's work is on its GPU (issue 54), pure: no rule ends a rank whose GPU may work.

- Unknown GPU time (no ioreg client for the rank, a format not read, a timeout, one
  reading so far) never makes a quiet hang: the rank keeps the `blocked` rule, its
  reason says "GPU time unknown" and why, and it holds its job up to the blocked bound.
- GPU time advancing is computing on every backend, ring included: it holds its job.
- A power of 0 W (or none) is no reading: never "a GPU spinning on nothing".
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from tests.unit.daemon.test_detector import BASE, NS, ORIGIN, RULES
from tests.unit.daemon.test_quiet_hang import EVAL, MAIN, RING, SAVE
from watchdog.daemon.holds import hold_reason
from watchdog.daemon.judge.detector import GPU_WORKS, Detector, Track, _computing_now
from watchdog.daemon.judge.frames import Reading, asleep, classify, gpu_unknown
from watchdog.daemon.judge.gpuwork import gpu_works, read, spins_on_nothing
from watchdog.daemon.judge.sighting import Sighting, Sockets
from watchdog.daemon.judge.threads import ThreadTick
from watchdog.daemon.probes import ProcessSample
from watchdog.daemon.sample import GpuPower
from watchdog.states import FrameKind, Phase, State

WHY = "ioreg lists no Metal client for pid 4242"
FAST_SYNCH = ("waitUntilSignaledValue", "mlx::core::metal::Event::wait", "start_thread")


@pytest.mark.parametrize("gpu, unknown, kind, words", [
    (None, WHY, FrameKind.UNKNOWN, f"GPU time unknown: {WHY}"),  # unknown is not flat
    (None, "", FrameKind.WAITING, "main thread waits in"),  # Linux: no GPU kept
    (False, WHY, FrameKind.WAITING, "GPU time flat"),  # read twice, flat: the old rule
    (True, WHY, FrameKind.COMPUTING, "GPU time advances"),
])
def test_a_quiet_rank_is_waiting_only_with_its_gpu_time_read_flat(gpu, unknown, kind, words):
    seen = asleep({MAIN: EVAL, 7: RING}, "ring", gpu, main=MAIN, unknown=unknown)
    assert seen.kind == kind and words in seen.what, seen
    assert seen.gpu == (gpu is True)
    assert seen.gpu_unknown == (WHY if kind == FrameKind.UNKNOWN else "")


def test_a_thread_spinning_in_a_wait_frame_with_gpu_time_unknown_is_not_waiting():
    # MLX_METAL_FAST_SYNCH spins in waitUntilSignaledValue while the GPU works.
    assert classify({1: FAST_SYNCH}, [], "jaccl", False).kind == FrameKind.WAITING
    seen = classify({1: FAST_SYNCH}, [], "jaccl", None, unknown=WHY)
    assert seen.kind == FrameKind.UNKNOWN and WHY in seen.what and seen.gpu_unknown == WHY


@pytest.mark.parametrize("backend", ["ring", "jaccl", "mpi", None])
def test_gpu_time_advancing_computes_on_every_backend(backend):
    record = dataclasses.replace(BASE, backend=backend or "", phase=Phase.WAIT,
                                 wait_since_ns=ORIGIN)
    gpu = Reading(FrameKind.COMPUTING, "its GPU time advances", gpu=True)
    idle = ThreadTick(0.0, None, None, None)
    assert _computing_now(record, Track(), idle, True, gpu)
    # The same words without the GPU's reading: ring's rule (where the time goes) stands.
    if backend == "ring":
        cpu = Reading(FrameKind.COMPUTING, "busy thread 7 computes in sgemm")
        assert not _computing_now(record, Track(), idle, True, cpu)


@pytest.mark.parametrize("milliwatts, spins", [
    (3000.0, True),  # mlx #3830: 100% resident at ~3 W
    (0.0, False),  # macOS 27, an M5 Max: 0 W is no reading
    (8500.0, False),  # resident at working watts
])
def test_a_power_of_zero_is_no_reading(milliwatts, spins):
    power = GpuPower(100.0, milliwatts, None)
    assert spins_on_nothing(power) is spins
    assert gpu_works(True, power) is (not spins)
    assert gpu_works(True, None) is True  # no reading at all: its time advancing is work
    works, _ = read(True, power)
    assert works is (not spins)


def judge(reading: Reading, seconds: int = 40, spin: float = 0.0) -> list:
    """A two-rank ring wait begun at 0, its sockets still, judged each second to
    `seconds` past its start (10 s deadline) with `reading` fresh at every tick."""
    detector = Detector(RULES)
    record = dataclasses.replace(BASE, phase=Phase.WAIT, op="eval", wait_since_ns=ORIGIN,
                                 last_progress_ns=ORIGIN, waits_entered=10, world_size=2)
    out = []
    for t in range(seconds + 1):
        sample = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "sleeping",
                               ((1, 0.001 * t), (2, spin * t)), io=(100, 50))
        out.append(detector.observe(record, sample, ORIGIN + t * NS, Sighting(
            asleep=reading, sockets=Sockets(float(t), 0, False), age=0.0)))
    return out


def test_unknown_gpu_time_keeps_the_blocked_rule_and_says_why():
    verdicts = judge(gpu_unknown(WHY))
    assert not any(v.quiet for v in verdicts)
    past = [v for v in verdicts if v.seconds_in_wait >= RULES.deadline]
    assert past and all(v.state == State.BLOCKED for v in past)
    assert all(f"GPU time unknown: {WHY}" in v.reason for v in past), past[-1].reason
    assert not any(v.act for v in past if v.seconds_in_wait < RULES.blocked_deadline)
    assert all(v.gpu == f"unknown: {WHY}" for v in past)


def test_the_same_wait_read_flat_is_a_quiet_hang():
    flat = asleep({MAIN: EVAL, 7: RING}, "ring", False, main=MAIN, unknown=WHY)
    assert any(v.act and v.quiet for v in judge(flat))


def test_gpu_time_advancing_is_computing_held_to_the_blocked_bound():
    verdicts = judge(asleep({MAIN: EVAL}, "ring", True, main=MAIN))
    past = [v for v in verdicts if v.seconds_in_wait >= RULES.deadline]
    assert all(v.computing and v.gpu == GPU_WORKS for v in verdicts)
    assert all(v.state == State.SUSPECT and "GPU time advances" in v.reason and not v.act
               for v in past if v.seconds_in_wait < RULES.blocked_deadline), past[-1]


def verdict(**fields):
    v = judge(asleep({MAIN: EVAL, 9: SAVE}, "ring"), seconds=int(RULES.deadline) + 1)[-1]
    return dataclasses.replace(v, **fields)


@pytest.mark.parametrize("peer, held", [
    (dict(gpu=f"unknown: {WHY}"), "GPU time is unknown"),  # it may compute
    (dict(gpu=GPU_WORKS, computing=True), "computing"),
    (dict(gpu=""), ""),  # read flat, nothing else: no hold
])
def test_a_peer_whose_gpu_may_work_holds_the_job(peer, held):
    due = verdict(state=State.STALLED, act=True, computing=False, gpu="",
                  seconds_since_progress=99.0)
    mate = verdict(**{"computing": False, "seconds_since_progress": 99.0, **peer})
    why = hold_reason(due, [(0, due), (1, mate)], RULES, rank=0)
    assert (held in why) if held else why == "", why
    # Up to the blocked bound: past it, nothing holds.
    bound = dataclasses.replace(due, seconds_in_wait=RULES.blocked_deadline)
    assert hold_reason(bound, [(0, bound), (1, mate)], RULES, rank=0) == ""


def test_a_save_whose_offsets_move_holds_where_the_disk_counters_see_nothing():
    """A Mac's save into a FIFO or onto a network mount: ri_diskio counts no byte, the
    file's offset moves with every byte; those are its bytes (OwnWait.moving)."""
    detector = Detector(RULES)
    record = dataclasses.replace(BASE, phase=Phase.WAIT, op="save_safetensors",
                                 wait_since_ns=ORIGIN, last_progress_ns=ORIGIN,
                                 waits_entered=10, flight=())
    verdicts = []
    for t in range(int(RULES.deadline) + 5):
        sample = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "sleeping",
                               ((1, 0.001 * t),), io=(100, 50), offsets=4096 * t)
        verdicts.append(detector.observe(record, sample, ORIGIN + t * NS))
    last = verdicts[-1]
    assert last.own is not None and last.own.moving(RULES.auto_floor), last.own
    assert last.own.written and last.own.written >= 4096 * 10, last.own
    assert "bytes moving" in last.reason and not any(v.act for v in verdicts), last.reason


def test_a_listener_is_found_when_one_process_refuses_the_system_wide_listing(monkeypatch):
    """psutil on macOS fails the whole net_connections() on one refused pid: each
    process is then read in turn, the refused ones passed over."""
    import socket
    from types import SimpleNamespace

    import psutil

    from watchdog.daemon.probes import datalink

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    class Refusing:
        @staticmethod
        def net_connections(kind: str = "inet"):
            raise psutil.AccessDenied(1)

        @staticmethod
        def pids():
            return [1, os.getpid()]

        class Process:
            def __init__(self, pid: int) -> None:
                self.pid = pid

            def net_connections(self, kind: str = "inet"):
                if self.pid == 1:
                    raise psutil.AccessDenied(1)
                return psutil.Process(self.pid).net_connections(kind=kind)

            def uids(self):
                return SimpleNamespace(real=os.getuid())

    monkeypatch.setattr("watchdog.daemon.probes.platform_psutil", lambda: Refusing)
    try:
        assert datalink._psutil_listener_uid(("127.0.0.1", port)) == os.getuid()
    finally:
        server.close()
