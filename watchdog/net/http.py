"""The daemon's HTTP endpoint: the request caps, the routes and their answers.

`serve()` runs one `ThreadingHTTPServer` with its GET routes: `/metrics` (rendered
by the collector, metrics.py), `/status` (the snapshot's JSON), `/healthz`, and each
job's health for a load balancer (`/jobs/<job>/health`, `/jobs/<job>/ranks/<r>/health`:
health.py, answered from an index built once per snapshot), and
`POST /fence` when a secret is set (a peer's signed request to end a job's ranks: the
one request that changes state, authenticated in `net/fence.py` and answered by the
callable the daemon hands in, its `fence_request`). Every other method or path is
refused. With a secret, a `/status` asked with a nonce is signed over it (a peer
builds a cross-node wedge only from signed answers: net/cluster.py).

Any local user can connect, so the endpoint is bounded: at most
`MAX_CONNECTIONS` at once (one more is closed at accept), and each connection
gets `REQUEST_SECONDS` in all (the socket timeout is per `recv`: a client
sending a byte every few seconds would hold its thread and descriptor for ever
without a whole-request limit). The daemon's descriptors stay the scan's.
The request line and headers are read under a byte and line cap before any
parsing (`MAX_HEAD_BYTES`, `MAX_HEADERS`; 431 past them): the standard parser
takes 100 headers of 64 KiB each, tens of milliseconds of the daemon's one
interpreter per request, enough for a few hundred connections to starve the
scan. `/metrics` and `/status` are rendered once per snapshot, not per request.
And connections are accepted at most `ACCEPTS_PER_SECOND` (the accepting thread
waits, the rest stays in the kernel's backlog): whatever clients do, HTTP costs
the daemon's interpreter a bounded share, never the scan's.
Connections from the configured peers' addresses have slots of their own
(`PEER_CONNECTIONS`) and are not paced: a local user holding every shared slot
cannot keep a peer's fence out, nor its read of our reboot flag.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from watchdog.net import health
from watchdog.net.cluster import MAX_NONCE, NONCE, SIGNATURE, sign_status
from watchdog.net.metrics import JOB_LABEL, Snapshot, exposition
from watchdog.status import FenceAnswer, NodeStatus

log = logging.getLogger(__name__)
MAX_FENCE_BODY = 64 << 10
MAX_CONNECTIONS = 32  # served at once; Prometheus, a dashboard and a few CLIs need a handful
REQUEST_SECONDS = 10.0  # a whole request, from accept to the last byte sent
MAX_HEAD_BYTES = 16 << 10  # the request line and every header, in all
MAX_HEADERS = 32  # header lines (a scrape sends 5, a signed fence 8)
PEER_CONNECTIONS = 16  # slots of the peers' own addresses, beside the shared ones
ACCEPTS_PER_SECOND = 100.0  # a scrape every few seconds, a few CLIs: far below this
# A peer's fence: (headers, body, sender's address) -> (HTTP status, JSON answer); the
# daemon's `fence_request`.
FenceHandler = Callable[[Any, bytes, str], tuple[int, FenceAnswer]]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "mlx-watchdog"
    timeout = 10  # a client that sends half a request must not hold a thread forever

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Log the request at debug level only."""
        log.debug("http %s: " + format, self.client_address[0], *args)

    def _read_head(self) -> bytes | None:
        """The request line and headers, up to the blank line, within the caps
        (None: the client closed first); raises ValueError past a cap."""
        head, lines = bytearray(), 0
        while True:
            line = self.rfile.readline(MAX_HEAD_BYTES - len(head) + 1)
            head += line
            if len(head) > MAX_HEAD_BYTES or lines > MAX_HEADERS:
                raise ValueError("request head too large")
            if not line:
                return bytes(head) if head else None
            if lines and line in (b"\r\n", b"\n"):
                return bytes(head)
            lines += 1

    def handle_one_request(self) -> None:
        """As the standard one, but the head is read under the caps before parsing."""
        try:
            try:
                head = self._read_head()
            except ValueError:
                self.requestline, self.request_version, self.command = "", "", ""
                self.close_connection = True
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
                return
            if head is None:
                self.close_connection = True
                return
            body = self.rfile
            self.rfile = io.BytesIO(head)  # type: ignore[assignment]
            try:
                self.raw_requestline = self.rfile.readline(MAX_HEAD_BYTES + 1)
                parsed = self.parse_request()
            finally:
                self.rfile = body
            if not parsed:
                return  # its error was sent
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(HTTPStatus.NOT_IMPLEMENTED)
                return
            method()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        """Answer `/metrics`, `/status` (signed over a nonce), `/healthz` and a job's health."""
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                self._send(200, self.server.rendered("metrics"),
                           "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/status":
                body, extra = self.server.rendered("status"), {}
                nonce, secret = self.headers.get(NONCE), self.server.secret()
                if nonce and secret and len(nonce) <= MAX_NONCE:
                    extra[SIGNATURE] = sign_status(secret, nonce, body)
                self._send(200, body, "application/json", extra)
            elif path == "/healthz":
                ok = self.server.healthy()
                self._send(200 if ok else 503, b"ok\n" if ok else b"no recent scan\n")
            elif isinstance(asked := health.parse(self.path), health.Asked):
                code, body = self.server.health().answer(asked)
                self._send(code, body, "application/json", {"Cache-Control": "no-store"})
            elif asked is not None:
                self._send(400, f"{asked}\n".encode())
            else:
                self._send(404, b"not found\n")
        except Exception:  # noqa: BLE001 - one bad request must not stop the endpoint
            log.exception("serving %s failed", path)
            self._send(500, b"internal error\n")

    do_HEAD = do_GET  # noqa: N815

    def _refuse(self) -> None:
        self._send(405, b"read-only endpoint\n")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse  # noqa: N815

    def do_POST(self) -> None:  # noqa: N802
        """Only `/fence`, and only when the daemon has a secret; the rest is read-only."""
        if self.path.split("?", 1)[0] != "/fence" or self.server.fence is None:
            self._refuse()
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if length <= 0:  # an empty POST (curl -X POST) is no fence: say what one is
            self._send(411 if length < 0 else 400,
                       b"a fence is a signed JSON body (Content-Length required): it is "
                       b"sent by a peer's daemon, not by hand (docs/cluster.md)\n")
            return
        if length > MAX_FENCE_BODY:
            self._send(413, f"fence body larger than {MAX_FENCE_BODY} bytes\n".encode())
            return
        try:
            code, answer = self.server.fence(self.headers, self.rfile.read(length),
                                             str(self.client_address[0]))
        except Exception:  # noqa: BLE001
            log.exception("fence request failed")
            code, answer = 500, FenceAnswer(error="internal error")
        self._send(code, json.dumps(answer.to_json()).encode(), "application/json")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # socketserver's 5 drops a burst of scrapes and CLIs

    def __init__(self, address: tuple[str, int], snapshot: Snapshot,
                 healthy: Callable[[], bool], fence: FenceHandler | None,
                 peers: tuple[str, ...] = (), job_label: str = JOB_LABEL,
                 secret: Callable[[], str | None] = lambda: None,
                 health: Callable[[], health.Index] = health.Index) -> None:
        self.snapshot = snapshot
        self.health = health  # each job's health as last published (net/health.py)
        self.secret = secret  # read at each request: a reload's secret signs the next
        self.job_label = job_label
        self.peer_hosts = _addresses(peers)
        self.peer_open: set[Any] = set()  # connections in the peers' own slots
        self.healthy = healthy
        self.fence = fence
        self.open: dict[socket.socket, float] = {}  # connection -> monotonic accept time
        self.refused = 0
        self._open_lock = threading.Lock()
        self._tokens, self._refilled = ACCEPTS_PER_SECOND, time.monotonic()
        # (snapshot, what) -> body: a snapshot is immutable, so it renders once.
        self._rendered: tuple[NodeStatus | None, dict[str, bytes]] = (None, {})
        self._render_lock = threading.Lock()
        super().__init__(address, _Handler)

    def rendered(self, what: str) -> bytes:
        """`/metrics` or `/status` of the current snapshot, rendered once for it."""
        with self._render_lock:
            snap = self.snapshot()
            if self._rendered[0] is not snap:
                self._rendered = (snap, {})
            bodies = self._rendered[1]
            if what not in bodies:
                bodies[what] = (exposition(lambda: snap, self.job_label) if what == "metrics" else
                                json.dumps(snap.to_json(), default=str).encode())
            return bodies[what]

    def _pace(self) -> None:
        """On the accepting thread: at most ACCEPTS_PER_SECOND connections a second
        (a token bucket of a second's worth); past it, wait."""
        now = time.monotonic()
        self._tokens = min(ACCEPTS_PER_SECOND,
                           self._tokens + (now - self._refilled) * ACCEPTS_PER_SECOND)
        self._refilled = now
        if self._tokens < 1.0:
            time.sleep((1.0 - self._tokens) / ACCEPTS_PER_SECOND)
            self._tokens, self._refilled = 1.0, time.monotonic()
        self._tokens -= 1.0

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve a configured peer on its own slots, anyone else on the shared ones."""
        if client_address and client_address[0] in self.peer_hosts:
            with self._open_lock:
                ours = len(self.peer_open) < PEER_CONNECTIONS
                if ours:
                    self.peer_open.add(request)
                    self.open[request] = time.monotonic()  # the whole-request time too
            if ours:
                super().process_request(request, client_address)
                return  # else: a shared slot, as anyone's
        self._pace()
        with self._open_lock:
            full = len(self.open) - len(self.peer_open) >= MAX_CONNECTIONS
            if not full:
                self.open[request] = time.monotonic()
        if full:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("http: %d connections open, refusing more (%d refused so far)",
                            MAX_CONNECTIONS, self.refused)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve the request, then free its slot."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self.open.pop(request, None)
                self.peer_open.discard(request)

    def service_actions(self) -> None:
        """Between accepts (every poll): cut connections past their whole-request time."""
        now = time.monotonic()
        with self._open_lock:
            late = [conn for conn, since in self.open.items() if now - since > REQUEST_SECONDS]
        for conn in late:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # the handler's recv/send then ends at once
            except OSError:
                continue


def _addresses(peers: tuple[str, ...]) -> frozenset[str]:
    """The IP addresses the peers (HOST:PORT) resolve to now (best effort)."""
    found: set[str] = set()
    for peer in peers:
        host = peer.rsplit(":", 1)[0].strip("[]")
        try:
            found.update(str(info[4][0]) for info in socket.getaddrinfo(host, None))
        except (OSError, UnicodeError):
            log.warning("peer %s does not resolve: fix its name in peers (or /etc/hosts), "
                        "then reload (SIGHUP); until then its requests are not told from "
                        "local clients' and may wait behind them when many are connected",
                        peer)
    return frozenset(found)


def set_peers(server: ThreadingHTTPServer, peers: tuple[str, ...]) -> None:
    """A reload's peers (SIGHUP): their addresses get the peers' own slots from now."""
    if isinstance(server, _Server):
        server.peer_hosts = _addresses(peers)


def serve(address: tuple[str, int], snapshot: Snapshot,
          healthy: Callable[[], bool], fence: FenceHandler | None = None,
          peers: tuple[str, ...] = (), job_label: str = JOB_LABEL,
          secret: Callable[[], str | None] = lambda: None,
          health: Callable[[], health.Index] = health.Index) -> ThreadingHTTPServer:
    """Start the endpoint on a background thread; returns the server (to shut down).

    `fence` handles `POST /fence` (headers, body) -> (status, JSON answer);
    without it every POST is refused. `health` gives each job's health as last
    published (`GET /jobs/<job>/health`: net/health.py).
    """
    server = _Server(address, snapshot, healthy, fence, peers, job_label, secret, health)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                              name="http", daemon=True)
    thread.start()
    return server


def shut(server: ThreadingHTTPServer) -> None:
    """Stop serving now. `shutdown` alone waits for the serving loop's next poll (half a
    second: every daemon's stop paid it); a connection of our own wakes the loop at once.
    One made before the loop saw the request to stop is answered as any idle one is."""
    closer = threading.Thread(target=server.shutdown, name="http-shutdown", daemon=True)
    closer.start()
    host, port = server.server_address[:2]
    wake = (str(host) if host not in ("", "0.0.0.0") else "127.0.0.1", port)
    for _ in range(10):
        try:
            socket.create_connection(wake, timeout=0.1).close()
        except OSError:
            pass  # refused or unreachable: the poll's timeout ends it anyway
        closer.join(0.05)
        if not closer.is_alive():
            break
    closer.join()
    server.server_close()

