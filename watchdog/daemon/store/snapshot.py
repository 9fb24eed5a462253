"""The daemon's snapshot read back by another process: the running daemon's
`status.json` when it is alive and fresh (`daemon_status`), and the daemon that
watches a record directory (`find_daemon`).

Read by the commands that look at a node (`status`, `watch`, `cluster status`,
`node`, `doctor`, the demo) and by the launcher (its relaunch gate and the attempt's
facts); here, with the files the daemon writes, rather than in a command package,
because the launcher imports nothing of `cli`.
"""

from __future__ import annotations

import json
import os
import time

from watchdog.daemon.store import journal
from watchdog.status import NodeStatus


def daemon_status(state_dir: str, record_dir: str | None = None) -> NodeStatus | None:
    """The running daemon's published snapshot, or None when it is absent or stale.

    With `record_dir`, only a daemon that watches that directory counts.
    """
    try:
        with open(os.path.join(state_dir, journal.STATUS)) as f:
            snap = NodeStatus.from_json(json.load(f))
    except (OSError, ValueError):
        return None
    pid, scanned = snap.daemon_pid, snap.scan_monotonic
    interval = snap.interval if snap.interval is not None else 1
    if pid is None or scanned is None:
        return None
    if record_dir is not None and snap.dir != os.path.abspath(record_dir):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists, run by root
    if not journal.scan_is_recent(float(scanned), float(interval), time.monotonic()):
        return None
    return snap


def find_daemon(record_dir: str, state_dir: str) -> NodeStatus | None:
    """The snapshot of the daemon that watches `record_dir`: the one named by the
    directory's pointer, else the one publishing in `state_dir` if it watches it."""
    pointer = journal.read_pointer(record_dir)
    if pointer is not None:
        snap = daemon_status(pointer.state_dir, record_dir)
        if snap is not None:
            return snap
    return daemon_status(state_dir, record_dir)
