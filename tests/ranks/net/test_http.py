"""The daemon's HTTP endpoint: /status, /healthz, /metrics, and nothing else.

The real daemon (`python -m watchdog.cli run --listen 127.0.0.1:0`) serves a
real ring job; requests go over loopback only. `/status` must carry the same
per-rank objects as `status --json`, plus the node's fields. The endpoint is
read-only: no method, path, header or body changes anything, and none of them
stops it answering.
"""

from __future__ import annotations

import json
import random
import re
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.ranks import DaemonProc, RingJob, http_get, scrape, value, wait_for
from tests.unit.net.test_http import WRITE_METHODS, host_port, request
from watchdog.cli.commands import cli

# Design section 7: the fields of one rank in `status --json` (and /status).
RANK_FIELDS = {
    "pid": int, "host": str, "job": str, "rank": int, "world_size": int, "backend": str,
    "state": str, "phase": str, "progress": int, "collectives": int, "steps": int,
    "seconds_since_progress": (int, float), "deadline_seconds": (int, float),
    "busiest_thread_cpu": (int, float), "current_op": str,
}
STATES = {"running", "idle", "suspect", "stalled", "blocked", "stopped", "killed",
          "unkillable", "exited"}
ANSWERS = {200, 400, 404, 405, 408, 411, 413, 414, 431, 501, 505, 9}  # never 500; 9: HTTP/0.9


def tree(path: Path, contents: bool = True) -> dict[str, bytes]:
    """Every file under `path` (with its bytes), except status.json and
    learned.json, which the scan rewrites as the ranks run, and their transient
    temporary files."""
    out = {}
    for p in sorted(path.rglob("*")):
        if p.name in ("status.json", "learned.json") or p.name.startswith(".tmp-"):
            continue
        try:
            out[str(p.relative_to(path))] = (p.read_bytes() if contents and p.is_file()
                                            else b"")
        except FileNotFoundError:
            continue
    return out


def check_rank(r: dict) -> None:
    for key, kind in RANK_FIELDS.items():
        assert key in r, f"rank object lacks {key!r}: {r}"
        if r[key] is not None or key not in ("seconds_since_progress", "deadline_seconds",
                                             "busiest_thread_cpu"):
            assert isinstance(r[key], kind), (key, r[key])
    assert r["state"] in STATES


@pytest.fixture
def served(tmp_path, record_dir, state_dir):
    """The real daemon watching a healthy 2-rank ring job: (url, daemon, job)."""
    with DaemonProc(record_dir, state_dir, deadline=10) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        job.wait_running()
        wait_for(lambda: len(daemon.ranks()) == 2 and {
            r["state"] for r in daemon.ranks().values()} == {"running"}
            and {r["deadline_seconds"] for r in daemon.ranks().values()} == {10}, 15,
            what="both ranks running in the daemon's view")
        yield daemon.url(), daemon, job


