"""What the daemon publishes: the snapshot of the node every reader gets (`/status`,
`/metrics`, `status.json`), rebuilt after each scan as one frozen `status.NodeStatus`
with a copy of its counters (`status.CounterValues`, from `daemon/counters.py`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

from watchdog import __version__
from watchdog.daemon.config import Settings
from watchdog.daemon.counters import SCAN_BUCKETS, Counters
from watchdog.daemon.lifecycle import Key, Rank
from watchdog.daemon.store import journal
from watchdog.daemon.view import NOTHING, Shown, rank_status
from watchdog.host import platform_label
from watchdog.status import NodeStatus, RankStatus, RebootFlag, Straggler, Unwritten

__all__ = ["INVALID_LISTED", "SCAN_BUCKETS", "Counters", "snapshot", "write_status"]

log = logging.getLogger(__name__)

INVALID_LISTED = 100  # unusable files named in /status; all are counted


def _status(r: Rank, cause: str | None, shown: Shown) -> RankStatus:
    return rank_status(r.record, r.state, r.verdict, shown, reason=r.reason,
                       attempt=r.attempt, cause=cause)


def snapshot(*, host: str, settings: Settings, ranks: Iterable[Rank], counters: Counters,
             scanned: tuple[float, float], started: float, wired: tuple[int | None, int | None],
             invalid: dict[str, str], invalid_count: int,
             launches: dict[str, int] | None = None,
             backlog: Unwritten | None = None, record_dir_full: str = "",
             stragglers: tuple[Straggler, ...] = (),
             causes: Mapping[Key, str | None] | None = None,
             shown: Mapping[Key, Shown] | None = None) -> NodeStatus:
    """The node as readers see it. `scanned` is the last scan's (wall, monotonic) time,
    `wired` the wired bytes now and at rest, `launches` the launcher's counted events,
    `causes` the cause of each rank under a response (else the rank's own: the last
    incident that acted on it), `shown` what each rank shows beside its lifecycle
    (daemon/jobs.py)."""
    causes, shown_by = causes or {}, shown or {}
    flag = journal.reboot_flag(settings.state_dir)
    backlog = backlog or Unwritten()
    if flag is None and backlog.reboot_flags_unwritten:
        # The flag could not be written (a full disk): the node needs its reboot all
        # the same, and says so from memory until the file is there.
        flag = RebootFlag(reason=backlog.reboot_flags_unwritten[0], unwritten=True)
    ordered = sorted(ranks, key=lambda r: (r.record.job, r.record.rank, r.record.pid))
    listed = tuple(_status(r, causes.get(r.key, r.cause), shown_by.get(r.key, NOTHING))
                   for r in ordered)
    return NodeStatus(
        host=host, daemon_pid=os.getpid(), version=__version__, mode=settings.mode,
        interval=settings.interval, time=scanned[0] or None, scan_monotonic=scanned[1],
        dir=os.path.abspath(settings.dir), state_dir=os.path.abspath(settings.state_dir),
        started=started, platform=platform_label(), wired_bytes=wired[0],
        wired_baseline_bytes=wired[1],
        reboot_required=flag is not None, reboot=flag, ranks=listed, scanned=True,
        invalid_records=dict(invalid), invalid_files=invalid_count,
        counters=counters.values(), launches=dict(launches or {}), unwritten=backlog,
        scan_bucket_bounds=SCAN_BUCKETS, record_dir_full=record_dir_full or None,
        stragglers=stragglers)


def write_status(state_dir: str, status: NodeStatus) -> None:
    """`status.json` in the state directory, for readers without HTTP; a failed write
    is logged, and the next scan writes it again."""
    try:
        journal.write_json_atomic(os.path.join(state_dir, journal.STATUS), status.to_json())
    except OSError as err:
        log.warning("cannot write status.json: %s", err)
