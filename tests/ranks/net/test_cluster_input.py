"""A peer's malformed /status drops a rank, never the cluster view.

A real HTTP server on 127.0.0.1 plays the peer; `cluster status` runs as a process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support.ranks import REPO, base_env
from tests.unit.net.test_cluster_input import MALFORMED, rank
from watchdog.daemon.act.peers import Peers
from watchdog.daemon.config import Settings
from watchdog.net.http import shut
from watchdog.status import ComputingRank, NodeStatus


def peer_status() -> dict[str, Any]:
    """A peer's answer: one good rank (computing) among every kind of malformed one."""
    return {"host": "peer", "ranks": [*MALFORMED, rank(pid=11)], "reboot_required": False}


@pytest.fixture
def peer() -> Iterator[str]:
    body = json.dumps(peer_status()).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        shut(server)


@pytest.mark.ranks
def test_cluster_status_survives_a_malformed_peer(peer):
    done = subprocess.run([sys.executable, "-m", "watchdog.cli", "cluster", "status", peer],
                          capture_output=True, text=True, timeout=60, env=base_env("/tmp"),
                          cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert re.search(r"^  RANK +HOST +PID +STATE", done.stdout, re.M), done.stdout
    assert re.search(r"^  1 +peer +11 ", done.stdout, re.M), done.stdout


@pytest.mark.ranks
def test_the_slow_peer_hold_still_sees_the_computing_rank(peer, tmp_path):
    """Peers.view (which the slow-peer hold asks) with a malformed rank in the answer:
    the good rank computing on the peer is still reported, so the job is held."""
    peers = Peers(Settings(peers=(peer,), peer_timeout=5.0, state_dir=str(tmp_path)),
                  "here", None, 0.0)  # type: ignore[arg-type]
    local = NodeStatus.from_json({"host": "here", "ranks": [
        rank(host="here", pid=20, rank=0, state="suspect", phase="wait", computing=False)]})
    view = peers.view(0, "j", local)
    assert view is not None
    assert view.computing == (ComputingRank(rank=1, host="peer", pid=11),)
    assert view.to_json()["computing"] == [{"rank": 1, "host": "peer", "pid": 11}]
