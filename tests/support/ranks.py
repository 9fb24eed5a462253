"""Launch real MLX ring ranks on 127.0.0.1 for tests, and wait on conditions."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests.support import REPO, SUPPORT
from watchdog import record

RANK_PROG = SUPPORT / "rank_prog.py"
LM_PROG = SUPPORT / "lm_prog.py"
T = TypeVar("T")
P = TypeVar("P", bound="RankProcs")


def wait_for(condition: Callable[[], T], timeout: float, interval: float = 0.05,
             what: str = "condition") -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def free_ports(count: int) -> list[int]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def base_env(record_dir: Path | str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env["PYTHONPATH"] = str(REPO)
    env["MLX_WATCHDOG_DIR"] = str(record_dir)
    env.update(extra)
    return env


class RingJob:
    """`size` ranks of tests/support/rank_prog.py in MODE, each its own process."""

    def __init__(self, workdir: Path, record_dir: Path | str | list[Path], size: int = 3,
                 mode: str = "loop", args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, prog: Path = RANK_PROG) -> None:
        """`record_dir` may be a list: one directory per rank (one per simulated node);
        `prog` is the rank program (tests/support/rank_prog.py, or tests/support/lm_prog.py
        for mlx-lm)."""
        self.workdir = Path(workdir)
        dirs = record_dir if isinstance(record_dir, list) else [Path(record_dir)] * size
        self.record_dirs = [Path(d) for d in dirs]
        self.record_dir = self.record_dirs[0]
        self.size = size
        self.mode = mode
        self.args = args
        self.extra_env = env or {}
        self.prog = prog
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, ranks: int | None = None) -> RingJob:
        """Start the first `ranks` ranks (all by default; `start_rank` starts a late one)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hostfile = self.workdir / f"hosts-{id(self)}.json"
        self.hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"]
                                             for p in free_ports(self.size)]))
        for rank in range(self.size if ranks is None else ranks):
            self.start_rank(rank)
        return self

    def start_rank(self, rank: int) -> None:
        env = base_env(self.record_dirs[rank], MLX_HOSTFILE=str(self.hostfile),
                       MLX_RANK=str(rank), **self.extra_env)
        log = open(self.workdir / f"rank{rank}-{id(self)}.log", "wb")  # noqa: SIM115
        self.procs.append(subprocess.Popen(
            [sys.executable, str(self.prog), self.mode, *self.args], env=env,
            stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir))
        log.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def log(self, rank: int) -> str:
        return (self.workdir / f"rank{rank}-{id(self)}.log").read_text(errors="replace")

    def records(self) -> dict[int, record.Record]:
        """The readable records of this job's live processes, by rank."""
        out = {}
        for rank, p in enumerate(self.procs):
            try:
                rec = record.read_path(str(self.record_dirs[rank] / f"{p.pid}{record.SUFFIX}"))
            except record.RecordError:
                continue
            out[rec.rank] = rec
        return out

    def wait_running(self, timeout: float = 60, collectives: int = 3) -> dict[int, record.Record]:
        """Wait until every rank has a record and has issued some collectives."""
        def ready() -> dict[int, record.Record] | None:
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"rank pid {p.pid} exited early ({p.returncode}):\n"
                                         + self.log(self.procs.index(p)))
            recs = self.records()
            if len(recs) == self.size and all(r.collectives >= collectives
                                              for r in recs.values()):
                return recs
            return None
        return wait_for(ready, timeout, what=f"{self.size} ranks running")

    def signal(self, rank: int, signum: int) -> None:
        os.kill(self.procs[rank].pid, signum)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> RingJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DaemonProc:
    """The real daemon (`mlx-watchdog run`) as a subprocess with short timings."""

    def __init__(self, record_dir: Path, state_dir: Path, *args: str, **options: object) -> None:
        self.record_dir, self.state_dir = Path(record_dir), Path(state_dir)
        defaults: dict[str, object] = dict(interval=0.25, deadline=2, grace=1, kill_timeout=3,
                                           evidence_timeout=2, retention=60,
                                           listen="127.0.0.1:0", blocked_deadline=30)
        defaults.update(options)
        self.argv = [sys.executable, "-m", "watchdog.cli", "run", "--dir", str(record_dir),
                     "--state-dir", str(state_dir), "--log-level", "debug", *args]
        for key, value in defaults.items():
            self.argv += [f"--{key.replace('_', '-')}", str(value)]
        self.log_path = self.state_dir.parent / f"daemon-{id(self)}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_env: dict[str, str] = {}  # e.g. the simulated Mac's variable
        self.cwd = REPO  # where it is started from

    def start(self) -> DaemonProc:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        status = self.state_dir / "status.json"
        if status.exists():
            status.unlink()
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                     env=base_env(self.record_dir, **self.extra_env), cwd=self.cwd)
        log.close()
        wait_for(lambda: self.alive() and status.exists(), 30, what="daemon's first scan")
        return self

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"daemon exited:\n{self.log()}")
        return True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def status(self) -> dict:
        for _ in range(20):  # replaced atomically, but be patient with a slow writer
            try:
                return json.loads((self.state_dir / "status.json").read_text())
            except (OSError, ValueError):
                time.sleep(0.05)
        raise AssertionError("status.json unreadable")

    def ranks(self) -> dict[int, dict]:
        return {r["pid"]: r for r in self.status()["ranks"]}

    def incidents(self) -> list[dict]:
        path = self.state_dir / "incidents.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> DaemonProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the daemon's HTTP endpoint (appended for the metrics, HTTP and CLI tests) --------

