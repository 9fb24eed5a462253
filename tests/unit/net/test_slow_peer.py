"""A slowly answering peer (one header byte every 0.5 s, under peer_timeout per read)
beside a good one, over real loopback sockets: every exchange with a peer has a total
bound of its own, so the slow one never delays, voids or queues the good one's answer
or fence, nor a later fence; the CLI returns within its timeouts; the daemon exits
within its stop bound on SIGTERM."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.ranks import DaemonProc, wait_for
from tests.support.users import UserProc, publish
from watchdog.daemon.act import peers as peers_mod
from watchdog.daemon.config import Settings
from watchdog.net import cluster, fence
from watchdog.status import NodeStatus

pytestmark = pytest.mark.slow

SECRET = "correct horse battery staple"


class Dripping:
    """A peer that reads the request, then answers one header byte every `every` s,
    for ever (until closed)."""

    def __init__(self, every: float = 0.5) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.peer = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.every, self.stopped = every, threading.Event()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.2)
            try:
                conn.recv(1 << 16)
            except OSError:
                pass
            head = b"HTTP/1.0 200 OK\r\nX-Slow: " + b"a" * 10_000
            for byte in head:
                if self.stopped.wait(self.every):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


class Good(ThreadingHTTPServer):
    """A peer answering at once: its /status (`status`), and every fence kept."""

    daemon_threads = True

    def __init__(self, status: dict) -> None:
        self.status, self.fences = status, []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = json.dumps(server.status).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.fences.append(json.loads(body))
                self.send_response(202)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        server = self
        super().__init__(("127.0.0.1", 0), Handler)
        self.peer = f"127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def computing(job: str = "j", uid: int = 0) -> dict:
    """A peer's /status: rank 1 of `job` computing there (a slow peer, not a hang)."""
    return {"host": "good", "ranks": [{
        "rank": 1, "state": "running", "phase": "running", "host": "good", "job": job,
        "uid": uid, "pid": 4242, "world_size": 2, "progress": 10, "computing": True,
        "last_collective": {"number": 1, "op": "eval"}}]}


@pytest.fixture
def peers():
    slow, good = Dripping(), Good(computing())
    try:
        yield slow, good
    finally:
        slow.close()
        good.close()


def test_gather_answers_the_good_peer_within_the_bound_beside_a_dripping_one(peers):
    slow, good = peers
    began = time.monotonic()
    answers = cluster.gather([slow.peer, good.peer], 1.0)
    took = time.monotonic() - began
    assert took < 1.6, f"gather took {took:.1f}s with peer_timeout 1s"
    assert [a.ok for a in answers] == [False, True]
    assert "within 1s" in (answers[0].error or "")
    assert answers[1].status is not None and answers[1].status.ranks[0].rank == 1


def test_each_fence_reaches_the_good_peer_at_once_however_many_beside_a_dripping_one(peers):
    slow, good = peers
    settings = Settings(peers=(slow.peer, good.peer), secret=SECRET, peer_timeout=1.0)
    with_peers = peers_mod.Peers(settings, "me", None, 0.0)  # type: ignore[arg-type]
    began = time.monotonic()
    for n in range(4):
        with_peers.fence(0, f"j{n}", "test", None)
    wait_for(lambda: len(good.fences) == 4, 3, what="four fences at the good peer")
    took = time.monotonic() - began
    assert took < 1.0, f"the good peer's fences took {took:.1f}s: queued behind the slow one"
    assert sorted(f["job"] for f in good.fences) == ["j0", "j1", "j2", "j3"]
    began = time.monotonic()
    sent = fence.send((slow.peer, good.peer), SECRET, "k", "me", "test", None, 1.0)
    assert time.monotonic() - began < 1.6
    assert sent[0].answer is None and "within 1s" in (sent[0].error or "")
    assert sent[1].answer is not None and sent[1].error is None


def test_a_view_beside_a_dripping_peer_holds_on_the_good_peers_computing_rank(peers):
    slow, good = peers
    settings = Settings(peers=(slow.peer, good.peer), peer_timeout=1.0)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        with_peers = peers_mod.Peers(settings, "me", pool, 0.0)
        local = NodeStatus.from_json({"host": "me", "ranks": [{
            "rank": 0, "state": "blocked", "phase": "wait", "host": "me", "job": "j",
            "uid": 0, "pid": 1, "world_size": 2, "progress": 1,
            "last_collective": {"number": 1, "op": "eval"}}]})
        began = time.monotonic()
        view = with_peers.view(0, "j", local)
        took = time.monotonic() - began
    assert took < 1.6, f"the view took {took:.1f}s"
    assert view is not None and view.unreachable == (slow.peer,)
    assert [(r.rank, r.host) for r in view.computing] == [(1, "good")]


def _cli(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "watchdog.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)
    return done, time.monotonic() - began


def test_the_cli_returns_within_its_timeouts_beside_a_dripping_peer(peers, tmp_path):
    slow, good = peers
    state = tmp_path / "state"
    state.mkdir()
    done, took = _cli("cluster", "status", slow.peer, good.peer, "--timeout", "2",
                      "--state-dir", str(state), "--json", timeout=30)
    assert took < 2 + 3, f"cluster status --timeout 2 took {took:.1f}s"  # + interpreter start
    nodes = {n["peer"]: n["ok"] for n in json.loads(done.stdout)["nodes"]}
    # The state directory exists and no daemon publishes there: this node is said down.
    assert nodes == {slow.peer: False, good.peer: True, "local": False}
    config = tmp_path / "watchdog.toml"
    config.write_text(f'peers = ["{slow.peer}"]\npeer_timeout = 10\n')
    done, took = _cli("--config", str(config), "node", "wait-healthy", "--timeout", "3",
                      "--state-dir", str(state), timeout=60)
    assert done.returncode != 0 and "unreachable" in done.stderr, done.stderr
    assert took < 3 + 3, f"node wait-healthy --timeout 3 took {took:.1f}s"


def test_the_daemon_exits_within_its_stop_bound_after_fencing_a_dripping_peer(
        peers, tmp_path, record_dir):
    slow, good = peers
    daemon = DaemonProc(record_dir, tmp_path / "state", "--peers", slow.peer, "--peers",
                        good.peer, secret=SECRET, peer_timeout=1, blocked_deadline=0.5,
                        grace=0.5, kill_timeout=1, evidence_timeout=0.5)
    good.status = {"host": "good", "ranks": []}  # nothing computes there: the job is ended
    daemon.start()
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, "j", hung=True, world_size=2)
            wait_for(lambda: good.fences, 20, what="the fence at the good peer")
            wait_for(lambda: slow.connections >= 2, 10, what="the slow peer asked and fenced")
            began = time.monotonic()
            code = daemon.stop()
            took = time.monotonic() - began
    finally:
        daemon.stop()
    assert code != -9, "the daemon did not exit on SIGTERM: killed"
    # Its bound: the ladder's steps (a few seconds here), never a peer's drip.
    assert took < 8, f"the daemon took {took:.1f}s to exit on SIGTERM"