@pytest.mark.ranks
def test_status_is_status_json_plus_node_fields(served, record_dir, state_dir, tmp_path):
    url, daemon, job = served
    code, ctype, body = http_get(url + "/status")
    assert code == 200 and ctype.startswith("application/json")
    status = json.loads(body)
    assert isinstance(status, dict)
    # The node's fields.
    assert status["host"] == socket.gethostname()
    assert isinstance(status["wired_bytes"], int) and status["wired_bytes"] >= 0
    assert status["reboot_required"] is False
    # The ranks, each the object `status --json` prints.
    ranks = status["ranks"]
    assert sorted(r["pid"] for r in ranks) == sorted(job.pids)
    for r in ranks:
        check_rank(r)
        assert r["world_size"] == 2 and r["backend"] == "ring" and r["state"] == "running"
        assert r["deadline_seconds"] == 10
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert len({r["job"] for r in ranks}) == 1

    runner = CliRunner()
    result = runner.invoke(cli, ["status", "--json", "--dir", str(record_dir),
                                 "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    from_cli = json.loads(result.stdout)
    assert {r["pid"]: set(r) for r in from_cli} == {r["pid"]: set(r) for r in ranks}
    stable = ("pid", "host", "job", "rank", "world_size", "backend")
    assert sorted(tuple(r[k] for k in stable) for r in from_cli) == sorted(
        tuple(r[k] for k in stable) for r in ranks)
    # With no daemon (an empty state dir), `status` samples itself: same schema.
    result = runner.invoke(cli, ["status", "--json", "--dir", str(record_dir),
                                 "--state-dir", str(tmp_path / "no-daemon")])
    assert result.exit_code == 0, result.output
    sampled = json.loads(result.stdout)
    assert {r["pid"]: set(r) for r in sampled} == {r["pid"]: set(r) for r in ranks}


@pytest.mark.ranks
def test_routes_healthz_metrics_and_404(served):
    url, daemon, job = served
    assert http_get(url + "/healthz")[::2] == (200, b"ok\n")
    code, ctype, body = http_get(url + "/metrics")
    assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
    assert b"mlx_watchdog_rank_state" in body
    assert http_get(url + "/metrics?debug=1")[0] == 200  # a query string is ignored
    status, body = request(url, "HEAD", "/metrics")
    assert status == 200 and body == b""
    for path in ("/", "/metric", "/metrics/", "/status.json", "/healthz/x",
                 "/../../etc/passwd", "/%2e%2e/state", "/incidents", "/fence", "/METRICS"):
        assert http_get(url + path)[0] == 404, path


@pytest.mark.ranks
def test_write_methods_are_refused_and_change_nothing(served, record_dir, state_dir):
    url, daemon, job = served
    state_before, records_before = tree(state_dir), tree(record_dir, contents=False)
    status_before = json.loads(http_get(url + "/status")[2])
    body = json.dumps({"mode": "observe", "job": status_before["ranks"][0]["job"],
                       "pids": job.pids, "reboot_required": True}).encode()
    for method in WRITE_METHODS:
        for path in ("/metrics", "/status", "/healthz", "/", "/fence", "/nope",
                     "/status?mode=observe"):
            code, _ = request(url, method, path, body,
                              {"Content-Type": "application/json"})
            assert code == 405, (method, path, code)
    time.sleep(0.6)  # a couple of scans
    assert tree(state_dir) == state_before
    assert tree(record_dir, contents=False) == records_before
    after = json.loads(http_get(url + "/status")[2])
    assert after["mode"] == "enforce" and after["reboot_required"] is False
    assert {r["pid"]: r["state"] for r in after["ranks"]} == dict.fromkeys(job.pids, "running")
    assert all(p.poll() is None for p in job.procs)
    assert daemon.incidents() == []


def raw_exchange(host: str, port: int, data: bytes, timeout: float = 5) -> bytes:
    """Send raw bytes, half-close, read whatever comes back (possibly nothing)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server may answer and close before it has read it all
            pass
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return out


def fuzz_requests(rng: random.Random, count: int) -> list[bytes]:
    methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE",
               "CONNECT", "PROPFIND", "get", "M" * 300, "G\tET", "", "\x00"]
    paths = ["/metrics", "/status", "/healthz", "/", "/fence", "/metrics?x=1&y", "*",
             "//status", "/status#f", "http://127.0.0.1/metrics", "/../../etc/passwd",
             "/%00", "/%ff%fe", "/" + "a" * 70_000, "/ü", "", "/metrics\r\nX-Injected: 1"]
    versions = ["HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "HTTP/0.9", "HTTP/1.1.1", "FOO", ""]
    out = []
    for _ in range(count):
        path = rng.choice(paths)
        if rng.random() < 0.3:
            path = "/" + "".join(chr(rng.randrange(33, 0x250)) for _ in range(rng.randrange(40)))
        line = " ".join(p for p in (rng.choice(methods), path, rng.choice(versions)) if p)
        headers = []
        body = rng.choice([b"", b"{}", json.dumps({"mode": "observe"}).encode(),
                           rng.randbytes(rng.randrange(1, 4096))])
        for _ in range(rng.randrange(6)):
            headers.append(rng.choice([
                f"Content-Length: {rng.choice([len(body), 0, -1, 10**12, 'abc'])}",
                "Transfer-Encoding: chunked", "Expect: 100-continue",
                "Connection: keep-alive", "Host: evil.example", "Content-Type: text/html",
                "X-" + "h" * rng.randrange(1, 200) + ": " + "v" * rng.randrange(0, 2000),
                "Bad Header Without Colon", ": empty-name", "X-Bin: \x01\x02\xff",
            ]))
        if rng.random() < 0.05:
            headers += [f"X-Many-{i}: {i}" for i in range(150)]  # over the header limit
        if rng.random() < 0.05:
            headers.append("X-Long: " + "x" * 70_000)  # over the line limit
        head = "\r\n".join([line, *headers]) + "\r\n\r\n"
        data = head.encode("utf-8", "surrogateescape") + body
        if rng.random() < 0.1:
            data = data[: rng.randrange(len(data) + 1)]  # cut short anywhere
        out.append(data)
    return out


@pytest.mark.ranks
def test_random_requests_never_crash_or_change_anything(served, record_dir, state_dir):
    url, daemon, job = served
    host, port = host_port(url)
    state_before, records_before = tree(state_dir), tree(record_dir, contents=False)
    tracebacks_before = daemon.log().count("Traceback")
    rng = random.Random(20240604)
    codes: dict[int, int] = {}
    silent = 0
    started = time.monotonic()
    for i, data in enumerate(fuzz_requests(rng, 300)):
        answer = raw_exchange(host, port, data)
        if not answer:
            silent += 1
            continue
        status_line = answer.split(b"\r\n", 1)[0]
        if status_line.startswith(b"HTTP/1."):
            code = int(status_line.split()[1])
        else:  # an HTTP/0.9 request (no or 0.9 version) gets the body alone
            found = re.search(rb"Error code: (\d+)", answer)
            code = int(found.group(1)) if found else 9
            assert b"internal error" not in answer, (i, data[:200], answer[:300])
        assert code in ANSWERS, (i, code, data[:200], answer[:300])
        codes[code] = codes.get(code, 0) + 1
        if i % 50 == 0:
            assert http_get(url + "/healthz")[0] == 200, f"not healthy after request {i}"
    took = time.monotonic() - started
    assert took < 60, f"300 requests took {took:.1f}s"
    assert codes.get(405, 0) > 0 and codes.get(200, 0) > 0 and codes.get(404, 0) > 0, codes
    assert silent < 60, f"{silent} requests got no answer at all ({codes})"

    # Still serving, still the same daemon, nothing changed.
    assert daemon.alive()
    assert http_get(url + "/healthz")[0] == 200
    families = scrape(url)
    assert value(families, "mlx_watchdog_kills_total", signal="SIGTERM") == 0
    time.sleep(0.6)
    assert tree(state_dir) == state_before
    assert tree(record_dir, contents=False) == records_before
    status = json.loads(http_get(url + "/status")[2])
    assert status["mode"] == "enforce" and status["reboot_required"] is False
    assert {r["pid"]: r["state"] for r in status["ranks"]} == dict.fromkeys(job.pids, "running")
    assert all(p.poll() is None for p in job.procs)
    assert daemon.incidents() == []
    assert daemon.log().count("Traceback") == tracebacks_before, daemon.log()[-3000:]
