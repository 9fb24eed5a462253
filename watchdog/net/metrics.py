"""Prometheus metrics and the read-only HTTP endpoint.

`SnapshotCollector` builds every family from the daemon's latest snapshot on
each scrape, so ranks that go away disappear; nothing is registered at import
time. `serve()` runs one `ThreadingHTTPServer` with three GET routes:
`/metrics`, `/status` and `/healthz`, and `POST /fence` when a secret is set
(a peer's signed request to end a job's ranks: the one request that changes
state, authenticated in `net/fence.py`). Every other method or path is refused.

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
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from watchdog.cause import CAUSES
from watchdog.states import ENDED, State
from watchdog.status import NodeStatus, RankStatus

log = logging.getLogger(__name__)
PREFIX = "mlx_watchdog_"
MAX_FENCE_BODY = 64 << 10
MAX_CONNECTIONS = 32  # served at once; Prometheus, a dashboard and a few CLIs need a handful
REQUEST_SECONDS = 10.0  # a whole request, from accept to the last byte sent
MAX_HEAD_BYTES = 16 << 10  # the request line and every header, in all
MAX_HEADERS = 32  # header lines (a scrape sends 5, a signed fence 8)
PEER_CONNECTIONS = 16  # slots of the peers' own addresses, beside the shared ones
ACCEPTS_PER_SECOND = 100.0  # a scrape every few seconds, a few CLIs: far below this
FenceHandler = Callable[[Any, bytes], tuple[int, dict[str, Any]]]
Snapshot = Callable[[], NodeStatus]



def _one_per_label(ranks: tuple[RankStatus, ...]) -> list[RankStatus]:
    """One rank per (job, rank) label pair: a relaunch within the retention (same
    hostfile, same job id) must not emit duplicate series. Prefer an unkillable
    rank, then a live one, then an ended one; of two alike, the later attempt of a job
    `mlx-watchdog launch` relaunched."""
    def weight(r: RankStatus) -> tuple[int, int]:
        return (2 if r.state == State.UNKILLABLE else 0 if r.state in ENDED else 1,
                r.attempt or 0)

    best: dict[tuple[str, str], RankStatus] = {}
    for r in ranks:
        key = (str(r.job), str(r.rank))
        if key not in best or weight(r) > weight(best[key]):
            best[key] = r
    return list(best.values())


# The MLX job's label. Not `job`: that one (and `instance`) is the scrape target's, and an
# exporter that sets it forces `honor_labels` on every scrape config. `job_label = "job"`
# in the config keeps the old name for one release (docs/operations.md, Upgrading).
JOB_LABEL = "mlx_job"
JOB_LABELS = ("mlx_job", "job")
MODES = ("enforce", "observe")


class SnapshotCollector:
    def __init__(self, snapshot: Snapshot, job_label: str = JOB_LABEL) -> None:
        self._snapshot = snapshot
        self._job_label = job_label

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        ranks = snap.ranks
        labels = [self._job_label, "rank"]

        state = GaugeMetricFamily(PREFIX + "rank_state", "1 for the rank's current state",
                                  labels=[*labels, "state"])
        per_rank: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "progress": CounterMetricFamily(PREFIX + "rank_progress", "Completed waits",
                                            labels=labels),
            "collectives": CounterMetricFamily(PREFIX + "rank_collectives", "Collectives issued",
                                               labels=labels),
            "steps": CounterMetricFamily(PREFIX + "rank_steps", "User steps (hb.step)",
                                         labels=labels),
            "seconds_since_progress": GaugeMetricFamily(
                PREFIX + "rank_seconds_since_progress", "Seconds since a wait last returned",
                labels=labels),
            "deadline_seconds": GaugeMetricFamily(
                PREFIX + "rank_deadline_seconds", "Deadline of the rank's current wait",
                labels=labels),
            "busiest_thread_cpu": GaugeMetricFamily(
                PREFIX + "rank_busiest_thread_cpu_ratio",
                "Share of one core used by the rank's busiest thread", labels=labels),
            "attempt": GaugeMetricFamily(
                PREFIX + "rank_attempt", "Which launch of its job the rank belongs to "
                "(mlx-watchdog launch numbers them from 1)", labels=labels),
        }
        for r in _one_per_label(ranks):
            values = [str(r.job), str(r.rank)]
            for s in State:
                state.add_metric([*values, s.value], 1.0 if r.state == s.value else 0.0)
            for key, family in per_rank.items():
                value = getattr(r, key)
                if value is not None:
                    family.add_metric(values, float(value))
        yield state
        yield from per_rank.values()

        counters = snap.counters
        stalls = CounterMetricFamily(PREFIX + "stalls", "Hangs acted on, by verdict and cause",
                                     labels=["verdict", "cause"])
        for verdict, total in counters.stalls.items():  # every pair, from 0
            by_cause = {c: counters.stall_causes.get(f"{verdict}:{c}", 0) for c in CAUSES}
            # Hangs counted without a cause (a daemon before causes) are `unknown`.
            by_cause["unknown"] += max(0, total - sum(by_cause.values()))
            for cause, n in by_cause.items():
                stalls.add_metric([verdict, cause], n)
        yield stalls
        kills = CounterMetricFamily(PREFIX + "kills", "Signals sent to end ranks",
                                    labels=["signal"])
        for sig, n in counters.kills.items():
            kills.add_metric([sig], n)
        yield kills
        job_kills = CounterMetricFamily(PREFIX + "job_kills", "Ranks of a job the watchdog ended",
                                        labels=[self._job_label])
        for job, n in counters.job_kills.items():
            job_kills.add_metric([job], n)
        yield job_kills
        launches = CounterMetricFamily(
            PREFIX + "launch_events", "What mlx-watchdog launch did with torn-down jobs "
            "(restart, refused, gave_up), from launches.jsonl", labels=["event"])
        for event, n in snap.launches.items():
            launches.add_metric([event], n)
        yield launches
        yield GaugeMetricFamily(PREFIX + "node_reboot_required",
                                "1 when the node must be rebooted (wired memory leak or "
                                "an unkillable rank)", value=1.0 if snap.reboot_required
                                else 0.0)
        if snap.wired_bytes is not None:
            yield GaugeMetricFamily(PREFIX + "wired_memory_bytes", "System wired memory",
                                    value=float(snap.wired_bytes))
        yield CounterMetricFamily(PREFIX + "invalid_records", "Unusable files seen in the record "
                                  "directory", value=counters.invalid_records)
        yield CounterMetricFamily(PREFIX + "probe_errors", "Failed process or memory probes",
                                  value=counters.probe_errors)
        yield CounterMetricFamily(PREFIX + "loop_errors", "Scans that failed with an error",
                                  value=counters.loop_errors)
        unwritten = snap.unwritten
        yield GaugeMetricFamily(PREFIX + "unwritten_records", "Incidents and reboot flags held "
                                "in memory because writing them failed (retried each scan)",
                                value=float(len(unwritten.incidents_unwritten)
                                            + len(unwritten.reboot_flags_unwritten)))
        yield CounterMetricFamily(PREFIX + "state_write_failures", "Failed writes of incidents, "
                                  "reboot flags and their write-ahead entries",
                                  value=unwritten.write_failures)
        bounds = snap.scan_bucket_bounds
        if bounds:
            cumulative, buckets = 0, []
            for bound, n in zip([*map(str, bounds), "+Inf"], counters.scan_buckets,
                                strict=False):
                cumulative += n
                buckets.append((bound, cumulative))
            yield HistogramMetricFamily(PREFIX + "scan_duration_seconds", "Time one scan took",
                                        buckets=buckets, sum_value=counters.scan_sum)
        # Until the first scan completes, the start time: a daemon that never
        # completes one still ages into the "not scanning" alert.
        last_scan = snap.time or snap.started
        if last_scan:
            yield GaugeMetricFamily(PREFIX + "last_scan_timestamp_seconds",
                                    "Unix time of the last completed scan", value=last_scan)
        info = GaugeMetricFamily(PREFIX + "build_info", "mlx-watchdog's version and the "
                                 "Python it runs on", labels=["version", "python"])
        info.add_metric([str(snap.version or ""), platform.python_version()], 1.0)
        yield info
        if snap.mode is not None:  # an alert on a node left in observe mode
            mode = GaugeMetricFamily(PREFIX + "mode", "1 for the daemon's mode: enforce "
                                     "(ends hung ranks) or observe (reports only)",
                                     labels=["mode"])
            for name in MODES:
                mode.add_metric([name], 1.0 if snap.mode == name else 0.0)
            yield mode


def render(snapshot: Snapshot, job_label: str = JOB_LABEL) -> bytes:
    """One scrape: the snapshot's families and the standard `process_*` ones (this
    daemon's CPU, memory, descriptors and start; Linux's /proc, nothing elsewhere)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, job_label))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    return generate_latest(registry)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "mlx-watchdog"
    timeout = 10  # a client that sends half a request must not hold a thread forever

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
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

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                self._send(200, self.server.rendered("metrics"),
                           "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/status":
                self._send(200, self.server.rendered("status"), "application/json")
            elif path == "/healthz":
                ok = self.server.healthy()
                self._send(200 if ok else 503, b"ok\n" if ok else b"no recent scan\n")
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
        if not 0 <= length <= MAX_FENCE_BODY:
            self._send(413, b"fence body missing or too large\n")
            return
        try:
            code, answer = self.server.fence(self.headers, self.rfile.read(length))
        except Exception:  # noqa: BLE001
            log.exception("fence request failed")
            code, answer = 500, {"error": "internal error"}
        self._send(code, json.dumps(answer).encode(), "application/json")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # socketserver's 5 drops a burst of scrapes and CLIs

    def __init__(self, address: tuple[str, int], snapshot: Snapshot,
                 healthy: Callable[[], bool], fence: FenceHandler | None,
                 peers: tuple[str, ...] = (), job_label: str = JOB_LABEL) -> None:
        self.snapshot = snapshot
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
                bodies[what] = (render(lambda: snap, self.job_label) if what == "metrics" else
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
            log.warning("peer %s does not resolve: it gets no slots of its own", peer)
    return frozenset(found)


def set_peers(server: ThreadingHTTPServer, peers: tuple[str, ...]) -> None:
    """A reload's peers (SIGHUP): their addresses get the peers' own slots from now."""
    if isinstance(server, _Server):
        server.peer_hosts = _addresses(peers)


def serve(address: tuple[str, int], snapshot: Snapshot,
          healthy: Callable[[], bool], fence: FenceHandler | None = None,
          peers: tuple[str, ...] = (), job_label: str = JOB_LABEL) -> ThreadingHTTPServer:
    """Start the endpoint on a background thread; returns the server (to shut down).

    `fence` handles `POST /fence` (headers, body) -> (status, JSON answer);
    without it every POST is refused.
    """
    server = _Server(address, snapshot, healthy, fence, peers, job_label)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                              name="http", daemon=True)
    thread.start()
    return server
