"""`mlx-watchdog demo`: a real local MLX ring job, a real daemon, an injected fault.

Everything runs as this user on 127.0.0.1 inside one scratch directory: the
daemon (`mlx-watchdog run` with a short deadline) and N ranks of
`watchdog/cli/demo_rank.py`. Once the ranks make progress the demo injects the
fault, narrates what the daemon publishes each second, prints the incident
from the journal, and checks the outcome:

- `stop`: one rank is frozen with SIGSTOP, like a wedged host in the seeds'
  JACCL and ring hangs; its peers spin in `all_sum` forever. Expected: the
  watchdog names the frozen rank as the culprit and ends the whole job.
- `kill`: one rank is killed with SIGKILL. On mlx 0.32.4 the ring survivors
  raise "connection to a peer was lost" and exit by themselves. Expected:
  every survivor gone.
- `mismatch`: rank 0 posts a `recv` from rank 1 that rank 1 never sends.
  Expected: the watchdog finds rank 0 stuck in it and ends the job.

Every phase is time-boxed. Whatever happens (an error, Ctrl-C, SIGTERM), the
daemon, the ranks and the scratch directory are removed before returning.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from watchdog.daemon import journal
from watchdog.states import FINAL, PAST_DEADLINE, WAITING_LONG

FAULTS = ("stop", "kill", "mismatch")
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
        return self.proc.pid


@dataclass
class _Result:
    fault_at: float = 0.0  # demo seconds
    victim: int = -1
    step_at_fault: int = 0
    problems: list[str] = field(default_factory=list)


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read()[-8192:].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _last_error(path: str) -> str:
    """The exception line of a rank's log (else its last line)."""
    lines = [ln.strip() for ln in _tail(path, 20).splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception):", ln)]
    return (errors or lines or [""])[-1]


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"ended by signal {-code}"
    return f"exited with code {code}"


