"""A quiet hang, pure (issue 45): frames.asleep reads what a rank with no thread busy
waits in, and the detector ends its wait at the deadline only when nothing explains it."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.daemon.test_detector import BASE, NS, ORIGIN, RULES
from watchdog.daemon.judge.detector import Detector
from watchdog.daemon.judge.frames import Reading, asleep
from watchdog.daemon.judge.sighting import FRESH, Sighting, Sockets
from watchdog.daemon.probes import ProcessSample
from watchdog.states import FrameKind, Phase, State

MAIN = 4242
EVAL = ("__futex_abstimed_wait_common64", "pthread_cond_wait",
        "std::condition_variable::wait(std::unique_lock<std::mutex>&)",
        "mlx::core::eval_impl(std::vector<mlx::core::array>, bool)", "mlx::core::eval",
        "_PyEval_EvalFrameDefault")
RING = ("__GI___poll", "recv", "mlx::core::distributed::ring::SocketThread::worker()",
        "start_thread")
SAVE = ("__libc_write", "_io_FileIO_write", "_PyEval_EvalFrameDefault")
IDLE = ("epoll_wait", "select_epoll_poll", "_PyEval_EvalFrameDefault")


@pytest.mark.parametrize("stacks, gpu, kind, words", [
    ({MAIN: EVAL, 7: RING, 8: IDLE}, None, FrameKind.WAITING,
     "main thread waits in core::eval_impl"),
    ({7: RING, MAIN: EVAL}, False, FrameKind.WAITING, "GPU time flat"),
    ({MAIN: EVAL, 9: SAVE}, None, FrameKind.COMPUTING, "write"),  # a checkpoint's bytes are its own
    ({MAIN: EVAL}, True, FrameKind.COMPUTING, "GPU time advances"),
    ({MAIN: IDLE}, None, FrameKind.UNKNOWN, "none in a wait"),
    ({}, None, FrameKind.UNKNOWN, "no native stack"),
])
def test_what_a_rank_with_no_thread_busy_waits_in(stacks, gpu, kind, words):
    seen = asleep(stacks, "ring", gpu, main=MAIN)
    assert seen.kind == kind and words in seen.what, seen


def test_a_fence_wait_is_a_wait():
    fence = ("__psynch_cvwait", "std::condition_variable::wait", "mlx::core::Fence::wait")
    assert asleep({1: fence}, "jaccl").kind == FrameKind.WAITING


QUIET = Reading(FrameKind.WAITING, "main thread waits in eval_impl -> pthread_cond_wait")


def judge(io_moves: bool = False, sockets: float | None = 30.0, seen: Reading | None = QUIET,
          world: int = 2, expect: float = 0.0, spin: float = 0.0,
          offsets: bool | None = None, sampled: float | None = None) -> list:
    """A wait begun at 0, ticks each second to 30 s past a 10 s deadline; the verdicts.
    `sampled`: when its one stack sample was taken (None: a fresh one at every tick)."""
    detector = Detector(RULES)
    record = dataclasses.replace(BASE, phase=Phase.WAIT, op="eval", wait_since_ns=ORIGIN,
                                 last_progress_ns=ORIGIN, waits_entered=10, world_size=world,
                                 expect_seconds=expect,
                                 expect_since_ns=ORIGIN if expect else 0)
    verdicts = []
    for t in range(31):
        sample = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "sleeping",
                               ((1, 0.001 * t), (2, spin * t)),
                               io=(100 + (t if io_moves else 0), 50),
                               offsets=None if offsets is None else 7 + (t if offsets else 0))
        read = Sockets(sockets, 0, False) if sockets is not None else None
        verdicts.append(detector.observe(record, sample, ORIGIN + t * NS, Sighting(
            asleep=seen, sockets=read, age=0.0 if sampled is None else t - sampled)))
    return verdicts


def test_asleep_and_still_past_the_deadline_is_a_quiet_hang_ended_there():
    verdicts = judge()
    due = [n for n, v in enumerate(verdicts) if v.act]
    assert due and due[0] <= RULES.deadline + RULES.confirm, due
    v = verdicts[due[0]]
    assert v.state == State.STALLED and v.quiet and "nothing read, written or sent" in v.quiet
    assert any("quiet:" in v.reason and not v.act for v in verdicts)  # said before it ends


def test_status_says_quiet_while_the_wait_runs_toward_a_longer_deadline():
    rules = dataclasses.replace(RULES, deadline=60.0)
    detector = Detector(rules)
    record = dataclasses.replace(BASE, phase=Phase.WAIT, op="eval", wait_since_ns=ORIGIN,
                                 last_progress_ns=ORIGIN, waits_entered=10)
    said = []
    for t in range(0, 50, 5):
        sample = ProcessSample(BASE.pid, BASE.start_time, BASE.uid, "sleeping", ((1, 0.0),),
                               io=(100, 50))
        v = detector.observe(record, sample, ORIGIN + t * NS,
                             Sighting(asleep=QUIET, sockets=Sockets(t, 0, False), age=0.0))
        said.append((v.state, "quiet:" in v.reason, v.act))
    assert (State.SUSPECT, True, False) in said and not any(act for *_, act in said)


@pytest.mark.parametrize("why", [
    dict(io_moves=True),  # a save or a load: bytes move
    dict(offsets=True),  # a Mac's save to a FIFO or a network mount: its file's offset moves
    dict(sockets=1.0),  # bytes moved on its sockets a moment ago
    dict(sockets=None),  # its sockets not read (its peers' bytes may move)
    dict(seen=Reading(FrameKind.COMPUTING, "thread 9 sits in write")),  # a file write
    dict(seen=None),  # no fresh sample
    dict(expect=600.0),  # the user's own deadline for this wait
    dict(spin=1.0),  # a thread spins: today's stalled, not quiet
])
def test_anything_that_explains_the_wait_keeps_todays_rules(why):
    verdicts = judge(**why)
    assert not any(v.quiet for v in verdicts)
    if "spin" not in why:
        assert not any(v.act for v in verdicts), [v.reason for v in verdicts if v.act]


def test_one_process_alone_has_no_sockets_to_read():
    verdicts = judge(sockets=None, world=1)
    assert any(v.act and v.quiet for v in verdicts)


def test_a_files_offset_standing_still_explains_nothing():
    verdicts = judge(offsets=False)
    assert any(v.act and v.quiet for v in verdicts)


def test_an_old_sample_speaks_while_nothing_moves_but_only_a_fresh_one_ends_the_wait():
    # Sampled once, as the wait began (the sampler holds a quiet rank until its deadline
    # nears): still "quiet" in status as its sample ages, never acted on from it.
    verdicts = judge(sampled=0.0)
    assert any(v.quiet for v in verdicts[FRESH_AT:]), [v.reason for v in verdicts]
    assert not any(v.act for v in verdicts), [v.reason for v in verdicts if v.act]


def test_an_old_sample_says_nothing_once_anything_moved_after_it():
    # Its sockets' bytes moved 5 s ago, after its sample: that speaks for no one.
    verdicts = judge(sampled=0.0, sockets=5.0)
    assert not any(v.quiet for v in verdicts[FRESH_AT:]), [v.reason for v in verdicts]


FRESH_AT = int(FRESH) + 1  # the first tick at which a sample taken at 0 is old
