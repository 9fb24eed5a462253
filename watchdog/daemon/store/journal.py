"""The daemon's files: the incident journal, the reboot flag, status.json, and the
pointer in the record directory that says which daemon watches it.

`incidents.jsonl` holds one JSON object per line, each written with a single
`write` on an O_APPEND descriptor so a reader never sees half a line from a
live daemon. `reboot-required` is a small JSON file replaced atomically; it
stays until an operator runs `mlx-watchdog node clear-reboot`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from watchdog.files import open_regular
from watchdog.status import ABSENT, DaemonPointer, Incident, RebootFlag, RebootReason

INCIDENTS = "incidents.jsonl"
REBOOT_FLAG = "reboot-required"
STATUS = "status.json"
# In the record directory: which daemon watches it, and where its verdicts are.
POINTER = ".mlx-watchdog-daemon.json"


def scan_is_recent(last_scan_monotonic: float, interval: float, now_monotonic: float) -> bool:
    """The one rule for "the daemon is alive": it completed a scan lately.

    Monotonic seconds: CLOCK_MONOTONIC is one clock for every process of a
    host, so the CLI can apply this rule to the daemon's published snapshot.
    """
    return last_scan_monotonic > 0 and now_monotonic - last_scan_monotonic < 3 * interval + 5


def publish_pointer(record_dir: str, state_dir: str, listen: str) -> None:
    """Tell `status`, `watch` and `inspect` given this record directory where we publish."""
    write_json_atomic(os.path.join(record_dir, POINTER), DaemonPointer(
        daemon_pid=os.getpid(), state_dir=os.path.abspath(state_dir), listen=listen).to_json())


def _pointer(record_dir: str, owners: tuple[int, ...]) -> DaemonPointer | None:
    """The pointer, if it is a regular file one of `owners` owns, naming a state
    directory.

    The record directory is writable by every local user: no link is followed,
    and nothing blocks on a planted FIFO (O_NONBLOCK), so no file there can
    hang a reader or the daemon's stop.
    """
    try:
        fd = os.open(os.path.join(record_dir, POINTER),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners:
            return None
        try:
            return DaemonPointer.from_json(json.loads(f.read(1 << 16)))
        except ValueError:
            return None


def remove_pointer(record_dir: str) -> None:
    """On a clean stop: no daemon watches the directory any more (ours only)."""
    data = _pointer(record_dir, (os.getuid(),))
    if data is None or data.daemon_pid != os.getpid():
        return  # gone already, or not ours: a stale pointer names a dead pid
    try:
        os.unlink(os.path.join(record_dir, POINTER))
    except FileNotFoundError:
        return


def read_pointer(record_dir: str) -> DaemonPointer | None:
    """The pointer, if a daemon we may believe wrote it: root's, or our own user's.

    A pointer planted by another user could send us to forged verdicts, so it is
    not read at all.
    """
    return _pointer(record_dir, (0, os.getuid()))


def _fsync_dir(directory: str) -> None:
    """Make a rename or a new file in `directory` survive a power cut."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str, data: Any, durable: bool = False) -> None:
    """Replace `path` at once; `durable` also fsyncs the file and its directory
    (the reboot flag: a power cut must not lose it; status.json need not pay)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        if durable:
            _fsync_dir(directory)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def append_incident(state_dir: str, incident: dict[str, Any]) -> None:
    """Append the incident as one line in one write, synced; a torn line is cut back off."""
    line = (json.dumps(incident, sort_keys=True, default=str) + "\n").encode()
    fd = open_regular(os.path.join(state_dir, INCIDENTS),
                      os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)")
            os.fsync(fd)  # an incident is rare and is the record of a kill: keep it
        except OSError:
            # A full disk can take half a line: cut it off, so that the retry
            # (pending.Backlog) leaves one whole line and no torn one.
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def read_lines(path: str, keep: Callable[[dict[str, Any]], bool] = lambda item: True
               ) -> tuple[list[dict[str, Any]], int]:
    """A JSON-lines journal: its well-formed objects `keep` accepts, oldest first, and
    how many lines were not. A missing file (or folder) is an empty journal."""
    items: list[dict[str, Any]] = []
    bad = 0
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            for raw in f:
                try:
                    item = json.loads(raw)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(item, dict) and keep(item):
                    items.append(item)
                else:
                    bad += 1
    except (FileNotFoundError, NotADirectoryError):
        pass
    return items, bad


def read_incidents(state_dir: str) -> tuple[list[Incident], int]:
    """All well-formed incidents, oldest first, read through the contract; and how many
    lines were not (not JSON, not an object, or without an id)."""
    lines, bad = read_lines(os.path.join(state_dir, INCIDENTS))
    incidents = []
    for line in lines:
        try:
            incidents.append(Incident.from_json(line))
        except ValueError:
            bad += 1
    return incidents, bad


def reboot_flag(state_dir: str) -> RebootFlag | None:
    """The reboot flag, or None when the node is not flagged."""
    path = os.path.join(state_dir, REBOOT_FLAG)
    try:
        with os.fdopen(open_regular(path), "r") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return RebootFlag(reason="reboot flag present but unreadable", path=path)
    return RebootFlag.from_json(data) or RebootFlag(reason=str(data))


def set_reboot_flag(state_dir: str, reason: str | RebootReason, **figures: Any
                    ) -> RebootFlag:
    """Flag the node (`reason` with its figures: RebootReason's fields); an existing
    flag keeps its first reason and gains this one."""
    said = reason if isinstance(reason, RebootReason) else RebootReason(reason=reason,
                                                                         **figures)
    present = reboot_flag(state_dir) or RebootFlag()
    reasons = (*(present.reasons if isinstance(present.reasons, tuple) else ()), said)
    first = reasons[0].reason
    flag = replace(present, reasons=reasons, reason=None if first is ABSENT else first)
    write_json_atomic(os.path.join(state_dir, REBOOT_FLAG), flag.to_json(), durable=True)
    return flag


def clear_reboot_flag(state_dir: str) -> bool:
    """Remove the reboot flag; False when there was none."""
    try:
        os.unlink(os.path.join(state_dir, REBOOT_FLAG))
    except FileNotFoundError:
        return False
    return True
