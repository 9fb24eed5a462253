"""What the daemon publishes: its counters, and the snapshot of the node every reader
gets (`/status`, `/metrics`, `status.json`), rebuilt after each scan as one frozen
`status.NodeStatus`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from watchdog import __version__
from watchdog.daemon.config import Settings
from watchdog.daemon.ranks import Rank
from watchdog.daemon.store import journal
from watchdog.daemon.view import rank_status
from watchdog.status import CounterValues, NodeStatus, Unwritten

SCAN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
INVALID_LISTED = 100  # unusable files named in /status; all are counted


@dataclass
class Counters:
    stalls: dict[str, int] = field(default_factory=lambda: {"stalled": 0, "blocked": 0})
    kills: dict[str, int] = field(default_factory=lambda: {"SIGTERM": 0, "SIGKILL": 0})
    job_kills: dict[str, int] = field(default_factory=dict)
    invalid_records: int = 0
    probe_errors: int = 0
    loop_errors: int = 0
    scan_buckets: list[int] = field(default_factory=lambda: [0] * (len(SCAN_BUCKETS) + 1))
    scan_sum: float = 0.0
    scan_count: int = 0
    stall_causes: dict[str, int] = field(default_factory=dict)  # "verdict:cause" -> count

    def stall(self, verdict: str, cause: str | None) -> None:
        """A hang acted on, counted by its verdict and cause."""
        self.stalls[verdict] += 1
        key = f"{verdict}:{cause or 'unknown'}"
        self.stall_causes[key] = self.stall_causes.get(key, 0) + 1

    def observe_scan(self, seconds: float) -> None:
        """One scan's duration, into the histogram."""
        self.scan_sum += seconds
        self.scan_count += 1
        for i, bound in enumerate(SCAN_BUCKETS):
            if seconds <= bound:
                self.scan_buckets[i] += 1
                break
        else:
            self.scan_buckets[-1] += 1

    def values(self) -> CounterValues:
        """The counters as they stand, for the snapshot."""
        return CounterValues(dict(self.stalls), dict(self.kills), dict(self.job_kills),
                             self.invalid_records, self.probe_errors, self.loop_errors,
                             tuple(self.scan_buckets), self.scan_sum, self.scan_count,
                             dict(self.stall_causes))


def snapshot(*, host: str, settings: Settings, ranks: Iterable[Rank], counters: Counters,
             scanned: tuple[float, float], started: float, wired: tuple[int | None, int | None],
             invalid: dict[str, str], invalid_count: int,
             launches: dict[str, int] | None = None,
             backlog: Unwritten | None = None) -> NodeStatus:
    """The node as readers see it. `scanned` is the last scan's (wall, monotonic) time,
    `wired` the wired bytes now and at rest, `launches` the launcher's counted events."""
    flag = journal.reboot_flag(settings.state_dir)
    backlog = backlog or Unwritten()
    if flag is None and backlog.reboot_flags_unwritten:
        # The flag could not be written (a full disk): the node needs its reboot all
        # the same, and says so from memory until the file is there.
        flag = {"reason": backlog.reboot_flags_unwritten[0], "unwritten": True}
    shown = tuple(rank_status(r.record, r.state, r.verdict, reason=r.reason, attempt=r.attempt,
                              data_link=r.data_link, cause=r.cause)
                  for r in sorted(ranks, key=lambda r: (r.record.job, r.record.rank,
                                                        r.record.pid)))
    return NodeStatus(
        host=host, daemon_pid=os.getpid(), version=__version__, mode=settings.mode,
        interval=settings.interval, time=scanned[0] or None, scan_monotonic=scanned[1],
        dir=os.path.abspath(settings.dir), state_dir=os.path.abspath(settings.state_dir),
        started=started, wired_bytes=wired[0], wired_baseline_bytes=wired[1],
        reboot_required=flag is not None, reboot=flag, ranks=shown, scanned=True,
        invalid_records=dict(invalid), invalid_files=invalid_count,
        counters=counters.values(), launches=dict(launches or {}), unwritten=backlog,
        scan_bucket_bounds=SCAN_BUCKETS)
