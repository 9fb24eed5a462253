"""Untrusted input: record strings, the HTTP endpoint with fences on, files, directories.

A record's job, host, backend and expect reason are whatever its writer put
there (any local user may publish into the sticky record directory). They
must not break a log line, a metric label, a terminal, a file name or a shell
command; nothing a client sends to the endpoint may change state; a rank's
stack-dump file must not lead a root daemon to copy another file.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.ranks import REPO, DaemonProc, base_env, http_get, scrape, wait_for
from tests.support.records import SyntheticWriter
from watchdog import record
from watchdog.net import fence
from watchdog.record import OP_CODE
from watchdog.states import Phase
from watchdog.text import printable

pytestmark = pytest.mark.ranks

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} mlx-watchdog "
                      r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
MARKER = "mlxwd-escape-marker"
HOSTILE = {
    "job": f'j\n2026-01-01 00:00:00,000 mlx-watchdog ERROR forged\x1b[31m"{{}}\\,=../../{MARKER}',
    "host": "h\r\nX-Injected: 1\x1b]0;title\x07\u2028next",
    "backend": "r\n\x1b[2J\"}",
    "reason": "ckpt\n\x1b[1Agone\"} 1\n# EOF",
}


def sleeper(code: str = "import time\nwhile True: time.sleep(1)") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def hostile_record(path: Path, proc: subprocess.Popen, *, dump_signal: int = 0,
                   job: str = HOSTILE["job"]) -> None:
    """A record for our own process, hung in a wait since boot, full of hostile text."""
    p = psutil.Process(proc.pid)
    writer = SyntheticWriter(str(path), pid=proc.pid, start_time=p.create_time(), uid=os.getuid(),
                          host=HOSTILE["host"], job=job, rank=0, world_size=1,
                          backend=HOSTILE["backend"], dump_signal=dump_signal)
    writer.begin()
    writer.write_hot(1, 1, 0, 0, Phase.WAIT, OP_CODE["eval"], 1, 1, 1, 0, 0)
    writer.write_expect(0.5, 1, HOSTILE["reason"])
    writer.end()
    writer.close(record.STATUS_OPEN, remove=False)  # unmap, leave the file: a hung rank's


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_hostile_strings_stay_inside_their_log_line_label_and_file(tmp_path, record_dir,
                                                                   state_dir):
    proc = sleeper()
    try:
        hostile_record(record_dir / f"{proc.pid}.rec", proc)
        rec = record.read_path(str(record_dir / f"{proc.pid}.rec"))
        cli = [sys.executable, "-m", "watchdog.cli"]
        # `status` with no daemon: a table for a terminal.
        shown = subprocess.run([*cli, "status", "--dir", str(record_dir), "--state-dir",
                                str(state_dir)], capture_output=True, text=True, timeout=60,
                               env=base_env(record_dir), cwd=REPO)
        assert "\x1b" not in shown.stdout + shown.stderr, "terminal escape passed through"
        assert len(shown.stdout.strip().splitlines()) == 2, shown.stdout  # header + one rank

        before = files_under(tmp_path.parent) - {tmp_path.name}
        with DaemonProc(record_dir, state_dir, deadline=1, blocked_deadline=1) as daemon:
            wait_for(lambda: proc.poll() is not None, 30, what="the hostile-named rank ended")
            inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
            url = daemon.url()
            families = scrape(url)  # prometheus_client's own parser
            status = json.loads(http_get(url + "/status")[2])

        # One line per event: every line of the log starts like a log line.
        log = daemon.log()
        assert "\x1b" not in log, "terminal escape in the log"
        bad = [line for line in log.splitlines() if not LOG_LINE.match(line)]
        assert not bad, f"lines not starting a log record (injected?): {bad[:5]}"

        # JSON carries the strings as the record decodes them; a metric label carries them
        # through the one escaper (no control or format character reaches a dashboard).
        assert inc["job"] == rec.job and status["host"]
        labels = {s.labels["mlx_job"] for f in families.values() for s in f.samples
                  if "mlx_job" in s.labels}
        assert printable(rec.job) in labels and "\n" not in printable(rec.job), labels
        assert json.loads(json.dumps(inc))["job"] == rec.job

        # Files: evidence lives under the state dir, named by incident id, rank and pid.
        for path in inc["evidence"]:
            real = os.path.realpath(path)
            assert real.startswith(os.path.realpath(state_dir) + os.sep), real
            assert MARKER not in real
        assert all(MARKER not in name for name in files_under(tmp_path))
        assert files_under(tmp_path.parent) - {tmp_path.name} - before <= {
            n for n in files_under(tmp_path.parent) if n.startswith(tmp_path.name)}
        assert not list(Path("/tmp").glob(f"*{MARKER}*"))

        shown = subprocess.run([*cli, "incidents", "--state-dir", str(state_dir)],
                               capture_output=True, text=True, timeout=60,
                               env=base_env(record_dir), cwd=REPO)
        assert "\x1b" not in shown.stdout + shown.stderr
    finally:
        proc.kill()
        proc.wait()


def test_there_is_no_shell_anywhere_in_the_package():
    offenders = []
    for path in sorted((REPO / "watchdog").rglob("*.py")):
        text = path.read_text()
        for needle in ("shell=True", "os.system", "os.popen", "commands.getoutput"):
            if needle in text:
                offenders.append(f"{path.name}: {needle}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant)
                                                  and kw.value.value is False):
                        offenders.append(f"{path.name}:{node.lineno}: shell=")
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in ("run", "Popen", "call", "check_call", "check_output") and \
                        node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
                    offenders.append(f"{path.name}:{node.lineno}: a command as one string")
    assert offenders == []


GROWS_ON_USR2 = """
import signal, sys, time
def grow(*_):
    with open(sys.argv[1], "a") as f:
        f.write("root-only-" + "secret 4f1c\\n")  # not contiguous in our own argv
