"""`mlx-watchdog launch`: run mlx.launch, watch the attempt, relaunch a torn-down job.

Each attempt runs mlx.launch as a child with the job's one id and the attempt
number in the ranks' environment (`--env MLX_WATCHDOG_JOB=... --env
MLX_WATCHDOG_ATTEMPT=n`). Its stdout is the launcher's; its stderr passes
through a thread that also reads mlx.launch's per-rank exit lines. While it
runs, the record directory is read a few times a second for the job's local
ranks (their pids, and their progress: completed waits and steps). When it
ends, the daemon's journal says whether the watchdog or a fence ended the job.
relaunch.py turns these facts into a decision; before every attempt the node
must be fit (health.py); every decision is journalled (launchlog.py); the
pipes and signals to the child are childio.py's.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from watchdog.daemon.attempts import ATTEMPT_ENV
from watchdog.daemon.config import LaunchSettings, Settings
from watchdog.daemon.recdir import read_dir
from watchdog.daemon.store import journal, launchlog
from watchdog.daemon.store.snapshot import daemon_status
from watchdog.launch import childio, relaunch
from watchdog.launch.health import Reference, wait_healthy, wired_now
from watchdog.launch.launcher import single_node
from watchdog.states import ENDED, WAITING_LONG, State
from watchdog.status import LaunchEvent
from watchdog.text import printable

POLL = 0.25  # seconds between looks at the record directory during an attempt
INTERRUPT_GRACE = 3.0  # seconds the ranks get to end on Ctrl-C before SIGTERM, then SIGKILL
# A rank of ours in one of these states: the daemon may be ending the job (a rank being
# ended keeps its state until the response is over, then is `killed`).
HANDLED = WAITING_LONG | {State.STOPPED}


@dataclass(frozen=True)
class Plan:
    """What `mlx-watchdog launch` was asked to run: mlx.launch's arguments, the job's
    name, the record directory and the node's settings."""
    mlx_launch: str
    args: list[str]  # the user's mlx.launch arguments, unchanged
    job: str
    job_given: bool  # the user named the job with --env: not added again
    record_dir: str
    settings: Settings  # the node's
    launch: LaunchSettings = LaunchSettings()  # the node's launch keys, the flags applied
    dir_given: bool = False  # the user named the record directory with --env: not added


def say(message: str) -> None:
    """Print one line of the launcher's on stderr, made safe."""
    sys.stderr.write(f"mlx-watchdog: {printable(message)}\n")
    sys.stderr.flush()


