"""The demo's processes: a scratch directory, the daemon, the ranks, and their end.

Everything runs as this user on 127.0.0.1 inside one scratch directory, and
`cleanup()` removes all of it whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import click

from watchdog.status import NodeStatus, RankStatus

INTERVAL = 0.5  # the daemon's scan interval
GRACE = 1.0
KILL_TIMEOUT = 3.0
EVIDENCE_TIMEOUT = 3.0
POLL = 0.25
DAEMON_START_TIMEOUT = 30.0
RANKS_START_TIMEOUT = 60.0


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen[bytes]
    log: str
    reported: bool = False  # its exit has been narrated

    @property
    def pid(self) -> int:
        """The rank process's pid."""
        return self.proc.pid



def _package_root() -> str:
    here = os.path.abspath(__file__)  # <root>/watchdog/cli/demo/job.py
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tail(path: str, lines: int = 8) -> str:
    """The last `lines` lines of a log file ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            text = f.read()[-8192:].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def last_error(path: str) -> str:
    """The exception line of a rank's log (else its last line)."""
    lines = [ln.strip() for ln in tail(path, 20).splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception):", ln)]
    return (errors or lines or [""])[-1]


def describe_exit(code: int) -> str:
    """A process's exit code in words: the signal that ended it, or its code."""
    if code < 0:
        try:
            return f"ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"ended by signal {-code}"
    return f"exited with code {code}"



