"""The states a rank moves through and the phases its record reports.

Data only: this module imports nothing from the project, so the rank side, the
daemon and the CLI all share one spelling of each name.
"""

from __future__ import annotations

import enum


class Phase(enum.IntEnum):
    """What the rank says it is doing (written by the hook into the record)."""

    RUNNING = 1  # its own work, outside any blocking MLX call
    WAIT = 2  # inside a blocking MLX call (mx.eval, item, ...)
    IDLE = 3  # inside hb.idle(): waiting for requests, never a stall
    INIT = 4  # inside mx.distributed.init, which can hang on connect

    @property
    def label(self) -> str:
        """The phase's name as records and `status` show it (`wait`, `idle`, ...)."""
        return self.name.lower()


class Word(str, enum.Enum):
    """A word of the vocabulary: a str enum whose text is its value wherever it goes
    (str(), format() and f-strings on every Python, %s, JSON, metric labels), so an
    enum in place of a string constant changes no output byte."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class FrameKind(Word):
    """What a rank's threads ran at a stack sample (daemon/judge/frames.py), as a
    verdict, `/status` (`frames_kind`) and a peer's wedge read it."""

    WAITING = "waiting"  # spinning (or asleep) in a wait on a peer: computes nothing
    COMPUTING = "computing"  # in compute frames, a file read or write, or unnamed ones
    UNKNOWN = "unknown"  # no stack read, or no thread where it could be told


class Link(Word):
    """A rank's data-link probe (daemon/probes/datalink.py): `up`, or `down <address>
    (<how>)`; anything else is why it was not probed, in words."""

    UP = "up"
    DOWN = "down"

    @staticmethod
    def is_down(said: str | None) -> bool:
        """Does this probe's answer say the rank's data path is down?"""
        return (said or "").startswith(Link.DOWN.value)


class State(Word):
    """What the watchdog concludes about a rank (design section 5)."""

    RUNNING = "running"  # outside a wait, or its waits return within the deadline
    IDLE = "idle"  # inside hb.idle()
    SUSPECT = "suspect"  # in a wait past half the deadline
    STALLED = "stalled"  # in a wait past the deadline with one thread spinning
    BLOCKED = "blocked"  # in a wait past the deadline, nothing spinning
    STOPPED = "stopped"  # SIGSTOPped, no tracer: named the culprit, ended with its job
    # A tracer other than the daemon's own sampler holds it (a debugger, a profiler: a
    # person at work): its job is held for as long as it is traced, judged again from
    # the detach.
    TRACED = "traced"
    KILLED = "killed"  # the watchdog ended it
    UNKILLABLE = "unkillable"  # still present after SIGKILL and the kill timeout
    EXITED = "exited"  # gone on its own
    ABANDONED = "abandoned"  # alive, but its record is closed (frozen): reported, never acted on


class End(Word):
    """How a response's ladder left a rank (`Outcome.results`, an incident's `outcome`):
    ended, or why not. The first three are `State`'s words, the others the signaller's
    (its `Result`) for a signal or identity check that stopped the ladder for it."""

    KILLED = "killed"  # ended by its signals
    UNKILLABLE = "unkillable"  # still there after SIGKILL and the kill timeout
    EXITED = "exited"  # ended on its own error, unsignalled
    GONE = "gone"  # gone before a signal reached it
    NOT_OURS = "not-ours"  # its pid is another process now
    DENIED = "denied"  # signalling it was denied
    UNKNOWN = "unknown"  # its identity could not be checked: left alone, judged again


class Mode(Word):
    """What the daemon does about a hang (a setting; the status's, an incident's and a
    metric's `mode`)."""

    ENFORCE = "enforce"  # signal the hung ranks
    OBSERVE = "observe"  # report only


class Fenced(Word):
    """An incident's verdict when its job was ended for another's hang, not a wait of its
    own (besides STALLED and BLOCKED, the States a hung wait is judged)."""

    FENCED = "fenced"  # a peer node ended the job and told us (a fence)
    PEER_DIED = "peer_died"  # a rank of the job here died: the job cannot finish


class Unjudged(Word):
    """Why a rank's pace is not judged against its job's (daemon/judge/pacing.py): the
    code `/status` carries (`pace_unjudged`) and the metric's `reason` label."""

    ALONE = "alone"  # no peer here: a single process, or the only rank of its job here
    USER_SPACE_WAIT = "user_space_wait"  # its backend polls in user space: no wait share
    IDLE = "idle"  # in hb.idle() most of the time
    NO_COLLECTIVES = "no_collectives"  # none issued in the window
    TOO_FEW_SECONDS = "too_few_seconds"  # its window not filled yet
    SLEEPS = "sleeps"  # idle between steps most of the time (by design)
    PEER_UNJUDGED = "peer_unjudged"  # another rank of its job is not judged yet


class ProcStatus(Word):
    """A process's status as the OS reports it, in psutil's words (a test holds them
    to psutil's constants), so the judge reads a sample without importing psutil."""

    RUNNING = "running"
    SLEEPING = "sleeping"
    DISK_SLEEP = "disk-sleep"  # uninterruptible ('D'): a SIGSTOP waits until it leaves
    STOPPED = "stopped"  # SIGSTOP
    TRACING_STOP = "tracing-stop"  # stopped by a tracer (a debugger, py-spy, gdb)
    ZOMBIE = "zombie"
    DEAD = "dead"


# The sets the daemon, the metrics, the cluster view and the demo all judge by.
# A State compares equal to its text, so `"stalled" in HUNG` holds for JSON too.
HUNG = frozenset({State.STALLED, State.BLOCKED, State.UNKILLABLE})  # status --check exits 1
PAST_DEADLINE = frozenset({State.STALLED, State.BLOCKED})  # a hung wait, acted on
WAITING_LONG = frozenset({State.SUSPECT, State.STALLED, State.BLOCKED})  # past half a deadline
ENDED = frozenset({State.KILLED, State.EXITED})  # the process is gone
FINAL = ENDED | {State.UNKILLABLE}  # nothing more will happen to it
WAITING_PHASES = frozenset({Phase.WAIT.label, Phase.INIT.label})  # phases of a blocking call
STOPPED_STATUSES = frozenset({ProcStatus.STOPPED, ProcStatus.TRACING_STOP})
GONE_STATUSES = frozenset({ProcStatus.ZOMBIE, ProcStatus.DEAD})
