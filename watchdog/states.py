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
        return self.name.lower()


class State(str, enum.Enum):
    """What the watchdog concludes about a rank (design section 5)."""

    RUNNING = "running"  # outside a wait, or its waits return within the deadline
    IDLE = "idle"  # inside hb.idle()
    SUSPECT = "suspect"  # in a wait past half the deadline
    STALLED = "stalled"  # in a wait past the deadline with one thread spinning
    BLOCKED = "blocked"  # in a wait past the deadline, nothing spinning
    STOPPED = "stopped"  # SIGSTOPped or traced
    KILLED = "killed"  # the watchdog ended it
    UNKILLABLE = "unkillable"  # still present after SIGKILL and the kill timeout
    EXITED = "exited"  # gone on its own
    ABANDONED = "abandoned"  # alive, but its record is closed (frozen): reported, never acted on

    def __str__(self) -> str:
        return self.value


# The sets the daemon, the metrics, the cluster view and the demo all judge by.
# A State compares equal to its text, so `"stalled" in HUNG` holds for JSON too.
HUNG = frozenset({State.STALLED, State.BLOCKED, State.UNKILLABLE})  # status --check exits 1
PAST_DEADLINE = frozenset({State.STALLED, State.BLOCKED})  # a hung wait, acted on
WAITING_LONG = frozenset({State.SUSPECT, State.STALLED, State.BLOCKED})  # past half a deadline
ENDED = frozenset({State.KILLED, State.EXITED})  # the process is gone
FINAL = ENDED | {State.UNKILLABLE}  # nothing more will happen to it
WAITING_PHASES = frozenset({Phase.WAIT.label, Phase.INIT.label})  # phases of a blocking call