class Demo:
    def __init__(self, ranks: int, deadline: float, fault: str,
                 echo: Callable[[str], None] = click.echo) -> None:
        self.size = ranks
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
        return time.monotonic() - self.t0

    def say(self, message: str) -> None:
        self.echo(f"[{self.now():4.1f}s] {message}")

    def note(self, message: str) -> None:
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

    def status(self) -> dict[str, Any] | None:
        from watchdog.cli.sampling import daemon_status

        return daemon_status(self.state_dir)

    def rank_status(self, snap: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
        """The daemon's view of our current ranks, by rank number."""
        by_pid = {r.pid: r.rank for r in self.ranks}
        out: dict[int, dict[str, Any]] = {}
        for item in (snap or {}).get("ranks", []):
            if isinstance(item, dict) and item.get("pid") in by_pid:
                out[by_pid[item["pid"]]] = item
        return out

    def daemon_alive(self) -> bool:
        return self.daemon is not None and self.daemon.poll() is None

    def start_daemon(self) -> bool:
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
                self.note(_tail(self.daemon_log, 10).replace("\n", "\n        "))
                return False
            snap = self.status()
            if snap is not None and snap.get("time"):
                match = re.search(r"on (http://\S+)", _tail(self.daemon_log, 50))
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
            proc = self._popen([sys.executable, "-m", "watchdog.cli.demo_rank", *args], log, env)
            self.ranks.append(_Rank(n, proc, log))
            self.say(f"started rank {n} (pid {proc.pid})")

    def start_ranks(self) -> bool:
        for attempt in (1, 2):
            self._launch_ranks()
            until = time.monotonic() + RANKS_START_TIMEOUT
            failed: _Rank | None = None
            while time.monotonic() < until and failed is None:
                failed = next((r for r in self.ranks if r.proc.poll() is not None), None)
                if failed is not None:
                    break
                seen = self.rank_status(self.status())
                if len(seen) == self.size and all(r.get("steps", 0) >= 3 for r in seen.values()):
                    self.job = str(seen[0].get("job", ""))
                    self.say(f"{self.size} ranks up, job {self.job}: all_sum over the ring "
                             f"on 127.0.0.1, results checked every step")
                    return True
                time.sleep(POLL)
            if failed is not None:
                self.say(f"rank {failed.rank} (pid {failed.pid}) "
                         f"{_describe_exit(failed.proc.returncode or 0)} at start:")
                self.note(_tail(failed.log).replace("\n", "\n        "))
            else:
                self.say(f"the ranks did not all report progress within "
                         f"{RANKS_START_TIMEOUT:g}s")
            self._end_ranks(self.ranks)
            self.retired.extend(self.ranks)
            self.ranks = []
            if attempt == 1 and failed is not None:
                self.say("retrying once with fresh ports")
        return False

    # -- phases ------------------------------------------------------------------

    def progress_line(self, seen: dict[int, dict[str, Any]]) -> str:
        parts = []
        for r in self.ranks:
            info = seen.get(r.rank)
            parts.append(f"rank {r.rank} at step {info.get('steps', 0)} ({info['state']})"
                         if info else f"rank {r.rank} not seen yet")
        return "; ".join(parts)

    def healthy_phase(self) -> int:
        """A few seconds of normal progress; returns the step count before the fault."""
        seconds = min(max(3.0, self.deadline), 5.0)
        until = time.monotonic() + seconds
        seen: dict[int, dict[str, Any]] = {}
        while True:
            seen = self.rank_status(self.status())
            self.say(self.progress_line(seen))
            if time.monotonic() + 1.0 > until:
                break
            time.sleep(1.0)
        return min((int(s.get("steps", 0)) for s in seen.values()), default=0)

    def inject(self, result: _Result) -> None:
        result.fault_at = self.now()
        if self.fault == "stop":
            victim = self.ranks[1]
            os.kill(victim.pid, signal.SIGSTOP)
            self.stopped.add(victim.pid)
            result.victim = victim.rank
            self.say(f"rank {victim.rank} frozen with SIGSTOP (pid {victim.pid})")
            self.note("like a wedged host or GPU in the seeds' JACCL/ring hang: its peers")
            self.note("now wait in all_sum forever, one thread spinning at ~100% CPU,")
            self.note("with no error. Nothing in MLX will ever end this job.")
        elif self.fault == "kill":
            victim = self.ranks[1]
            os.kill(victim.pid, signal.SIGKILL)
            victim.proc.wait()
            victim.reported = True
            result.victim = victim.rank
            self.say(f"rank {victim.rank} killed with SIGKILL (pid {victim.pid})")
            self.note("on mlx 0.32.4 the ring notices a killed peer: the survivors should")
            self.note("raise 'connection to a peer was lost' and exit by themselves.")
        else:
            with open(self.trigger, "w"):
                pass
            result.victim = 0
            self.say("rank 0 told to go off script: after its next all_sum it posts a recv "
                     "from rank 1,")
            self.note("which never sends (rank 1 and the others move on and wait for work")
            self.note("outside MLX). Rank 0 waits in that recv forever.")

    def state_line(self, seen: dict[int, dict[str, Any]]) -> str:
        parts = []
        for r in self.ranks:
            info = seen.get(r.rank)
            if info is None:
                parts.append(f"rank {r.rank} gone")
                continue
            state = str(info.get("state"))
            text = f"rank {r.rank} {state}"
            if state in WAITING_LONG or (state == "running" and info.get("phase") == "wait"
                                    and (info.get("seconds_in_wait") or 0) >= 0.5):
                cpu = info.get("busiest_thread_cpu")
                text += (f" ({info.get('seconds_in_wait') or 0:.1f}s in "
                         f"{info.get('current_op') or 'a wait'}"
                         + (f", busiest thread {cpu:.0%} CPU" if cpu is not None else "") + ")")
            elif state == "exited" and "without closing" in str(info.get("reason")):
                text += " (died without closing its record)"
            parts.append(text)
        return "watchdog sees: " + "; ".join(parts)

    def _report_exits(self) -> None:
        for r in self.ranks:
            code = r.proc.poll()
            if code is None or r.reported:
                continue
            r.reported = True
            why = _describe_exit(code)
            last = _last_error(r.log)
            self.say(f"rank {r.rank} (pid {r.pid}) {why}"
                     + (f": {last}" if self.fault == "kill" and last else ""))

    def watch(self, result: _Result) -> bool:
        """Narrate until the expected end, or a timeout; True when it came."""
        if self.fault == "kill":
            timeout = 20.0 + 2 * self.deadline
        else:
            timeout = 2 * self.deadline + EVIDENCE_TIMEOUT + GRACE + KILL_TIMEOUT + 25.0
        until = time.monotonic() + timeout
        last_line, last_at = "", 0.0
        incidents_seen = 0
        done_at: float | None = None
        while time.monotonic() < until:
            if not self.daemon_alive():
                self.say("the daemon died:")
                self.note(_tail(self.daemon_log, 10).replace("\n", "\n        "))
                return False
            seen = self.rank_status(self.status())
            line = self.state_line(seen)
            if time.monotonic() - last_at >= 1.0 or _states(line) != _states(last_line):
                self.say(line)  # each second, and at once when a state changes
                last_line, last_at = line, time.monotonic()
            incidents, _ = journal.read_incidents(self.state_dir)
            for inc in incidents[incidents_seen:]:
                self.say(f"incident {inc.get('id')} written to incidents.jsonl: "
                         f"verdict {inc.get('verdict')}, {inc.get('action', '')}")
            incidents_seen = len(incidents)
            self._report_exits()
            all_gone = all(r.proc.poll() is not None for r in self.ranks)
            if self.fault == "kill":
                expected = all_gone
            else:
                expected = all_gone and incidents_seen > 0
            if expected and done_at is None:
                done_at = time.monotonic()
            if done_at is not None:
                # Give the daemon a scan or two to publish its final verdicts.
                final = all(str(s.get("state")) in FINAL for s in seen.values())
                if final or time.monotonic() - done_at > 4 * INTERVAL + 1:
                    if line != last_line:
                        self.say(line)
                    return True
            time.sleep(POLL)
        self.say(f"gave up after {timeout:.0f}s without the expected outcome")
        return False

    # -- the incident --------------------------------------------------------------

    def print_incident(self, inc: dict[str, Any]) -> None:
        self.echo("")
        self.echo(f"Incident {inc.get('id')} (from {self.state_dir}/incidents.jsonl)")
        self.echo(f"  job {inc.get('job')} on {inc.get('host')}: verdict {inc.get('verdict')}, "
                  f"{inc.get('seconds_without_progress', 0):.1f}s without progress, busiest "
                  f"thread {inc.get('busiest_thread_cpu', 0):.0%} CPU")
        self.echo(f"  reason: {inc.get('reason')}")
        culprit = self.culprit(inc)
        if culprit:
            self.echo(f"  culprit: {culprit}")
        for r in inc.get("ranks", []):
            wait = r.get("seconds_in_wait")
            self.echo(f"  rank {r.get('rank')} pid {r.get('pid')}: {r.get('state')}, phase "
                      f"{r.get('phase')}" + (f" in {r.get('op')} for {wait:.1f}s"
                                             if r.get("op") and wait else "")
                      + f", {r.get('collectives')} collectives")
        for rank, tail in sorted((inc.get("flight_recorder_tail") or {}).items()):
            if tail:
                ops = ", ".join(f"{c.get('op')} #{c.get('number')}" for c in tail[-3:])
                self.echo(f"  flight recorder of rank {rank} (last 3): {ops}")
        evidence = inc.get("evidence") or []
        self.echo(f"  evidence: {len(evidence)} file(s)")
        for path in evidence:
            try:
                size = os.path.getsize(path)
            except OSError:
                size = 0
            self.echo(f"    {os.path.relpath(path, self.state_dir)} ({size} bytes)")
        frames = self._stack_excerpt(evidence)
        if frames:
            self.echo("  where the hung rank waits (its Python stack dump):")
            for frame in frames:
                self.echo(f"    {frame}")
        self.echo("  signals:")
        for sig in inc.get("signals", []):
            at = float(sig.get("time", self.t0_wall)) - self.t0_wall
            self.echo(f"    [{at:4.1f}s] {sig.get('signal'):<7} to rank {sig.get('rank')} "
                      f"(pid {sig.get('pid')}): {sig.get('result')}")
        outcome = inc.get("outcome") or {}
        if outcome:
            self.echo("  outcome: " + ", ".join(f"pid {p} {o}" for p, o in outcome.items()))
        if inc.get("wired_check"):
            self.echo(f"  wired memory after the kill: {inc['wired_check']}")
        self.echo(f"  reboot required: {inc.get('reboot_required') or 'no'}")
        self.echo("")

    def culprit(self, inc: dict[str, Any]) -> str:
        named = inc.get("culprit")
        if isinstance(named, dict):
            return (f"rank {named.get('rank')} pid {named.get('pid')}: "
                    f"{named.get('reason')}")
        hung = [r for r in inc.get("ranks", []) if r.get("state") in PAST_DEADLINE]
        tails = inc.get("flight_recorder_tail") or {}
        described = []
        for r in hung:
            tail = tails.get(str(r.get("rank"))) or []
            last = f" after {tail[-1].get('op')} #{tail[-1].get('number')}" if tail else ""
            described.append(f"rank {r.get('rank')} pid {r.get('pid')}: {r.get('state')} in "
                             f"{r.get('op') or 'a wait'}{last}")
        return "; ".join(described)

    def _stack_excerpt(self, evidence: list[str]) -> list[str]:
        for path in evidence:
            if not path.endswith("-python.txt"):
                continue
            try:
                with open(path, errors="replace") as f:
                    text = f.read(65536)
            except OSError:
                continue
            for block in text.split("\n\n"):
                lines = [ln.strip() for ln in block.splitlines() if ln.strip()]
                if not any("demo_rank.py" in ln for ln in lines):
                    continue
                out = []
                for ln in lines[:4]:
                    out.append(ln)
                    frame = re.match(r'File "(.+demo_rank\.py)", line (\d+)', ln)
                    if frame:  # the demo's own line of code: what it waits in
                        code = linecache.getline(frame.group(1), int(frame.group(2))).strip()
                        if code:
                            out.append(f"    {code}")
                return out
        return []

    # -- the outcome ---------------------------------------------------------------

    def judge(self, result: _Result, reached: bool) -> bool:
        incidents, _ = journal.read_incidents(self.state_dir)
        for inc in incidents:
            self.print_incident(inc)
        survivors = [r for r in self.ranks if r.rank != result.victim or self.fault != "kill"]
        alive = [r for r in survivors if r.proc.poll() is None]
        took = self.now() - result.fault_at
        self.echo("Summary")
        if self.fault == "kill":
            codes = ", ".join(f"rank {r.rank} {_describe_exit(r.proc.returncode)}"
                              for r in survivors if r.proc.returncode is not None)
            lost = [r.rank for r in survivors if "connection to a peer was lost"
                    in _tail(r.log, 20)]
            self.echo(f"  rank {result.victim} was killed with SIGKILL at {result.fault_at:.1f}s.")
            if lost:
                self.echo(f"  ranks {_ranks(lost)} raised '[ring] connection to a peer was "
                          "lost' and exited by themselves: on mlx 0.32.4 the ring notices a "
                          "killed peer.")
            if codes:
                self.echo(f"  exits: {codes}")
            if incidents:
                self.echo(f"  the watchdog also acted ({len(incidents)} incident(s)).")
            else:
                self.echo("  the watchdog saw them exit and had nothing to end (a frozen "
                          "peer is the case it is for: try --fault stop).")
            if alive:
                result.problems.append(f"ranks {_ranks([r.rank for r in alive])} still "
                                       "running")
        else:
            first: dict[str, Any] | None = incidents[0] if incidents else None
            if first is None:
                result.problems.append("no incident was written")
            else:
                inc = first
                culprit = inc.get("culprit") or {}
                hung = sorted(int(r.get("rank", -1)) for r in inc.get("ranks", [])
                              if r.get("state") in PAST_DEADLINE)
                if self.fault == "stop" and culprit.get("rank") != result.victim:
                    result.problems.append(f"the incident names {culprit or 'no culprit'}, "
                                           f"not the frozen rank {result.victim}")
                if self.fault == "mismatch" and result.victim not in hung:
                    result.problems.append(f"rank {result.victim} is not among the hung "
                                           f"ranks {hung} of the incident")
                outcome = inc.get("outcome") or {}
                ended = sorted(r.rank for r in self.ranks if outcome.get(str(r.pid)) == "killed")
                missing = [r.rank for r in self.ranks if r.rank not in ended]
                if missing:
                    result.problems.append(f"ranks {_ranks(missing)} were not ended by the "
                                           "watchdog")
                what = ("frozen with SIGSTOP" if self.fault == "stop"
                        else "sent into a recv nobody answers")
                at = float(inc.get("time", self.t0_wall)) - self.t0_wall
                self.echo(f"  rank {result.victim} was {what} at {result.fault_at:.1f}s "
                          f"(step ~{result.step_at_fault}).")
                self.echo(f"  the watchdog judged the job {inc.get('verdict')} at {at:.1f}s "
                          f"({at - result.fault_at:.1f}s later, deadline {self.deadline:g}s),")
                who = (f"named rank {culprit.get('rank')} as the culprit"
                       if culprit else f"found rank(s) {_ranks(hung)} hung")
                self.echo(f"  {who}, captured {len(inc.get('evidence') or [])} evidence "
                          f"file(s), and ended ranks {_ranks(ended)} "
                          f"(SIGCONT, SIGTERM, {GRACE:g}s grace, SIGKILL if needed).")
                if inc.get("verdict") == "blocked":
                    self.echo("  (the waiting ranks' spinning thread got under half a core on "
                              "this busy machine, so the wait counts as blocked, not stalled; "
                              f"the demo gives blocked waits {2 * self.deadline:g}s, where the "
                              "default is 900s.)")
            if alive:
                result.problems.append(f"ranks {_ranks([r.rank for r in alive])} still "
                                       "running")
        if not reached and not result.problems:
            result.problems.append("the expected outcome did not come in time")
        if result.problems:
            for problem in result.problems:
                self.echo(f"  NOT AS EXPECTED: {problem}")
        else:
            self.echo(f"  outcome as expected ({took:.1f}s from fault to the end; "
                      f"{self.now():.1f}s in all).")
        return not result.problems

    # -- the whole run -----------------------------------------------------------------

    def run(self) -> int:
        self.echo(f"mlx-watchdog demo: {self.size} MLX ring ranks on 127.0.0.1, fault "
                  f"'{self.fault}', deadline {self.deadline:g}s")
        self.echo(f"scratch directory {self.tmp} (removed at the end)")
        if not self.start_daemon() or not self.start_ranks():
            self.echo("Summary\n  NOT AS EXPECTED: the demo could not start")
            return 1
        result = _Result()
        result.step_at_fault = self.healthy_phase()
        self.inject(result)
        reached = self.watch(result)
        return 0 if self.judge(result, reached) else 1

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
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.say(f"cleanup: removed {self.tmp}")


def _ranks(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers)) or "none"


def _states(line: str) -> list[str]:
    return re.findall(r"rank \d+ (\w+)", line)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_demo(ranks: int = 3, deadline: float = 4.0, fault: str = "stop") -> int:
    """Run the demo; 0 when the outcome is as expected, 1 when not, 130 on interrupt."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    if ranks < 2:
        raise ValueError("the demo needs at least 2 ranks")
    if not deadline > 0:
        raise ValueError("deadline must be > 0")
    main_thread = threading.current_thread() is threading.main_thread()
    # SIGTERM (a test timeout, `kill`) and SIGHUP (the terminal closed) clean up
    # like Ctrl-C does.
    catch = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    previous: dict[int, Any] = {}
    if main_thread:
        for signum in catch:
            previous[signum] = signal.signal(signum, _interrupt)
    demo: Demo | None = None
    try:
        demo = Demo(ranks, deadline, fault)
        return demo.run()
    except KeyboardInterrupt:
        click.echo("interrupted: cleaning up", err=True)
        return 130
    finally:
        if main_thread:  # a second Ctrl-C must not leave processes behind
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
            for signum in catch:
                signal.signal(signum, signal.SIG_IGN)
        try:
            if demo is not None:
                demo.cleanup()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
