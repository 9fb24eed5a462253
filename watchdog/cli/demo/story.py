"""`mlx-watchdog demo`: a real local MLX ring job, a real daemon, an injected fault.

Everything runs as this user on 127.0.0.1 inside one scratch directory: the
daemon (`mlx-watchdog run` with a short deadline) and N ranks of
`watchdog/cli/demo/rank.py`. Once the ranks make progress the demo injects the
fault, narrates what the daemon publishes each second, prints the incident
from the journal, and checks the outcome:

- `stop`: one rank is frozen with SIGSTOP, like a wedged host in the JACCL and
  ring hangs seen on Mac clusters; its peers spin in `all_sum` forever. Expected: the
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

import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import click

from watchdog.cli.demo.job import (
    EVIDENCE_TIMEOUT,
    GRACE,
    INTERVAL,
    KILL_TIMEOUT,
    POLL,
    DemoJob,
    describe_exit,
    last_error,
    tail,
)
from watchdog.cli.demo.report import incident_lines, read_incidents
from watchdog.states import FINAL, PAST_DEADLINE, WAITING_LONG, End, State
from watchdog.status import RankStatus

FAULTS = ("stop", "kill", "mismatch")


@dataclass
class _Result:
    fault_at: float = 0.0  # demo seconds
    victim: int = -1
    step_at_fault: int = 0
    problems: list[str] = field(default_factory=list)



class Demo(DemoJob):
    """The story: healthy steps, the fault, what the watchdog sees, the verdict."""

    # -- phases ------------------------------------------------------------------

    def progress_line(self, seen: dict[int, RankStatus]) -> str:
        """Each rank's step and state in one line, as the daemon shows them."""
        parts = []
        for r in self.ranks:
            info = seen.get(r.rank)
            parts.append(f"rank {r.rank} at step {info.steps or 0} ({info.state})"
                         if info else f"rank {r.rank} not seen yet")
        return "; ".join(parts)

    def healthy_phase(self) -> int:
        """A few seconds of normal progress; returns the step count before the fault."""
        seconds = min(max(3.0, self.deadline), 5.0)
        until = time.monotonic() + seconds
        seen: dict[int, RankStatus] = {}
        while True:
            seen = self.rank_status(self.status())
            self.say(self.progress_line(seen))
            if time.monotonic() + 1.0 > until:
                break
            time.sleep(1.0)
        return min((s.steps or 0 for s in seen.values()), default=0)

    def inject(self, result: _Result) -> None:
        """Inject the chosen fault into a rank and say what it stands for."""
        result.fault_at = self.now()
        if self.fault == "stop":
            victim = self.ranks[1]
            os.kill(victim.pid, signal.SIGSTOP)
            self.stopped.add(victim.pid)
            result.victim = victim.rank
            self.say(f"rank {victim.rank} frozen with SIGSTOP (pid {victim.pid})")
            self.note("like a wedged host or GPU in a JACCL or ring hang: its peers")
            self.note("now wait in all_sum forever, one thread spinning: it wants a whole")
            self.note("core (what the verdict reads); the share of one it gets, shown below,")
            self.note("is less on a busy machine. No error: nothing in MLX ends this job.")
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

    def state_line(self, seen: dict[int, RankStatus]) -> str:
        """Each rank's state in one line, with its wait and busiest thread while it waits."""
        parts = []
        for r in self.ranks:
            info = seen.get(r.rank)
            if info is None:
                parts.append(f"rank {r.rank} gone")
                continue
            state = str(info.state)
            text = f"rank {r.rank} {state}"
            if state in WAITING_LONG or (state == "running" and info.phase == "wait"
                                    and (info.seconds_in_wait or 0) >= 0.5):
                cpu = info.busiest_thread_cpu
                text += (f" ({info.seconds_in_wait or 0:.1f}s in "
                         f"{info.current_op or 'a wait'}"
                         + (f", busiest thread got {cpu:.0%} of a core" if cpu is not None
                            else "") + ")")
            elif state == "exited" and "without closing" in str(info.reason):
                text += " (died without closing its record)"
            parts.append(text)
        return "watchdog sees: " + "; ".join(parts)

    def _report_exits(self) -> None:
        for r in self.ranks:
            code = r.proc.poll()
            if code is None or r.reported:
                continue
            r.reported = True
            why = describe_exit(code)
            last = last_error(r.log)
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
                self.note(tail(self.daemon_log, 10).replace("\n", "\n        "))
                return False
            seen = self.rank_status(self.status())
            line = self.state_line(seen)
            if time.monotonic() - last_at >= 1.0 or _states(line) != _states(last_line):
                self.say(line)  # each second, and at once when a state changes
                last_line, last_at = line, time.monotonic()
            incidents = read_incidents(self.state_dir)
            for inc in incidents[incidents_seen:]:
                self.say(f"incident {inc.id} written to incidents.jsonl: "
                         f"verdict {inc.verdict}, {inc.action or ''}")
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
                final = all(str(s.state) in FINAL for s in seen.values())
                if final or time.monotonic() - done_at > 4 * INTERVAL + 1:
                    if line != last_line:
                        self.say(line)
                    return True
            time.sleep(POLL)
        self.say(f"gave up after {timeout:.0f}s without the expected outcome")
        return False

    # -- the outcome ---------------------------------------------------------------

    def judge(self, result: _Result, reached: bool) -> bool:
        """Print the incidents and the summary; True when the demo went as expected."""
        incidents = read_incidents(self.state_dir)
        for inc in incidents:
            for line in incident_lines(inc, self.state_dir, self.t0_wall):
                self.echo(line)
        survivors = [r for r in self.ranks if r.rank != result.victim or self.fault != "kill"]
        alive = [r for r in survivors if r.proc.poll() is None]
        took = self.now() - result.fault_at
        self.echo("Summary")
        if self.fault == "kill":
            codes = ", ".join(f"rank {r.rank} {describe_exit(r.proc.returncode)}"
                              for r in survivors if r.proc.returncode is not None)
            lost = [r.rank for r in survivors if "connection to a peer was lost"
                    in tail(r.log, 20)]
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
            first = incidents[0] if incidents else None
            if first is None:
                result.problems.append("no incident was written")
            else:
                inc = first
                culprit = inc.culprit
                hung = sorted(r.rank if r.rank is not None else -1 for r in inc.ranks
                              if r.state in PAST_DEADLINE)
                if self.fault == "stop" and (culprit.rank if culprit else None) != result.victim:
                    result.problems.append(f"the incident names "
                                           f"{culprit.to_json() if culprit else 'no culprit'}, "
                                           f"not the frozen rank {result.victim}")
                if self.fault == "mismatch" and result.victim not in hung:
                    result.problems.append(f"rank {result.victim} is not among the hung "
                                           f"ranks {hung} of the incident")
                outcome = inc.outcome or {}
                # "exited": a rank that left on the ring's own error once the watchdog had
                # ended a peer (the teardown all the same, not a kill of its own).
                ended = sorted(r.rank for r in self.ranks
                               if outcome.get(str(r.pid)) in (End.KILLED, End.EXITED))
                missing = [r.rank for r in self.ranks if r.rank not in ended]
                if missing:
                    result.problems.append(f"ranks {_ranks(missing)} were not ended by the "
                                           "watchdog")
                what = ("frozen with SIGSTOP" if self.fault == "stop"
                        else "sent into a recv nobody answers")
                at = inc.time - self.t0_wall
                self.echo(f"  rank {result.victim} was {what} at {result.fault_at:.1f}s "
                          f"(step ~{result.step_at_fault}).")
                self.echo(f"  the watchdog judged the job {inc.verdict} at {at:.1f}s "
                          f"({at - result.fault_at:.1f}s later, deadline {self.deadline:g}s),")
                who = (f"named rank {culprit.rank} as the culprit"
                       if culprit else f"found rank(s) {_ranks(hung)} hung")
                self.echo(f"  {who}, captured {len(inc.evidence or ())} evidence "
                          f"file(s), and ended ranks {_ranks(ended)} "
                          f"(SIGCONT, SIGTERM, {GRACE:g}s grace, SIGKILL if needed).")
                if inc.verdict == State.BLOCKED:
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
        """Run the whole demo; returns its exit code (0 as expected, 1 otherwise)."""
        self.echo(f"mlx-watchdog demo: {self.size} MLX ring ranks on 127.0.0.1, fault "
                  f"'{self.fault}', deadline {self.deadline:g}s")
        self.echo(f"scratch directory {self.tmp} "
                  + ("(kept at the end: --keep)" if self.keep else
                     "(removed at the end, evidence too; --keep keeps it)"))
        if not self.start_daemon() or not self.start_ranks():
            self.echo("Summary\n  NOT AS EXPECTED: the demo could not start")
            return 1
        result = _Result()
        result.step_at_fault = self.healthy_phase()
        self.inject(result)
        reached = self.watch(result)
        return 0 if self.judge(result, reached) else 1

def _ranks(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers)) or "none"


def _states(line: str) -> list[str]:
    return re.findall(r"rank \d+ (\w+)", line)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_demo(ranks: int = 3, deadline: float = 4.0, fault: str = "stop",
             keep: bool = False) -> int:
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
        demo = Demo(ranks, deadline, fault, keep=keep)
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
