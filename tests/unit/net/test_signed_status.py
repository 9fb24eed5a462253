"""A peer's `/status` counts for a cross-node wedge only signed with the shared secret
(issue 48, defect 3): anything answering at a peer's address could otherwise say
"rank 1 waits, frames waiting, quiet" while rank 1 computes, and have a healthy job
ended. And a peer's strings are cut: a 4 MiB frames text is no 4 MB log line.
Real endpoints (net/http.py's `serve`) on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from watchdog.cause import REFUSED
from watchdog.net import cluster
from watchdog.net import http as httpd
from watchdog.status import MAX_TEXT, NodeStatus

pytestmark = pytest.mark.slow

SECRET = "correct horse battery staple"
LIE = {"host": "b", "time": 1.0, "ranks": [
    {"job": "j", "uid": 501, "rank": 1, "world_size": 2, "phase": "wait", "state": "running",
     "frames_kind": "waiting", "frames": "x" * (4 << 20), "quiet_seconds": 60.0}]}


def endpoint(secret: str | None, status: dict = LIE):
    server = httpd.serve(("127.0.0.1", 0), lambda: NodeStatus.from_json(status),
                         lambda: True, secret=lambda: secret)
    return server, f"127.0.0.1:{server.server_address[1]}"


class Replayer(BaseHTTPRequestHandler):
    """A liar that replays a signed answer it recorded (body and signature)."""

    recorded: tuple[bytes, str] = (b"", "")

    def do_GET(self) -> None:  # noqa: N802
        body, signature = self.recorded
        self.send_response(200)
        self.send_header(cluster.SIGNATURE, signature)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_peer_with_the_secret_signs_and_its_answer_counts() -> None:
    server, peer = endpoint(SECRET)
    try:
        answer = cluster.fetch(peer, 5.0, SECRET)
        assert answer.ok and answer.status is not None, answer.error
        assert len(answer.status.ranks[0].frames or "") == MAX_TEXT  # cut, not 4 MiB
    finally:
        httpd.shut(server)


@pytest.mark.parametrize("liar", ["unsigned", "other secret", "replayed"])
def test_a_lying_peer_is_no_answer(liar: str) -> None:
    honest, honest_peer = endpoint(SECRET)
    servers = [honest]
    try:
        if liar == "replayed":
            nonce = "0" * 32
            import urllib.request
            req = urllib.request.Request(f"http://{honest_peer}/status",
                                         headers={cluster.NONCE: nonce})
            with urllib.request.urlopen(req, timeout=5) as got:  # noqa: S310
                Replayer.recorded = (got.read(), got.headers[cluster.SIGNATURE])
            assert Replayer.recorded[1] == cluster.sign_status(SECRET, nonce,
                                                               Replayer.recorded[0])
            replayer = ThreadingHTTPServer(("127.0.0.1", 0), Replayer)
            threading.Thread(target=replayer.serve_forever, daemon=True).start()
            servers.append(replayer)
            peer = f"127.0.0.1:{replayer.server_address[1]}"
        else:
            server, peer = endpoint(None if liar == "unsigned" else "another secret, 16+")
            servers.append(server)
        assert cluster.fetch(peer, 5.0).ok  # read by anyone without the secret: as before
        answer = cluster.fetch(peer, 5.0, SECRET)
        assert not answer.ok and answer.error == REFUSED, answer  # cause secret_refused
        [gathered] = cluster.gather([peer], 5.0, SECRET)
        assert not gathered.ok
    finally:
        for server in servers:
            httpd.shut(server)


def test_every_string_read_through_the_contract_is_cut() -> None:
    status = NodeStatus.from_json(json.loads(json.dumps(
        {**LIE, "host": "h" * (1 << 20)})))
    assert len(status.host or "") == MAX_TEXT
    assert len(status.ranks[0].frames or "") == MAX_TEXT
