"""What `mlx-watchdog launch` makes of an attempt: how it ended, whether to relaunch,
the exit code. Pure: the supervisor (supervisor.py) gathers the facts.

mlx.launch exits 0 whatever its ranks do; the facts that count are its
per-rank lines on stderr ("Node with rank 1 exited with code 3"), the
incident the daemon journals when it ends the job, and whether the launch was
interrupted. An attempt ends one way:

    ending       what happened                                 relaunched   exit code
    clean        every rank exited 0                           never        0
    failed       a rank exited non-zero on its own             with `any`   10
    crashed      a rank died of a signal the watchdog didn't   yes          10
                 send (SIGSEGV, the OOM killer's SIGKILL...)
    watchdog     the daemon ended the job (its incident)       yes          11
    fenced       a peer node's fence ended it (its incident)   yes          11
    interrupted  Ctrl-C (SIGINT) or SIGTERM to the launcher    never        130 / 143

and the launcher adds two endings of its own: `refused` (12: the node is not
fit for a relaunch) and `gave up` (13: attempts in a row without progress).
"""

from __future__ import annotations

import enum
import os
import re
import signal
from dataclasses import dataclass, field

from watchdog.daemon.config import RestartOn
from watchdog.launch import codes
from watchdog.states import End, Fenced
from watchdog.status import Incident

EXIT_OK = 0
EXIT_RANKS_FAILED = codes.RANKS_FAILED
EXIT_TORN_DOWN = codes.TORN_DOWN
EXIT_REFUSED = codes.REFUSED
EXIT_GAVE_UP = codes.GAVE_UP
MAX_BACKOFF = 60.0

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# mlx.launch's report of each rank that did not exit 0 (mlx/_distributed_utils/launch.py):
# "\x1b[33m[WARN] Node with rank R exited with code C \x1b[0m". Found anywhere in a line,
# by its "[WARN] " or, when a rank's own text (the ranks' stderr shares the pipe) landed
# between that and the rest (seen in CI: "[ring] Socket 4  Node with rank 1 ..."), by the
# colour reset after it; a rank printing the bare words is not mlx.launch.
_RANK_TEXT = r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)"
_RANK_LINE = re.compile(r"\[WARN\] " + _RANK_TEXT)
_RANK_TAIL = re.compile(_RANK_TEXT + r" ?\x1b\[0m")


class Ending(enum.Enum):
    """How one attempt of a launched job ended (the launcher's exit code follows it)."""
    CLEAN = "clean"
    FAILED = "failed"
    CRASHED = "crashed"
    WATCHDOG = "watchdog"
    FENCED = "fenced"
    INTERRUPTED = "interrupted"


@dataclass
class Attempt:
    """The facts of one attempt, filled in by the supervisor."""

    number: int
    started: float  # wall time, to match the daemon's incidents
    launcher_code: int | None = None
    exits: list[tuple[int, int | None]] = field(default_factory=list)  # (rank, code); None: killed
    interrupted: int = 0  # the signal that interrupted the launch, or 0
    incident: Incident | None = None
    pids: set[int] = field(default_factory=set)  # local ranks seen in the record directory
    waits: int = 0  # the most waits any rank completed
    steps: int = 0  # the most hb.step() any rank made

    def see_line(self, line: str) -> None:
        """One line of mlx.launch's stderr."""
        match = _RANK_LINE.search(_ANSI.sub("", line)) or _RANK_TAIL.search(line)
        if match:
            code = match.group(2)
            self.exits.append((int(match.group(1)), int(code) if code is not None else None))

    def see_progress(self, waits: int, steps: int) -> None:
        """Keep the most completed waits and steps the attempt's ranks showed."""
        self.waits, self.steps = max(self.waits, waits), max(self.steps, steps)


def ending_of(attempt: Attempt) -> Ending:
    """How the attempt ended, from its facts (interrupt, incident, mlx.launch's lines)."""
    if attempt.interrupted:
        return Ending.INTERRUPTED
    if attempt.launcher_code == 0 and not attempt.exits and not _ended_by(attempt.incident):
        # Every rank exited 0, even if the watchdog was ending them (a frozen rank
        # resumed by its SIGCONT may finish before the SIGTERM lands): done.
        return Ending.CLEAN
    if attempt.incident is not None:
        return Ending.FENCED if attempt.incident.verdict == Fenced.FENCED else Ending.WATCHDOG
    # The order of mlx.launch's lines is its threads' (racy), so no line is "the first":
    # a rank that died of a signal other than SIGINT (Ctrl-C) and SIGTERM (what mlx.launch
    # ends the other ranks with) crashed; else the ranks failed on their own (a peer's
    # loss makes a ring rank raise and exit 1), or mlx.launch itself did.
    return Ending.CRASHED if _crashes(attempt) else Ending.FAILED


