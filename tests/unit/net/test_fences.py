"""Job fences, the daemon in process: a fence goes out at the local verdict, not after the
ladder; one signed before the receiver started is refused; nonces outlive a restart.
tests/ranks/net/test_fences.py replays a fence across a real daemon's restart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.users import UserProc, publish
from watchdog import procstat
from watchdog.daemon.act.ladder import Step
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.net import fence
from watchdog.net.http import shut
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


class Peer(ThreadingHTTPServer):
    """A peer that answers no view (404) and keeps every fence POSTed to it, with
    whether the sender's response was still under way when it came."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon, self.fences = daemon, []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_error(404)

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.fences.append((json.loads(body), bool(server.daemon.pending)))
                self.send_response(202)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        server = self
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_the_fence_goes_out_at_the_verdict_not_after_the_ladder(tmp_path, record_dir):
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"),
                        blocked_deadline=0.5, secret=SECRET)
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    peer = Peer(daemon)
    daemon.apply_settings(dataclasses.replace(
        settings, peers=(f"127.0.0.1:{peer.server_address[1]}",)))
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, "j", hung=True, world_size=2)
            for _ in range(4):
                daemon.scan()
            assert daemon.pending, "no escalation started"
            until = time.monotonic() + 30
            while not peer.fences and time.monotonic() < until:
                daemon.step_responses()
                time.sleep(0.01)
            ((sent, under_way),) = peer.fences
            assert (sent["uid"], sent["job"]) == (0, "j")
            assert under_way, "the fence waited on the ladder"
    finally:
        shut(peer)
        daemon.executor.shutdown()


def test_a_fence_signed_before_the_receiver_started_is_refused(tmp_path):
    """Its nonce may have been seen by the receiver's previous run (the cache is
    in memory): replayed just after a restart, it must not act."""
    settings = Settings(dir=str(tmp_path), state_dir=str(tmp_path), secret=SECRET)
    daemon = Daemon(settings)
    try:  # signed 5 s before the start: well within the 30 s window, so fresh otherwise
        body, headers = fence.make(SECRET, "j", "peer", "hung", None, now=daemon.started - 5)
        code, answer = daemon.fence_request(headers, body)
        assert code == 401 and "before this daemon started" in (answer.error or "")
        body, headers = fence.make(SECRET, "j", "peer", "hung", None, now=2000.5)
        verified = fence.verify(SECRET, headers, body, fence.NonceCache(), now=2001.0,
                                not_before=2000.0)
        assert verified.job == "j"
    finally:
        daemon.executor.shutdown()


def stepped_to_sigterm(daemon: Daemon, rank: UserProc) -> bool:
    """Step the daemon's ladders, as its loop does between scans, until the rank got
    SIGTERM (30 s at most)."""
    until = time.monotonic() + 30
    while signal.SIGTERM not in rank.signals() and time.monotonic() < until:
        daemon.step_responses()
        time.sleep(0.05)
    return signal.SIGTERM in rank.signals()


# Issue 57, item 10: a job named as doctor's old probe was never fenced (taken for the
# probe whatever its uid); a job name is no key, so it is fenced as "j" is.
@pytest.mark.parametrize("job", ["j", "mlx-watchdog-secret-probe"])
def test_a_fence_ends_only_the_ranks_started_before_the_job_was_found_dead(tmp_path,
                                                                           record_dir, job):
    """A job relaunched under its name on this node before a peer's late fence
    arrives is not the dead job: its ranks started after the origin found it dead."""
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"), secret=SECRET)
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, job, hung=False, world_size=2)
            daemon.scan()
            started = next(iter(daemon.ranks.values())).record.start_time
            body, headers = fence.make(SECRET, job, "peer", "hung", None, since=started - 1)
            code, answer = daemon.fence_request(headers, body)
            assert (code, answer.to_json()) == (202, {"job": job, "uid": 0, "ending": [],
                                                      "host": daemon.host})
            body, headers = fence.make(SECRET, job, "peer", "hung", None)
            assert daemon.fence_request(headers, body)[1].ending == (rank.pid,)
            assert daemon.wake.is_set()  # queued for the loop's thread, which begins it
            assert stepped_to_sigterm(daemon, rank)
    finally:
        daemon.executor.shutdown()