signal.signal(signal.SIGUSR2, grow)
while True:
    time.sleep(0.1)
"""


def test_a_symlinked_stack_dump_file_is_not_followed(tmp_path, record_dir, state_dir):
    """A rank owner makes its `.stacks` a link to a file only root can read that grows
    when asked (a log, say): the root daemon must not copy it into the evidence."""
    secret = tmp_path / "secret.log"
    secret.write_text("")
    secret.chmod(0o600)
    proc = subprocess.Popen([sys.executable, "-c", GROWS_ON_USR2, str(secret)])
    try:
        time.sleep(0.5)  # the handler is installed
        path = record_dir / f"{proc.pid}.rec"
        hostile_record(path, proc, dump_signal=int(signal.SIGUSR2), job="exfil")
        os.symlink(secret, record_dir / f"{proc.pid}.stacks")
        with DaemonProc(record_dir, state_dir, deadline=1, blocked_deadline=1) as daemon:
            inc = wait_for(daemon.incidents, 30, what="the incident")[-1]
        copied = [p for p in inc["evidence"] if "root-only-secret" in Path(p).read_text(
            errors="replace")]
        assert copied == [], f"evidence copied the link's target: {copied}"
    finally:
        proc.kill()
        proc.wait()


# -- the endpoint with fences on (the one route that can act) ---------------------------

SECRET = "a shared secret, long enough for the test"
HEADER_NAMES = ["Content-Length", "Content-Type", "Transfer-Encoding", "Expect", "Host",
                "Connection", fence.SIGNATURE, fence.TIMESTAMP, "X-Forwarded-For"]


def header_value(rng: random.Random) -> bytes:
    return rng.choice([
        b"", b"0", b"-1", b"99999999999999999999", b"65536", b"chunked", b"100-continue",
        str(time.time()).encode(), b"nan", b"inf", b"a" * 64, b"\xff\xfe\xc3\xa9",
        "é".encode("latin-1") * 64, bytes(rng.randrange(32, 256) for _ in range(40)),
        fence.sign("not the secret", "1", b"{}").encode(), b"x" * rng.choice([100, 9000])])


def fence_requests(rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        body = rng.choice([b"", b"{}", b'{"job": "j", "nonce": "n"}', rng.randbytes(200),
                           json.dumps({"job": "j\n", "nonce": "1", "time": time.time()}).encode(),
                           b"[" * 5000])
        headers = [(rng.choice(HEADER_NAMES).encode(), header_value(rng))
                   for _ in range(rng.randrange(0, 8))]
        if rng.random() < 0.7:
            headers.append((b"Content-Length", str(len(body)).encode()))
        if rng.random() < 0.5:
            headers += [(fence.SIGNATURE.encode(), header_value(rng)),
                        (fence.TIMESTAMP.encode(), header_value(rng))]
        method = rng.choice([b"POST"] * 6 + [b"PUT", b"GET", b"post", b"POST "])
        path = rng.choice([b"/fence", b"/fence", b"/fence?x=1", b"//fence", b"/fence/..",
                           b"/FENCE", b"/fence#"])
        head = method + b" " + path + b" HTTP/1.1\r\n" + b"".join(
            n + b": " + v + b"\r\n" for n, v in headers)
        out.append(head + b"\r\n" + body)
    return out


def exchange(host: str, port: int, data: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=5) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)  # the server sees the end of a short body at once
        except OSError:
            pass
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except OSError:
            pass
    return b"".join(chunks)


def test_hostile_fence_requests_never_act_crash_or_change_state(tmp_path, record_dir,
                                                                state_dir):
    proc = sleeper()
    try:
        # A healthy "rank" of job j that an accepted fence would end.
        p = psutil.Process(proc.pid)
        writer = SyntheticWriter(str(record_dir / f"{proc.pid}.rec"), pid=proc.pid,
                              start_time=p.create_time(), uid=os.getuid(), host="h", job="j",
                              rank=0, world_size=2, backend="ring", dump_signal=0)
        with DaemonProc(record_dir, state_dir, secret=SECRET, deadline=600) as daemon:
            url = daemon.url()
            host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
            wait_for(lambda: proc.pid in daemon.ranks(), 10)
            state_before = sorted(n for n in os.listdir(state_dir)
                                  if n != "status.json" and not n.startswith(".tmp-"))
            rng = random.Random(6)
            codes: dict[bytes, int] = {}
            for data in fence_requests(rng, 250):
                answer = exchange(host, int(port), data)
                code = answer.split(b"\r\n", 1)[0][9:12] if answer.startswith(b"HTTP/") else b""
                codes[code] = codes.get(code, 0) + 1
            # A request line carrying a terminal escape (logged at debug level).
            exchange(host, int(port), b"GET /\x1b[31mred\x1b]0;t\x07 HTTP/1.1\r\n\r\n")
            assert daemon.alive()
            assert http_get(url + "/healthz")[0] == 200
            assert b"202" not in codes, codes  # no fence was ever accepted
            assert b"500" not in codes, (codes, daemon.log()[-3000:])
            assert proc.poll() is None
            assert daemon.incidents() == []
            assert sorted(n for n in os.listdir(state_dir)
                          if n != "status.json" and not n.startswith(".tmp-")) == state_before
            assert daemon.ranks()[proc.pid]["state"] in ("running", "suspect")
            log = daemon.log()
            assert "Traceback" not in log, log[-3000:]
            assert "\x1b" not in log, "terminal escape from a request line in the log"
            assert all(LOG_LINE.match(line) for line in log.splitlines()), log[-3000:]
        writer.close(record.STATUS_CLOSED)
    finally:
        proc.kill()
        proc.wait()


# -- directory permission checks, through the real command ---------------------------------

def run_daemon(record_dir: Path, state_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "watchdog.cli", "run", "--dir", str(record_dir), "--state-dir",
         str(state_dir), "--listen", "127.0.0.1:0", "--interval", "0.1"],
        capture_output=True, text=True, timeout=30, env=base_env(record_dir), cwd=REPO)


@pytest.mark.parametrize("case", ["state-world-writable", "state-group-writable",
                                  "record-world-writable-no-sticky", "record-symlink",
                                  "state-symlink", "state-other-owner", "record-other-owner",
                                  "record-is-a-file"])
def test_the_daemon_refuses_unsafe_directories(tmp_path, case):
    record_dir, state_dir = tmp_path / "records", tmp_path / "state"
    record_dir.mkdir(mode=0o755)
    state_dir.mkdir(mode=0o755)
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    if case == "state-world-writable":
        state_dir.chmod(0o777)
    elif case == "state-group-writable":
        state_dir.chmod(0o775)
    elif case == "record-world-writable-no-sticky":
        record_dir.chmod(0o777)
    elif case == "record-symlink":
        record_dir.rmdir()
        record_dir.symlink_to(real)
    elif case == "state-symlink":
        state_dir.rmdir()
        state_dir.symlink_to(real)
    elif case == "state-other-owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to chown")
        os.chown(state_dir, 65534, -1)
    elif case == "record-other-owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to chown")
        os.chown(record_dir, 65534, -1)
    elif case == "record-is-a-file":
        record_dir.rmdir()
        record_dir.write_text("")
    modes = {p: os.lstat(p).st_mode for p in (record_dir, state_dir)}
    done = run_daemon(record_dir, state_dir)
    assert done.returncode == 3, (done.returncode, done.stderr)  # a setup error
    assert "Traceback" not in done.stderr
    message = done.stderr.strip()
    assert message.startswith("mlx-watchdog:") and len(message.splitlines()) == 1, message
    assert {p: os.lstat(p).st_mode for p in (record_dir, state_dir)} == modes, "it 'fixed' it"
    assert not (real / "incidents.jsonl").exists() and not (real / "status.json").exists()


def test_a_sticky_world_writable_record_dir_and_private_state_dir_are_accepted(tmp_path):
    record_dir, state_dir = tmp_path / "records", tmp_path / "state"
    record_dir.mkdir()
    record_dir.chmod(0o1777)
    state_dir.mkdir()
    state_dir.chmod(0o700)
    with DaemonProc(record_dir, state_dir) as daemon:
        assert daemon.alive()