def _ended_by(incident: Incident | None) -> bool:
    """Did the daemon's signals end a rank? (With `--backend mpi`, mlx.launch prints no
    per-rank lines at all: the incident's outcome is then what says so.)"""
    outcome = incident.outcome if incident is not None else None
    return isinstance(outcome, dict) and any(
        result in (End.KILLED, End.UNKILLABLE) for result in outcome.values())


def _crashes(attempt: Attempt) -> list[tuple[int, int]]:
    return [(rank, code) for rank, code in attempt.exits
            if code is not None and code < 0 and -code not in (signal.SIGINT, signal.SIGTERM)]


def _one_exit(rank: int, code: int) -> str:
    if code >= 0:
        return f"rank {rank} exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"rank {rank} died of {name}"


def describe(attempt: Attempt, ending: Ending) -> str:
    """One line: why the attempt ended."""
    if ending is Ending.CLEAN:
        return "every rank exited 0"
    if ending is Ending.INTERRUPTED:
        return f"interrupted by {signal.Signals(attempt.interrupted).name}"
    if ending in (Ending.WATCHDOG, Ending.FENCED):
        who = "a fence ended it" if ending is Ending.FENCED else "the watchdog ended it"
        inc = attempt.incident
        return (f"{who} (incident {inc.id if inc else None}: "
                f"{inc.reason if inc else None})")
    failed = sorted({(rank, code) for rank, code in attempt.exits if code is not None})
    if not failed:
        return (f"mlx.launch exited with code {attempt.launcher_code}" if attempt.launcher_code
                else "a rank was killed by mlx.launch")
    crashes = _crashes(attempt)
    shown = crashes + [f for f in failed if f not in crashes]
    return ", ".join(_one_exit(rank, code) for rank, code in shown)


def exit_code(ending: Ending, interrupted: int = 0) -> int:
    """`launch`'s exit code for an ending (128 + the signal when interrupted)."""
    if ending is Ending.INTERRUPTED:
        return 128 + interrupted
    return {Ending.CLEAN: EXIT_OK, Ending.FAILED: EXIT_RANKS_FAILED,
            Ending.CRASHED: EXIT_RANKS_FAILED, Ending.WATCHDOG: EXIT_TORN_DOWN,
            Ending.FENCED: EXIT_TORN_DOWN}[ending]


def restartable(ending: Ending, restart_on: str) -> bool:
    """Torn down (by the watchdog, a fence, a signal) is relaunched; a rank's own
    failure only with `any`; a clean exit and an interrupt never."""
    if ending in (Ending.WATCHDOG, Ending.FENCED, Ending.CRASHED):
        return True
    return ending is Ending.FAILED and restart_on == RestartOn.ANY


def progressed(attempt: Attempt, warmup_waits: int) -> bool:
    """Did the job get past its warm-up: a user step, or more waits than the warm-up's?"""
    return attempt.steps > 0 or attempt.waits > warmup_waits


def backoff(base: float, restart: int) -> float:
    """Seconds before relaunch number `restart` (1, 2, ...): doubling, capped."""
    return min(MAX_BACKOFF, base * 2 ** (restart - 1)) if base > 0 else 0.0


def incident_for(incidents: list[Incident], job: str, attempt: Attempt,
                 slack: float = 1.0, uid: int | None = None) -> Incident | None:
    """The daemon's incident that ended this attempt of `job`, if any (newest first).

    Only an incident of our own uid (`uid`, default the launcher's) counts: a job
    id is world-readable (mlx.launch's command line), and another user's hung
    process naming it gets an incident of theirs journaled under it. The job
    keeps its name across attempts, so an incident counts only if it came after
    the attempt started, names this attempt when it names one, and ended ranks
    we saw when we saw any.
    """
    own = os.getuid() if uid is None else uid
    for found in reversed(incidents):
        if found.job != job or not found.time or found.uid != own:
            continue
        if found.time < attempt.started - slack:
            continue  # an earlier attempt's (appended in the order responses ended)
        if found.attempt not in (None, attempt.number):
            continue
        pids = set(found.pids)
        if attempt.pids and pids and not pids & attempt.pids:
            continue
        return found
    return None