def test_a_fence_is_begun_on_the_loops_thread_never_the_http_one(tmp_path, record_dir):
    """The HTTP thread authenticates, picks the ranks for its answer and queues them;
    the ladder (write-ahead entry, SIGCONT, SIGTERM) begins on the loop's thread."""
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"), secret=SECRET)
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    begun: list[str] = []
    real = daemon.enforcer.begin

    def begin(*args, **kwargs):
        begun.append(threading.current_thread().name)
        return real(*args, **kwargs)

    daemon.enforcer.begin = begin  # type: ignore[method-assign]
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, "j", hung=False, world_size=2)
            daemon.scan()
            body, headers = fence.make(SECRET, "j", "peer", "hung", None)
            answers = []
            http = threading.Thread(target=lambda: answers.append(
                daemon.fence_request(headers, body)), name="http")
            http.start()
            http.join(30)
            (code, answer), = answers
            # Its incident's id given at once: the origin's incident names it.
            assert (code, answer.to_json()) == (202, {"job": "j", "uid": 0, "ending": [rank.pid],
                                                      "host": daemon.host,
                                                      "incident": answer.incident})
            assert answer.incident and re.fullmatch(r"\d{8}T\d{6}-[0-9a-f]{6}", answer.incident)
            assert begun == [] and daemon.wake.is_set() and not daemon.pending
            assert rank.signals() == []
            daemon.scan()  # the loop's next tick (woken by the fence)
            assert begun == [threading.current_thread().name]
            assert stepped_to_sigterm(daemon, rank)
            assert [r.acting.id for r in daemon.pending] == [answer.incident]
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
            rec = next(iter(daemon.ranks.values())).record
            started = procstat.wall_start(rec.start_ticks) or rec.start_time  # to a tick
            ahead = time.time() + skew
            body, headers = fence.make(SECRET, "j", "peer", "hung", None, now=ahead,
                                       since=started - 1 + skew)
            assert daemon.fence_request(headers, body)[1].ending == ()
            assert rank.signals() == []
            while time.time() < started + 0.5:
                time.sleep(0.05)
            body, headers = fence.make(SECRET, "j", "peer", "hung", None,
                                       now=time.time() + skew, since=started + 0.2 + skew)
            assert daemon.fence_request(headers, body)[1].ending == (rank.pid,)
    finally:
        daemon.executor.shutdown()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1][0]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc")
def test_a_fenced_rank_is_held_frozen_until_the_origin_ends_its_own(tmp_path, record_dir):
    """A fence naming its origin's SIGTERM 30 s ahead: the rank is frozen at once and
    not signalled meanwhile; a second fence of the job (the origin's evidence was in
    early) brings its SIGTERM forward to now. A relaunch started since is left alone."""
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"), secret=SECRET)
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, "j", hung=False, world_size=2)
            daemon.scan()
            now = time.time()
            body, headers = fence.make(SECRET, "j", "peer", "hung", None, now=now,
                                       term_at=now + 30.0)
            assert daemon.fence_request(headers, body)[1].ending == (rank.pid,)
            daemon.scan()
            # Its stacks taken meanwhile, within the fence's window (evidence on every
            # node of a fenced job), the origin's incident named as where the rest is.
            until = time.monotonic() + 20
            while time.monotonic() < until and not any(
                    r.ladder is not None and r.ladder.step is Step.HOLD for r in daemon.pending):
                daemon.step_responses()
                time.sleep(0.05)
            (held,) = daemon.pending
            assert held.ladder is not None and held.ladder.step is Step.HOLD
            taken = [os.path.basename(f) for f in held.acting.evidence or ()]
            assert f"rank0-pid{rank.pid}-native.txt" in taken, (taken, held.acting)
            assert _state(rank.pid) == "T" and signal.SIGTERM not in rank.signals()  # held
            with UserProc(0) as relaunch:
                publish(record_dir, relaunch.pid, 0, "j", hung=False, world_size=2)
                daemon.scan()
                body, headers = fence.make(SECRET, "j", "peer", "hung", None, since=now,
                                           term_at=time.time())
                assert daemon.fence_request(headers, body)[1].ending == ()
                hurried = time.monotonic()
                assert stepped_to_sigterm(daemon, rank)
                # At once, not at the hold's cap (the receiver's time box, 11 s here).
                assert time.monotonic() - hurried < 5.0
                assert relaunch.signals() == [] and _state(relaunch.pid) != "T"
    finally:
        daemon.executor.shutdown()


def test_a_challenge_is_answered_with_the_secrets_proof_and_ends_nothing(tmp_path):
    """Issue 57, item 11: `doctor`'s unsigned challenge gets a proof only the secret
    makes (never a fence's signature); a malformed one is refused; with fences off, 403."""
    settings = Settings(dir=str(tmp_path / "records"), state_dir=str(tmp_path / "state"),
                        secret=SECRET)
    os.makedirs(settings.state_dir)
    os.makedirs(settings.dir)
    daemon = Daemon(settings)
    try:
        challenge = os.urandom(16).hex()
        code, answer = daemon.fence_request({fence.CHALLENGE: challenge}, b"{}")
        assert code == 200 and answer.proof == fence.proof(SECRET, challenge)
        assert answer.proof != fence.proof("another secret, long enough", challenge)
        assert answer.proof != fence.sign(SECRET, challenge, b"{}")
        assert not daemon.wake.is_set()
        assert daemon.fence_request({fence.CHALLENGE: "../x"}, b"{}")[0] == 401
    finally:
        daemon.executor.shutdown()