SERVING = r"serving /metrics /status /healthz on http://(\S+):(\d+)"


def daemon_url(self: DaemonProc, timeout: float = 15) -> str:
    """http://HOST:PORT the daemon bound (parsed from its startup log line)."""
    import re

    found = wait_for(lambda: re.findall(SERVING, self.log()), timeout,
                     what="the daemon's 'serving ... on http://' line")
    host, port = found[-1]  # the last start of this DaemonProc
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


DaemonProc.url = daemon_url  # type: ignore[attr-defined]


def http_get(url: str, timeout: float = 10) -> tuple[int, str, bytes]:
    """(status, content type, body) of one GET; HTTP errors are answers, not exceptions."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


def scrape(url: str) -> dict:
    """GET /metrics and parse it with prometheus_client's parser: families by name."""
    from prometheus_client.parser import text_string_to_metric_families

    code, ctype, body = http_get(url.rstrip("/") + "/metrics")
    assert code == 200, (code, body[:200])
    assert ctype.startswith("text/plain"), ctype
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def samples(families: dict, name: str, **labels: str) -> dict[tuple, float]:
    """Values of the samples named `name` (e.g. `mlx_watchdog_kills_total`) whose
    labels include `labels`, keyed by their sorted (label, value) pairs."""
    return {tuple(sorted(s.labels.items())): s.value
            for family in families.values() for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())}


def value(families: dict, name: str, **labels: str) -> float | None:
    """The one sample named `name` with exactly these labels, or None."""
    return samples(families, name, **labels).get(tuple(sorted(labels.items())))


def torn_down(outcome: dict[str, str]) -> bool:
    """An incident's outcome of a whole job ended by the watchdog: every rank killed, but
    for a rank that was already leaving on the ring's own error (its peer ended a moment
    before) when the ladder reached it, which is "exited"."""
    return "killed" in outcome.values() and set(outcome.values()) <= {"killed", "exited"}


class RankProcs:
    """Rank processes a test started (`procs`, rank i at i): signalled by rank, and ended
    by pid however they stand (a stopped one continued first); a context manager."""

    procs: list[subprocess.Popen[bytes]]

    def start(self: P) -> P:
        raise NotImplementedError

    def signal(self, rank: int, signum: int) -> None:
        self.procs[rank].send_signal(signum)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        deadline = time.monotonic() + 30
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self: P) -> P:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
