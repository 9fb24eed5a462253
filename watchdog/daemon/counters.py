"""The daemon's counters: counted by its loop and its rank table, published with each
snapshot as a copy (`status.CounterValues`: `counters` in /status, what /metrics counts).
Mutable, and the daemon's alone: the contract holds only the copy."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from watchdog.states import State
from watchdog.status import CounterValues, job_key, stall_key

# The bounds of the scan-duration histogram (seconds), published as scan_bucket_bounds.
SCAN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(kw_only=True)
class Counters:
    """What the loop counts. The daemon starts from `zeroed`, every verdict and signal
    at 0, so each has its series from the start."""

    stalls: dict[str, int] = field(default_factory=dict)  # verdict -> hangs acted on
    stall_causes: dict[str, int] = field(default_factory=dict)  # stall_key -> count
    kills: dict[str, int] = field(default_factory=dict)  # signal -> sent to end a rank
    job_kills: dict[str, int] = field(default_factory=dict)  # job_key(uid, job) -> ranks
    invalid_records: int = 0
    probe_errors: int = 0
    loop_errors: int = 0
    scan_buckets: list[int] = field(default_factory=list)  # per bound, then +Inf
    scan_sum: float = 0.0
    scan_count: int = 0

    @classmethod
    def zeroed(cls) -> Counters:
        """The counters a daemon starts with."""
        return cls(stalls={State.STALLED.value: 0, State.BLOCKED.value: 0},
                   kills={"SIGTERM": 0, "SIGKILL": 0},
                   scan_buckets=[0] * (len(SCAN_BUCKETS) + 1))

    def stall(self, verdict: str, cause: str | None) -> None:
        """A hang acted on, counted by its verdict and cause."""
        self.stalls[verdict] += 1
        key = stall_key(verdict, cause)
        self.stall_causes[key] = self.stall_causes.get(key, 0) + 1

    def response_done(self, verdict: str | None, cause: str | None,
                      signals: Iterable[str]) -> None:
        """A response done: its hang counted when it was one acted on (a stalled or
        blocked verdict: not a fence, not a hold, which is re-asked every 5 s and is no
        new stall), and the signals that reached a rank."""
        if verdict in self.stalls:
            self.stall(verdict, cause)
        for name in signals:
            if name in self.kills:
                self.kills[name] += 1

    def job_killed(self, uid: int, job: str) -> None:
        """A rank the watchdog ended, counted per job (its owner's: `job_key`)."""
        counted = job_key(uid, job)
        self.job_kills[counted] = self.job_kills.get(counted, 0) + 1

    def loop_failed(self) -> None:
        """A scan, a step or a report failed; the loop went on."""
        self.loop_errors += 1

    def probe_failed(self) -> None:
        """A probe of the machine (wired memory) failed."""
        self.probe_errors += 1

    def observe_scan(self, seconds: float) -> None:
        """One scan's duration, into the histogram (SCAN_BUCKETS)."""
        self.scan_sum += seconds
        self.scan_count += 1
        for i, bound in enumerate(SCAN_BUCKETS):
            if seconds <= bound:
                self.scan_buckets[i] += 1
                break
        else:
            self.scan_buckets[-1] += 1

    def values(self) -> CounterValues:
        """The counters as they stand: a copy the loop's counting does not change."""
        return CounterValues(stalls=dict(self.stalls), stall_causes=dict(self.stall_causes),
                             kills=dict(self.kills), job_kills=dict(self.job_kills),
                             invalid_records=self.invalid_records,
                             probe_errors=self.probe_errors, loop_errors=self.loop_errors,
                             scan_buckets=tuple(self.scan_buckets), scan_sum=self.scan_sum,
                             scan_count=self.scan_count)
