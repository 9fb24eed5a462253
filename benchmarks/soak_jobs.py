"""The chaos soak's settings and its ledger: the real ring jobs it ran, the faults it put
into them, and how each rank exited.

Part of the chaos soak of benchmarks/soak.py (run that, not this): the driver fills the
ledger, the oracle (benchmarks/soak_oracle.py) judges it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ranks import RingJob

INJECTED = ("short_pause", "long_pause", "sigkill", "recv")
WEIGHTS = {"short_pause": 4, "long_pause": 2, "sigkill": 2, "recv": 1}
HANGS = ("long_pause", "recv")  # faults that leave ranks waiting forever
FATAL = ("long_pause", "recv", "sigkill")  # faults after which a job may be ended


@dataclass
class Config:
    """How long, how hard and at what pace the soak runs (the CLI sets a few of these)."""

    seconds: float = 300.0
    seed: int = 1
    deadline: float = 3.0
    blocked_deadline: float = 6.0
    interval: float = 0.25
    grace: float = 1.0
    evidence_timeout: float = 2.0
    max_ranks: int = 6  # rank processes alive at once (2 cores)
    lifetime: tuple[float, float] = (10.0, 30.0)  # seconds a healthy job runs
    pace: float = 0.02  # sleep between a job's rounds
    fault_gap: tuple[float, float] = (1.5, 4.0)  # seconds between injections
    short_pause: tuple[float, float] = (0.3, 1.5)  # must stay well under the deadline
    bound: float = 30.0  # a hang not ended this long after its deadline is missed
    drain: float = 45.0  # after the injection window: time for the jobs to end
    strangers: bool = True  # a second local user's hostile records (needs root)
    stranger_gap: tuple[float, float] = (4.0, 8.0)  # seconds between strangers
    workdir: Path | None = None
    keep: bool = False
    verbose: bool = False


@dataclass
class Fault:
    """One injected fault: what, on which job's rank, when it took effect."""

    kind: str
    job: str
    rank: int | None = None
    pid: int | None = None
    wall: float = 0.0  # when the fault took effect
    mono: float = 0.0
    resume_at: float | None = None  # short pause: when to SIGCONT (monotonic)
    located: bool = True  # recv: False until rank 0 is seen inside its hung wait


@dataclass
class Job:
    """A real ring job of the soak: its ranks, its faults, and how each rank exited."""

    name: str
    ring: RingJob
    mode: str
    lifetime: float
    launched: float  # monotonic
    running: bool = False
    faults: list[Fault] = field(default_factory=list)
    exits: dict[int, tuple[int, float]] = field(default_factory=dict)  # pid -> (code, wall)
    cleanup: set[int] = field(default_factory=set)  # pids the driver ended at the end

    def alive(self) -> list[int]:
        return [p.pid for p in self.ring.procs if p.pid not in self.exits]

    def fatal(self) -> Fault | None:
        return next((f for f in self.faults if f.kind in FATAL), None)

    def pausing(self) -> bool:
        return any(f.kind == "short_pause" and f.resume_at is not None for f in self.faults)