class DemoJob:
    """The demo's daemon and ranks, and how the demo talks to the terminal."""

    def __init__(self, ranks: int, deadline: float, fault: str,
                 echo: Callable[[str], None] = click.echo, keep: bool = False) -> None:
        self.size = ranks
        self.keep = keep  # the scratch directory stays: the incident, evidence, log
        self.deadline = deadline
        self.fault = fault
        self.echo = echo
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        self.tmp = tempfile.mkdtemp(prefix="mlx-watchdog-demo-")
        self.record_dir = os.path.join(self.tmp, "records")
        self.state_dir = os.path.join(self.tmp, "state")
        self.trigger = os.path.join(self.tmp, "mismatch-now")
        os.mkdir(self.record_dir, 0o700)
        os.mkdir(self.state_dir, 0o700)
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_log = os.path.join(self.tmp, "daemon.log")
        self.ranks: list[_Rank] = []
        self.retired: list[_Rank] = []  # ranks of a failed start attempt
        self.stopped: set[int] = set()  # pids we froze with SIGSTOP
        self.job = ""

    # -- output ----------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the demo began."""
        return time.monotonic() - self.t0

    def say(self, message: str) -> None:
        """Print a line of the story, stamped with the demo's time."""
        self.echo(f"[{self.now():4.1f}s] {message}")

    def note(self, message: str) -> None:
        """Print an indented line explaining the one before."""
        self.echo(f"        {message}")

    # -- processes ---------------------------------------------------------------

    def _env(self, **extra: str) -> dict[str, str]:
        # No MLX_* from the caller's environment (MLX_WATCHDOG_CONFIG, a hostfile,
        # MLX_WATCHDOG=1...): the demo is configured only by what it passes.
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
        root = _package_root()
        installed = {os.path.abspath(p) for p in site.getsitepackages()
                     + [site.getusersitepackages()]}
        if root not in installed:  # running from a source tree: let children find it
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (root, env.get("PYTHONPATH", "")) if p)
        env.update(extra)
        return env

    def _popen(self, argv: list[str], log: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=env, cwd=self.tmp)

    def status(self) -> NodeStatus | None:
        """The demo daemon's snapshot, or None while it has published none that is fresh."""
        from watchdog.daemon.store.snapshot import daemon_status

        return daemon_status(self.state_dir)

    def rank_status(self, snap: NodeStatus | None) -> dict[int, RankStatus]:
        """The daemon's view of our current ranks, by rank number."""
        by_pid = {r.pid: r.rank for r in self.ranks}
        out: dict[int, RankStatus] = {}
        for item in snap.ranks if snap is not None else ():
            if item.pid in by_pid:
                out[by_pid[item.pid]] = item
        return out

    def daemon_alive(self) -> bool:
        """Whether the demo's daemon still runs."""
        return self.daemon is not None and self.daemon.poll() is None

    def start_daemon(self) -> bool:
        """Start the demo's daemon on its scratch directories; False when it did not come up."""
        argv = [sys.executable, "-m", "watchdog.cli", "run",
                "--dir", self.record_dir, "--state-dir", self.state_dir,
                "--interval", f"{INTERVAL:g}", "--deadline", f"{self.deadline:g}",
                "--blocked-deadline", f"{2 * self.deadline:g}",
                "--grace", f"{GRACE:g}", "--kill-timeout", f"{KILL_TIMEOUT:g}",
                "--evidence-timeout", f"{EVIDENCE_TIMEOUT:g}",
                "--listen", "127.0.0.1:0", "--log-level", "info"]
        self.daemon = self._popen(argv, self.daemon_log, self._env())
        self.say(f"started the watchdog daemon (pid {self.daemon.pid}): scan every "
                 f"{INTERVAL:g}s, deadline {self.deadline:g}s, grace {GRACE:g}s")
        until = time.monotonic() + DAEMON_START_TIMEOUT
        while time.monotonic() < until:
            if not self.daemon_alive():
                self.say("the daemon exited at start:")
                self.note(tail(self.daemon_log, 10).replace("\n", "\n        "))
                return False
            snap = self.status()
            if snap is not None and snap.time:
                match = re.search(r"on (http://\S+)", tail(self.daemon_log, 50))
                where = f" at {match.group(1)}/metrics" if match else ""
                self.say(f"the daemon is scanning {self.record_dir}{where}")
                return True
            time.sleep(POLL)
        self.say(f"the daemon did not complete a scan within {DAEMON_START_TIMEOUT:g}s")
        return False

    def _launch_ranks(self) -> None:
        hostfile = os.path.join(self.tmp, "hosts.json")
        with open(hostfile, "w") as f:
            json.dump([[f"127.0.0.1:{p}"] for p in _free_ports(self.size)], f)
        args = ["--trigger", self.trigger] if self.fault == "mismatch" else []
        self.ranks = []
        for n in range(self.size):
            env = self._env(MLX_HOSTFILE=hostfile, MLX_RANK=str(n),
                            MLX_WATCHDOG_DIR=self.record_dir)
            log = os.path.join(self.tmp, f"rank{n}-{len(self.retired)}.log")
            proc = self._popen([sys.executable, "-m", "watchdog.cli.demo.rank", *args], log, env)
            self.ranks.append(_Rank(n, proc, log))
            self.say(f"started rank {n} (pid {proc.pid})")

    def start_ranks(self) -> bool:
        """Launch the ranks (again, once, if one dies at start); False if they never all step."""
        for attempt in (1, 2):
            self._launch_ranks()
            until = time.monotonic() + RANKS_START_TIMEOUT
            failed: _Rank | None = None
            while time.monotonic() < until and failed is None:
                failed = next((r for r in self.ranks if r.proc.poll() is not None), None)
                if failed is not None:
                    break
                seen = self.rank_status(self.status())
                if len(seen) == self.size and all((r.steps or 0) >= 3 for r in seen.values()):
                    self.job = seen[0].job
                    self.say(f"{self.size} ranks up, job {self.job}: all_sum over the ring "
                             f"on 127.0.0.1, results checked every step")
                    return True
                time.sleep(POLL)
            if failed is not None:
                self.say(f"rank {failed.rank} (pid {failed.pid}) "
                         f"{describe_exit(failed.proc.returncode or 0)} at start:")
                self.note(tail(failed.log).replace("\n", "\n        "))
            else:
                self.say(f"the ranks did not all report progress within "
                         f"{RANKS_START_TIMEOUT:g}s")
            self._end_ranks(self.ranks)
            self.retired.extend(self.ranks)
            self.ranks = []
            if attempt == 1 and failed is not None:
                self.say("retrying once with fresh ports")
        return False

    def _end_ranks(self, ranks: list[_Rank]) -> list[int]:
        ended = []
        for r in ranks:
            if r.proc.poll() is None:
                for signum in (signal.SIGCONT, signal.SIGKILL):  # SIGCONT: a stopped rank
                    try:
                        os.kill(r.pid, signum)
                    except ProcessLookupError:
                        break
                ended.append(r.pid)
        for r in ranks:
            try:
                r.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.say(f"rank {r.rank} (pid {r.pid}) did not exit after SIGKILL")
        return ended

    def cleanup(self) -> None:
        """End every rank and the daemon the demo started."""
        ended = self._end_ranks(self.ranks + self.retired)
        if ended:
            self.say(f"cleanup: killed leftover ranks (pids {', '.join(map(str, ended))})")
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait(timeout=5)
            self.say(f"cleanup: stopped the daemon (pid {self.daemon.pid})")
        if self.keep:
            shutil.rmtree(self.record_dir, ignore_errors=True)  # the ranks' records: gone
            self.say(f"cleanup: kept {self.tmp} (incidents and evidence in state/, the "
                     f"daemon's log in daemon.log); remove it with: rm -rf {self.tmp}")
            return
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.say(f"cleanup: removed {self.tmp} (--keep keeps it)")


