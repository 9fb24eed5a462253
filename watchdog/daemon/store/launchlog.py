"""The launcher's journal: what `mlx-watchdog launch` decided for each attempt of a job.

`launches.jsonl` sits next to `incidents.jsonl` in the state directory, one JSON
object a line, appended with one `write` like the incidents. Each line is one
event of one job: `launch` (an attempt starts), `ended` (how it ended),
`restart` (it is relaunched), `refused` (the node is not healthy enough to
relaunch), `gave_up` (attempts in a row without progress). The daemon counts the
events of its state directory for /metrics; `incidents` shows them with the
incidents. A launcher that may not write the state directory (a user's job
under a root daemon) journals into its user's own state directory instead.
"""

from __future__ import annotations

import json
import os
from typing import Any

from watchdog.daemon.store import journal
from watchdog.files import open_regular
from watchdog.status import LaunchEvent

LAUNCHES = "launches.jsonl"
COUNTED = ("restart", "refused", "gave_up")  # the events /metrics counts


def user_state_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """Where a launcher journals when the daemon's state directory is not writable."""
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                      "state")
    return os.path.join(base, "mlx-watchdog")


def journal_dir(state_dir: str) -> str:
    """The state directory when this process may append there, else the user's own."""
    if os.path.isdir(state_dir) and os.access(state_dir, os.W_OK | os.X_OK):
        path = os.path.join(state_dir, LAUNCHES)
        if not os.path.exists(path) or os.access(path, os.W_OK):
            return state_dir
    return user_state_dir()


def append(directory: str, event: LaunchEvent) -> str:
    """Append one event; returns the file. Raises OSError when it cannot be written."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    path = os.path.join(directory, LAUNCHES)
    line = (json.dumps(event.to_json(), sort_keys=True, default=str) + "\n").encode()
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return path


def read_lines(directory: str) -> tuple[list[dict[str, Any]], int]:
    """Every line that names its event, as written (`incidents --json` shows them so),
    oldest first, and how many lines were not."""
    return journal.read_lines(os.path.join(directory, LAUNCHES),
                              lambda item: isinstance(item.get("event"), str))


def read(directory: str) -> tuple[list[LaunchEvent], int]:
    """All well-formed events, oldest first, and how many lines were not."""
    lines, bad = read_lines(directory)
    return [LaunchEvent.from_json(line) for line in lines], bad


class Counts:
    """The counted events of one journal, re-read only when the file changed
    (each scan of the daemon asks; the file grows by a line per event)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LAUNCHES)
        self._seen: tuple[int, int, int] | None = None
        self._counts = dict.fromkeys(COUNTED, 0)

    def get(self) -> dict[str, int]:
        """The launch journal's counts by event, read again only when the file changed."""
        try:
            st = os.stat(self.path)
        except OSError:
            return dict(self._counts)
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen != self._seen:
            counts = dict.fromkeys(COUNTED, 0)
            for event in read(os.path.dirname(self.path))[0]:
                if event.event in counts:
                    counts[event.event] += 1
            self._seen, self._counts = seen, counts
        return dict(self._counts)


__all__ = ["COUNTED", "LAUNCHES", "Counts", "append", "journal_dir", "read",
           "user_state_dir"]
