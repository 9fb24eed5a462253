"""Fakes for the pure/unit layer: a clock, a signaller and a probe.

They stand in for the OS seams (`probes.Probe`, `signaller.Signaller`) and for
time, so the ladder runs instantly and records what it would have done. They
are used by the unit tests only; MLX is never faked.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

from watchdog.daemon.probes import Probe, ProbeError, ProcessSample
from watchdog.daemon.signaller import Result, Target


class FakeClock:
    """Monotonic seconds that move only when someone sleeps (or `advance`s)."""

    def __init__(self, start: float = 1000.0, wall_origin: float = 1.7e9) -> None:
        self.t = start
        self.wall_origin = wall_origin
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += max(seconds, 0.0)

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def wall(self) -> float:
        """Epoch seconds that follow the fake clock, for incident timestamps."""
        return self.wall_origin + self.t


# How a fake process reacts to the ladder.
DIES_ON_TERM = "term"  # a well-behaved rank: SIGTERM ends it
DIES_ON_KILL = "kill"  # ignores SIGTERM (a rank stuck in C code)
UNKILLABLE = "never"  # survives even SIGKILL (uninterruptible sleep in a driver)
STOPPED = "stopped"  # SIGSTOPped: SIGTERM waits for SIGCONT; SIGKILL ends it anyway
# Every rank is SIGSTOPped first by the ladder (its freeze): a SIGTERM while frozen waits
# for the SIGCONT that follows it (a handler's case; the default action would end it).


class FakeSignaller:
    """Records every (pid, signal) and simulates how each process reacts.

    Same duck type as `signaller.Signaller`: `alive(target)` and
    `send(target, signum) -> result`. Unknown pids are already gone.
    """

    def __init__(self, behaviours: dict[int, str] | None = None) -> None:
        self.behaviour: dict[int, str] = dict(behaviours or {})
        self.alive_pids: set[int] = set(self.behaviour)
        self.continued: set[int] = set()
        self.pending_term: set[int] = set()
        self.frozen: set[int] = set()  # SIGSTOPped by the ladder, not resumed yet
        self.sent: list[tuple[int, int]] = []  # every send, in order
        self.results: list[tuple[int, int, str]] = []

    def add(self, pid: int, behaviour: str) -> None:
        self.behaviour[pid] = behaviour
        self.alive_pids.add(pid)

    def identify(self, target: Target) -> str:
        return Result.OURS if target.pid in self.alive_pids else Result.GONE

    def alive(self, target: Target) -> bool:
        return target.pid in self.alive_pids

    def send(self, target: Target, signum: int) -> str:
        pid = target.pid
        self.sent.append((pid, signum))
        result = Result.SENT if pid in self.alive_pids else Result.GONE
        self.results.append((pid, signum, result))
        if result == Result.SENT:
            self._react(pid, signum)
        return result

    def _react(self, pid: int, signum: int) -> None:
        kind = self.behaviour.get(pid, DIES_ON_TERM)
        if signum == signal.SIGSTOP:
            self.frozen.add(pid)  # the ladder's freeze: SIGTERM waits for SIGCONT
            self.continued.discard(pid)
        elif signum == signal.SIGCONT:
            self.continued.add(pid)
            self.frozen.discard(pid)
            if pid in self.pending_term and kind != DIES_ON_KILL and kind != UNKILLABLE:
                self.alive_pids.discard(pid)  # a stopped process acts on SIGTERM once resumed
        elif signum == signal.SIGTERM and pid in self.frozen:
            self.pending_term.add(pid)
        elif signum == signal.SIGTERM:
            if kind == DIES_ON_TERM:
                self.alive_pids.discard(pid)
            elif kind == STOPPED:
                if pid in self.continued:
                    self.alive_pids.discard(pid)
                else:
                    self.pending_term.add(pid)
        elif signum == signal.SIGKILL and kind != UNKILLABLE:
            self.alive_pids.discard(pid)

    def signals_to(self, pid: int) -> list[str]:
        return [signal.Signals(s).name for p, s in self.sent if p == pid]

    def names(self) -> list[str]:
        return [signal.Signals(s).name for _, s in self.sent]


class FakeProbe(Probe):
    """A probe with settable samples and wired memory; no native stack tool.

    `wired` is an int, None, or a list of readings consumed one per call (the
    last one repeats), to make memory come back (or not) over time.
    `wired_error` raises `ProbeError` from `wired_bytes` when set.
    """

    name = "fake"

    def __init__(self, samples: dict[int, ProcessSample] | None = None,
                 wired: int | None | list[int | None] = None) -> None:
        self.samples: dict[int, ProcessSample] = dict(samples or {})
        self.wired = wired
        self.wired_error: str | None = None
        self.wired_reads = 0
        self.sampled: list[int] = []

    def set_sample(self, sample: ProcessSample) -> None:
        self.samples[sample.pid] = sample

    def remove(self, pid: int) -> None:
        self.samples.pop(pid, None)

    def sample(self, pid: int) -> ProcessSample | None:
        self.sampled.append(pid)
        return self.samples.get(pid)

    def wired_bytes(self) -> int | None:
        self.wired_reads += 1
        if self.wired_error:
            raise ProbeError(self.wired_error)
        if isinstance(self.wired, list):
            if len(self.wired) > 1:
                return self.wired.pop(0)
            return self.wired[0] if self.wired else None
        return self.wired

    def stack_command(self, pid: int) -> list[str] | None:
        return None


def process_sample(pid: int, start_time: float = 1.7e9, uid: int = 0,
                   status: str = "sleeping",
                   threads: Iterable[tuple[int, float]] = ()) -> ProcessSample:
    return ProcessSample(pid, start_time, uid, status, tuple(threads))


def target(pid: int, rank: int = 0, job: str = "job-1", start_time: float = 1.7e9,
           uid: int = 0, dump_signal: int = 0, stacks_path: str = "") -> Target:
    return Target(pid, start_time, uid, job, rank, dump_signal, stacks_path)