class Supervisor:
    """Runs a job under mlx.launch, reads how each attempt ended, and relaunches it
    while its budget lasts (never into a node flagged for reboot)."""
    def __init__(self, plan: Plan, *, sleep: Callable[[float], bool] | None = None) -> None:
        self.plan = plan
        self.settings = plan.settings
        self.journal_dir = launchlog.journal_dir(self.settings.state_dir)
        self.interrupted = 0
        self.interrupted_at = 0.0
        self.stop = threading.Event()  # set by SIGINT/SIGTERM: end waits at once
        self.child: subprocess.Popen[bytes] | None = None
        self._sleep = sleep or self.stop.wait
        self.reference: Reference | None = None  # the node before attempt 1 (health.py)

    # -- the journal -----------------------------------------------------------

    def record(self, event: str, attempt: int, **facts: Any) -> None:
        """Append an event of the attempt to the launch journal (a failure is said, not raised)."""
        entry = LaunchEvent(time=time.time(), host=socket.gethostname(), uid=os.getuid(),
                            job=self.plan.job, attempt=attempt, event=event, **facts)
        try:
            launchlog.append(self.journal_dir, entry)
        except OSError as err:
            say(f"cannot journal the {event} in {self.journal_dir}: {err.strerror or err}")

    # -- signals ---------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """Ctrl-C or SIGTERM: pass it on to mlx.launch and every rank it started here;
        a second one ends them with SIGKILL. Never relaunched."""
        again = bool(self.interrupted)
        if not again:
            self.interrupted, self.interrupted_at = signum, time.monotonic()
        self.stop.set()
        self._signal_tree(signal.SIGKILL if again else signum)

    def _signal_tree(self, signum: int) -> None:
        if self.child is not None:
            childio.signal_tree(self.child, signum)

    def _hurry(self, sent: int) -> int:
        """After an interrupt, mlx.launch no longer ends the ranks left when one exits
        (its main thread got the KeyboardInterrupt), and a rank whose peer is gone can
        wait a long time: SIGTERM what is left after INTERRUPT_GRACE, SIGKILL after
        twice that. Returns the escalations sent so far."""
        waited = time.monotonic() - self.interrupted_at
        if sent < 2 and waited > INTERRUPT_GRACE * (sent + 1):
            self._signal_tree(signal.SIGKILL if sent else signal.SIGTERM)
            return sent + 1
        return sent

    # -- one attempt -----------------------------------------------------------

    def argv(self, number: int) -> list[str]:
        """The `mlx.launch` command of attempt `number`: the job id, the directory, the attempt."""
        ours = [] if self.plan.job_given else ["--env", f"MLX_WATCHDOG_JOB={self.plan.job}"]
        # The ranks publish where this node's daemon watches (the config's `dir`), on
        # every host (ssh forwards none of our environment; --env reaches each rank).
        if not self.plan.dir_given:
            ours += ["--env", f"MLX_WATCHDOG_DIR={self.plan.record_dir}"]
        return [self.plan.mlx_launch, *ours, "--env", f"{ATTEMPT_ENV}={number}",
                *self.plan.args]

    def _watch_records(self, attempt: relaunch.Attempt) -> None:
        uid = os.getuid()
        if not os.path.isdir(self.plan.record_dir):
            return  # no ranks publish here (yet): no progress to see
        for _path, rec, _why, _st in read_dir(self.plan.record_dir):
            if rec is not None and rec.job == self.plan.job and rec.uid == uid:
                attempt.pids.add(rec.pid)
                attempt.see_progress(rec.waits_completed, rec.steps)

    def _others_live(self) -> bool:
        """Do ranks of other jobs run here? The daemon's view, else the record directory."""
        snap = daemon_status(self.settings.state_dir)
        if snap is not None:
            return any(r.job != self.plan.job and r.state not in ENDED
                       for r in snap.ranks)
        return os.path.isdir(self.plan.record_dir) and any(
            rec is not None and rec.job != self.plan.job
            for _path, rec, _why, _st in read_dir(self.plan.record_dir))

    def _hung_seen(self, attempt: relaunch.Attempt) -> tuple[bool, float]:
        """Does the daemon hold one of this attempt's ranks as hung (maybe ending it)?
        And the monotonic time of its last scan (0 without a daemon)."""
        snap = daemon_status(self.settings.state_dir)
        if snap is None:
            return False, 0.0
        hung = any(r.pid in attempt.pids and r.job == self.plan.job and r.state in HANDLED
                   for r in snap.ranks)
        return hung, float(snap.scan_monotonic or 0.0)

    def run_attempt(self, number: int) -> relaunch.Attempt:
        """Run one attempt to its end and gather its facts."""
        attempt = relaunch.Attempt(number=number, started=time.time())
        # mlx.launch polls its stdin and, at end of file (/dev/null under a service, a
        # script's redirect), spins a core on it for the whole run: unless stdin is a
        # terminal, it gets a pipe of ours that stays open, fed from our stdin.
        terminal = childio.isatty(0)
        try:
            child = subprocess.Popen(self.argv(number), stderr=subprocess.PIPE,
                                     stdin=None if terminal else subprocess.PIPE)
        except OSError as err:
            raise LaunchFailed(f"cannot run {self.plan.mlx_launch}: {err.strerror}") from None
        self.child = child
        assert child.stderr is not None
        if child.stdin is not None:
            threading.Thread(target=childio.feed, args=(child.stdin,), daemon=True,
                             name="stdin").start()
        pump = threading.Thread(target=childio.pump,
                                args=(child.stderr, attempt, lambda: bool(self.interrupted)),
                                daemon=True,
                                name="stderr")
        pump.start()
        hung, hurried = False, 0
        while child.poll() is None:
            if self.interrupted:
                hurried = self._hurry(hurried)
            self._watch_records(attempt)
            hung = hung or self._hung_seen(attempt)[0]
            try:
                child.wait(POLL)
            except subprocess.TimeoutExpired:
                continue
        ended = time.monotonic()
        pump.join(10)
        attempt.launcher_code = child.returncode
        attempt.interrupted = self.interrupted
        self._find_incident(attempt, hung, ended)
        return attempt

    def _find_incident(self, attempt: relaunch.Attempt, hung: bool, ended: float) -> None:
        """The daemon journals its incident once the ranks are gone and wired memory
        has settled, which can be after mlx.launch saw them die: wait for it while
        the daemon holds one of our ranks as hung, or a rank died of a signal."""
        s = self.settings
        signalled = any(code is None or (code < 0 and -code != signal.SIGINT)
                        for _, code in attempt.exits)
        until = ended + (s.ladder().ladder_span() + 5 if hung or signalled else 0.0)
        while True:
            attempt.incident = relaunch.incident_for(
                journal.read_incidents(s.state_dir)[0], self.plan.job, attempt)
            if attempt.incident is not None:
                for rank in attempt.incident.ranks:
                    if isinstance(rank.progress, int):
                        attempt.see_progress(rank.progress, 0)
                return
            now = time.monotonic()
            if now >= until or self.stop.is_set():
                return
            hung_now, scanned = self._hung_seen(attempt)
            if scanned == 0.0 or (scanned > ended + s.interval and not hung_now):
                # No daemon; or it scanned since, and no response to ours is under way
                # (its ranks keep their hung state until the response ends): a last look.
                attempt.incident = relaunch.incident_for(
                    journal.read_incidents(s.state_dir)[0], self.plan.job, attempt)
                return
            self.stop.wait(0.2)

    # -- the attempts ----------------------------------------------------------

    def run(self) -> int:
        """Run attempts until one ends for good; returns `launch`'s exit code."""
        s = self.plan.launch
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._attempts(s)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _attempts(self, s: LaunchSettings) -> int:
        number, stalled_in_a_row = 0, 0
        while True:
            number += 1
            if not self._fit(number):
                return relaunch.EXIT_REFUSED
            if self.stop.is_set():
                return 128 + self.interrupted
            if self.reference is None:
                wired = wired_now()
                if wired is not None:
                    self.reference = Reference(wired, self._others_live)
            self.record("launch", number, argv=tuple(self.argv(number)))
            attempt = self.run_attempt(number)
            ending = relaunch.ending_of(attempt)
            code = relaunch.exit_code(ending, attempt.interrupted)
            why = relaunch.describe(attempt, ending)
            progressed = relaunch.progressed(attempt, s.warmup_waits)
            self.record("ended", number, ending=ending.value, reason=why, exit_code=code,
                        launcher_code=attempt.launcher_code, progressed=progressed,
                        waits=attempt.waits, steps=attempt.steps,
                        incident=attempt.incident.id if attempt.incident else None)
            if not relaunch.restartable(ending, s.restart_on) or s.restart == 0:
                if ending is not relaunch.Ending.CLEAN:
                    say(f"job {self.plan.job} attempt {number}: {why}; exit {code}")
                return code
            stalled_in_a_row = 0 if progressed else stalled_in_a_row + 1
            if stalled_in_a_row >= s.max_no_progress:
                reason = (f"{stalled_in_a_row} attempts in a row made no progress past the "
                          f"warm-up ({s.warmup_waits} waits, no hb.step()); last: {why}")
                self.record("gave_up", number, reason=reason, exit_code=relaunch.EXIT_GAVE_UP)
                say(f"job {self.plan.job}: giving up: {reason}; exit "
                    f"{relaunch.EXIT_GAVE_UP}")
                return relaunch.EXIT_GAVE_UP
            if number > s.restart:
                say(f"job {self.plan.job} attempt {number}: {why}; no restart left of "
                    f"{s.restart}; exit {code}")
                return code
            wait = relaunch.backoff(s.restart_backoff, number)
            self.record("restart", number + 1, reason=why, backoff=wait,
                        restarts_left=s.restart - number)
            say(f"job {self.plan.job} attempt {number}: {why}; relaunching as attempt "
                f"{number + 1} of {s.restart + 1} in {wait:g}s")
            if self._sleep(wait):
                return 128 + self.interrupted

    def _fit(self, number: int) -> bool:
        """Wait for the node to be fit for attempt `number`; journal a refusal. A job
        of this node alone is not held for its peers (their reboot flags)."""
        settings = self.settings
        if settings.peers and single_node(self.plan.args):
            settings = dataclasses.replace(settings, peers=())
        health = wait_healthy(settings, self.plan.launch.health_timeout,
                              reference=self.reference, on_wait=lambda problem: say(
                                  f"job {self.plan.job}: waiting up to "
                                  f"{self.plan.launch.health_timeout:g}s before attempt "
                                  f"{number}: {problem}"),
                              sleep=self.stop.wait)
        if self.stop.is_set():
            return True  # interrupted while waiting: the caller exits 128+signal
        if number == 1 and self.plan.launch.restart:
            for note in health.notes:  # what could not be checked, said once
                say(f"job {self.plan.job}: note: {note}")
        if health.problem is None:
            return True
        self.record("refused", number, reason=health.problem, exit_code=relaunch.EXIT_REFUSED)
        # "; exit N": what came before may end in a parenthesis of its own.
        say(f"job {self.plan.job}: refusing attempt {number}: {health.problem}; "
            f"exit {relaunch.EXIT_REFUSED}")
        return False


class LaunchFailed(Exception):
    """mlx.launch could not be started at all."""
