"""Acting on a process: the one seam that sends signals, and only to the right one.

A `Target` is a rank's identity as its record gives it (pid, start time, uid,
start ticks). `Signaller.send` re-checks that identity right before the
signal, through a pidfd where the platform has one, so a recycled pid is
never hit, and a check that cannot be made sends nothing. "Already gone" is a
result, not an error. Tests pass a fake.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from watchdog.daemon import observation
from watchdog.daemon.observation import Presence
from watchdog.daemon.probes import Probe
from watchdog.states import End, Word

# Signals a record may name for its stack dump. Anything else (a forged record
# asking for SIGKILL, say) is ignored.
DUMP_SIGNALS = frozenset(
    {int(signal.SIGUSR1), int(signal.SIGUSR2)}
    | set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1) if hasattr(signal, "SIGRTMIN") else ()))



class Result(Word):
    """What a signal (`send`) or an identity check (`identify`) came to."""

    SENT = "sent"
    GONE = "gone"
    NOT_OURS = "not-ours"
    DENIED = "denied"
    # What an identity check can say besides GONE and NOT_OURS. UNKNOWN (the probe
    # failed) is never taken as a match: nothing is signalled on it, and it is
    # never taken as proof that a process ended or survived either.
    OURS = "ours"
    UNKNOWN = "unknown"


# An identity check as a signal result (`observation.identify` never says CLOSED: a
# target is a process, not a record).
_SAID = {Presence.LIVE: Result.OURS, Presence.GONE: Result.GONE,
         Presence.NOT_OURS: Result.NOT_OURS, Presence.UNKNOWN: Result.UNKNOWN}

# A signal or an identity check that stopped the ladder for a rank: how it left it.
_ENDS = {Result.GONE: End.GONE, Result.NOT_OURS: End.NOT_OURS, Result.DENIED: End.DENIED,
         Result.UNKNOWN: End.UNKNOWN}


def end_of(result: Result) -> End:
    """How `result` (GONE, NOT_OURS, DENIED or UNKNOWN; never SENT or OURS) leaves a
    rank for its response's ladder: the same word, as an `End`."""
    return _ENDS[result]


@dataclass(frozen=True)
class Target:
    """A rank process the ladder may signal: identity first."""

    pid: int
    start_time: float
    uid: int
    job: str
    rank: int
    dump_signal: int = 0
    stacks_path: str = ""
    start_ticks: int = 0  # clock ticks since boot (Linux); 0: unknown, compare start_time
    record_path: str = ""  # its record, read to tell a rank ending on its own error


class Signaller:
    """Signals a process only if it is still the one the record describes."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def identify(self, target: Target) -> Result:
        """OURS, GONE, NOT_OURS, or UNKNOWN when the probe failed."""
        return _SAID[observation.identify(self.probe, target.pid, target.start_time,
                                          target.uid, target.start_ticks).seen]

    def alive(self, target: Target) -> bool:
        """Positively still the process the record describes (a failed probe is not)."""
        return self.identify(target) == Result.OURS

    def send(self, target: Target, signum: int) -> Result:
        """Send `signum` to the target if it still is that process; what it came to."""
        pidfd = -1
        if hasattr(os, "pidfd_open"):
            # A pidfd pins the process: once the identity is checked through it,
            # the signal cannot reach a recycled pid.
            try:
                pidfd = os.pidfd_open(target.pid)
            except ProcessLookupError:
                return Result.GONE
            except OSError:
                pidfd = -1
        try:
            # Fail closed: only a positive match (pid, start, uid) is signalled.
            who = self.identify(target)
            if who != Result.OURS:
                return who
            if pidfd >= 0:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(target.pid, signum)
            return Result.SENT
        except ProcessLookupError:
            return Result.GONE
        except PermissionError:
            return Result.DENIED
        finally:
            if pidfd >= 0:
                os.close(pidfd)
