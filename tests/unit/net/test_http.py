"""The daemon's HTTP endpoint in process: `serve` (net/http.py) on 127.0.0.1, for what a
live daemon cannot show on demand (a loop that stopped scanning, a failing snapshot), write
methods refused and idle connections let go. tests/ranks/net/test_http.py runs the real
daemon's endpoint over a real ring job.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse

import pytest

from tests.support.ranks import http_get
from watchdog.net import http as httpd
from watchdog.status import NodeStatus

WRITE_METHODS = ("POST", "PUT", "DELETE", "PATCH")


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname, parts.port


def request(url: str, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*host_port(url), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# -- httpd.serve, unit-level ---------------------------------------------------------------


@pytest.fixture
def endpoint():
    """httpd.serve on 127.0.0.1:0 with a snapshot and health the test controls."""
    state = {"healthy": True, "snapshot": {"host": "h", "ranks": []}, "fail": False}

    def snapshot() -> NodeStatus:
        if state["fail"]:
            raise RuntimeError("snapshot broke")
        return NodeStatus.from_json(state["snapshot"])

    server = httpd.serve(("127.0.0.1", 0), snapshot, lambda: state["healthy"])
    host, port = server.server_address[:2]
    try:
        yield f"http://{host}:{port}", state
    finally:
        httpd.shut(server)


def test_shut_stops_serving_at_once_not_at_the_loops_next_poll():
    # A daemon's stop paid the serving loop's half-second poll (`shutdown` waits for it);
    # `shut` wakes the loop: a restart by launchd or systemd is not held by it.
    server = httpd.serve(("127.0.0.1", 0), lambda: NodeStatus(host="h"), lambda: True)
    host, port = server.server_address[:2]
    assert http_get(f"http://{host}:{port}/healthz")[0] == 200
    time.sleep(0.1)  # the loop is in its poll
    began = time.monotonic()
    httpd.shut(server)
    assert time.monotonic() - began < 0.3
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=1).close()


@pytest.mark.slow
def test_healthz_is_503_when_the_loop_has_not_scanned_recently(endpoint):
    url, state = endpoint
    state["healthy"] = False
    code, _, body = http_get(url + "/healthz")
    assert code == 503 and b"no recent scan" in body
    # /metrics and /status still answer: the alert needs the data.
    assert http_get(url + "/metrics")[0] == 200
    assert http_get(url + "/status")[0] == 200
    state["healthy"] = True
    assert http_get(url + "/healthz")[0] == 200


@pytest.mark.slow
def test_a_failing_snapshot_is_a_500_and_the_server_keeps_serving(endpoint):
    url, state = endpoint
    state["fail"] = True
    assert http_get(url + "/metrics")[0] == 500
    assert http_get(url + "/status")[0] == 500
    state["fail"] = False
    assert http_get(url + "/metrics")[0] == 200
    served = json.loads(http_get(url + "/status")[2])
    assert served["host"] == "h" and served["ranks"] == []


@pytest.mark.slow
def test_unit_write_methods_are_405(endpoint):
    url, _ = endpoint
    for method in (*WRITE_METHODS, "OPTIONS"):
        assert request(url, method, "/status", b"{}")[0] == 405, method


@pytest.mark.slow
def test_an_idle_connection_does_not_hold_a_thread_forever(endpoint):
    """A client that connects and sends half a request line (or nothing) must
    be dropped after a timeout: one thread per connection, no limit, so idle
    sockets would otherwise pile up threads in the daemon without bound."""
    url, _ = endpoint
    host, port = host_port(url)
    with socket.create_connection((host, port), timeout=20) as s:
        s.sendall(b"GET /metr")
        started = time.monotonic()
        assert http_get(url + "/healthz")[0] == 200  # meanwhile, others are served
        try:
            answer = s.recv(1024)  # b"" (closed) or a 408: either way, not forever
        except TimeoutError:
            answer = None
        waited = time.monotonic() - started
    assert answer is not None and waited < 20, "an idle connection was kept open for 20 s"


def raw(url: str, head: bytes) -> bytes:
    """Send `head` as is; the first bytes of the answer."""
    with socket.create_connection(host_port(url), timeout=10) as s:
        try:
            s.sendall(head)
        except OSError:
            pass  # the server answered and closed mid-head
        return s.recv(4096)


@pytest.mark.slow
def test_a_large_request_head_is_refused_before_it_is_parsed(endpoint):
    """Issue 30, item 2: the head is capped in bytes and lines before the standard
    parser (which takes 100 headers of 64 KiB, ~40 ms of the daemon's interpreter
    each) sees it: 431. A scrape and a fence's signed headers fit."""
    url, _ = endpoint
    pad = b"".join(b"X-Pad%d: %s\r\n" % (n, b"a" * 1024) for n in range(24))  # 24 KiB
    answer = raw(url, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + pad + b"\r\n")
    assert answer.startswith(b"HTTP/1.0 431"), answer[:80]
    long_line = b"GET /" + b"a" * (httpd.MAX_HEAD_BYTES + 10) + b" HTTP/1.1\r\n\r\n"
    assert raw(url, long_line).startswith(b"HTTP/1.0 431")
    many = {f"X-H{n}": "v" for n in range(httpd.MAX_HEADERS + 1)}
    assert request(url, "GET", "/metrics", headers=many)[0] == 431
    signed = {"X-MLX-Watchdog-Signature": "s" * 64, "X-MLX-Watchdog-Timestamp": "1" * 20}
    code, body = request(url, "GET", "/metrics", headers=signed)
    assert code == 200 and b"mlx_watchdog_build_info" in body
