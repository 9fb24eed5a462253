"""Job fences, the daemon in process: a fence goes out at the local verdict, not after the
ladder; one signed before the receiver started is refused; nonces outlive a restart.
tests/ranks/net/test_fences.py replays a fence across a real daemon's restart.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.support.users import UserProc, publish
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.net import fence
from watchdog.status import Fence

SECRET = "correct horse battery staple"


def test_nonces_outlive_a_restart_and_expire_after_the_window(tmp_path):
    path = str(tmp_path / fence.NONCES)
    now = 1_000_000.0
    assert fence.NonceCache(path=path, now=now).add("n1", now)
    assert not fence.NonceCache(path=path, now=now + 5).add("n1", now + 5)
    # Twice the window later the nonce is stale (its timestamp would be refused) and goes.
    later = now + 2 * fence.WINDOW + 1
    assert fence.NonceCache(path=path, now=later).add("n1", later)


def test_an_unreadable_nonce_file_refuses_fences_for_the_window(tmp_path):
    path = tmp_path / fence.NONCES
    path.mkdir()  # reading it fails (EISDIR): what it held is unknown
    now = time.time()
    nonces = fence.NonceCache(path=str(path), now=now)
    body, headers = fence.make(SECRET, "job", "sender", "test", None, now=now)
    with pytest.raises(fence.FenceRejected, match="refused until"):
        fence.verify(SECRET, headers, body, nonces, now=now)
    later = now + 2 * fence.WINDOW + 1
    body, headers = fence.make(SECRET, "job", "sender", "test", None, now=later)
    with pytest.raises(fence.FenceRejected, match="cannot keep"):  # still a directory
        fence.verify(SECRET, headers, body, nonces, now=later)


def test_the_fence_goes_out_at_the_verdict_not_after_the_ladder(tmp_path, record_dir):
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"),
                        blocked_deadline=0.5, peers=("127.0.0.1:9",), secret=SECRET)
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    fenced: list[tuple] = []
    ladder_may_end = threading.Event()
    daemon._fence_peers = lambda *args: fenced.append(args)  # type: ignore[method-assign]

    def slow_capture(incident_id, targets):  # the ladder's first step: long
        ladder_may_end.wait(30)
        return []

    daemon.enforcer.capture = slow_capture  # type: ignore[method-assign]
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, "j", hung=True, world_size=2)
            for _ in range(4):
                daemon.scan()
            assert daemon.pending, "no escalation started"
            assert fenced and fenced[0][:2] == (0, "j"), "the fence waited on the ladder"
    finally:
        ladder_may_end.set()
        daemon.executor.shutdown()


def test_a_fence_signed_before_the_receiver_started_is_refused(tmp_path):
    """Its nonce may have been seen by the receiver's previous run (the cache is
    in memory): replayed just after a restart, it must not act."""
    settings = Settings(dir=str(tmp_path), state_dir=str(tmp_path), secret=SECRET)
    daemon = Daemon(settings)
    try:  # signed 5 s before the start: well within the 30 s window, so fresh otherwise
        body, headers = fence.make(SECRET, "j", "peer", "hung", None, now=daemon.started - 5)
        code, answer = daemon.fence_request(headers, body)
        assert code == 401 and "before this daemon started" in answer["error"]
        body, headers = fence.make(SECRET, "j", "peer", "hung", None, now=2000.5)
        verified = fence.verify(SECRET, headers, body, fence.NonceCache(), now=2001.0,
                                not_before=2000.0)
        assert verified.job == "j"
    finally:
        daemon.executor.shutdown()


def test_a_fence_ends_only_the_ranks_started_before_the_job_was_found_dead(tmp_path,
                                                                           record_dir):
    """A job relaunched under its name on this node before a peer's late fence
    arrives is not the dead job: its ranks started after the origin found it dead."""
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"), secret=SECRET)
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, "j", hung=False, world_size=2)
            daemon.scan()
            started = next(iter(daemon.ranks.values())).record.start_time
            body, headers = fence.make(SECRET, "j", "peer", "hung", None, since=started - 1)
            assert daemon.fence_request(headers, body) == (202, {"job": "j", "uid": 0,
                                                                 "ending": []})
            body, headers = fence.make(SECRET, "j", "peer", "hung", None)
            assert daemon.fence_request(headers, body)[1]["ending"] == [rank.pid]
            until = time.monotonic() + 30
            while signal.SIGTERM not in rank.signals() and time.monotonic() < until:
                time.sleep(0.05)
            assert signal.SIGTERM in rank.signals()
    finally:
        daemon.executor.shutdown()


def test_a_fence_without_since_is_as_old_as_its_signature():
    old = Fence(job="j", uid=0, origin="o", reason=None, culprit=None, time=100.0)
    assert old.ends(99.0) and not old.ends(101.0)
    assert Fence(job="j", uid=0, origin="o", reason=None, culprit=None, time=100.0,
                 since=50.0).ends(49.0)
    assert not Fence(job="j", uid=0, origin="o", reason=None, culprit=None, time=100.0,
                     since=50.0).ends(60.0)


@pytest.mark.slow
def test_a_sender_whose_clock_is_ahead_cannot_end_a_relaunch(tmp_path):
    """Issue 30, item 7: the sender's clock is 20 s ahead (inside the 30 s window)
    and it found the job dead 1 s before our rank (the relaunch) started. `since`
    is taken on our clock (the sender's own age of it, from now): the relaunch is
    left alone; a fence for a job found dead after our rank started still ends it."""
    record_dir = tmp_path / "rec"
    record_dir.mkdir()
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"), secret=SECRET)
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    skew = 20.0
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, "j", hung=False, world_size=2)
            daemon.scan()
            started = next(iter(daemon.ranks.values())).record.start_time
            ahead = time.time() + skew
            body, headers = fence.make(SECRET, "j", "peer", "hung", None, now=ahead,
                                       since=started - 1 + skew)
            assert daemon.fence_request(headers, body)[1]["ending"] == []
            assert rank.signals() == []
            while time.time() < started + 0.5:
                time.sleep(0.05)
            body, headers = fence.make(SECRET, "j", "peer", "hung", None,
                                       now=time.time() + skew, since=started + 0.2 + skew)
            assert daemon.fence_request(headers, body)[1]["ending"] == [rank.pid]
    finally:
        daemon.executor.shutdown()
