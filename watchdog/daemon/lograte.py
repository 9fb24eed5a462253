"""Repeated log lines aggregated: what any local user can make the daemon log (a
refused fence, a junk file in the record directory, a refused connection) must
not grow its log without bound.

Warnings are what another user can cause for free (a refused fence or
connection, a junk file in the record directory); a warning is known by its
logger and format string (not its arguments: a flood of files with fresh names
is one kind of line). Each kind gets `burst` lines per `window` seconds; past
that they are counted, not written, and the first line of the kind after the
window says how many were left out. Information about ranks (each costs its
owner a process) and errors (a kill, a failure of the daemon's own) are always
written.

And the log file itself is bounded: when stderr is a plain file (launchd's
StandardErrorPath, never rotated by launchd) it is rotated in place
(`RotatingStream`); under systemd the journal rotates it.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Callable

BURST = 10  # lines of one kind written per window
WINDOW = 60.0  # seconds
MAX_KINDS = 4096  # kinds tracked; past it the oldest are forgotten (bounded memory)


class RepeatFilter(logging.Filter):
    """A log filter that lets a burst of each kind of message through per window and
    says how many it held back (bounded: at most MAX_KINDS kinds remembered)."""
    def __init__(self, burst: int = BURST, window: float = WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        self._kinds: dict[tuple[str, int, str], list[float]] = {}  # kind -> [start, count]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to log a record: a warning past its burst within the window is only counted."""
        if record.levelno != logging.WARNING or record.exc_info:
            return True  # see the module's docstring; a traceback is never left out
        kind = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is None or now - seen[0] >= self.window:
                left_out = int(seen[1]) - self.burst - 1 if seen is not None else 0
                if len(self._kinds) >= MAX_KINDS and seen is None:
                    self._kinds.pop(next(iter(self._kinds)))
                self._kinds[kind] = [now, 1.0]
                if left_out > 0:
                    record.msg = (f"{record.msg} [and {left_out} more lines like this in "
                                  f"{now - seen[0]:.0f}s, not written]")  # type: ignore[index]
                return True
            seen[1] += 1
            if seen[1] == self.burst + 1:
                record.msg = f"{record.msg} [more lines like this are counted, not written]"
                return True
            return seen[1] <= self.burst


LOG_MAX_BYTES = 10 << 20  # a log file past this is rotated (MLX_WATCHDOG_LOG_MAX_BYTES)
LOG_KEEP = 5  # rotated files kept: <log>.1 (newest) to <log>.5
_F_GETPATH = 50  # macOS fcntl: the path of a descriptor


def _path_of(fd: int) -> str | None:
    """The file a descriptor writes to (Linux: /proc; macOS: F_GETPATH), or None."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    try:
        import fcntl

        raw = fcntl.fcntl(fd, _F_GETPATH, b"\0" * 1024)
        return raw.split(b"\0", 1)[0].decode() or None
    except (OSError, ValueError, ImportError):
        return None


class RotatingStream(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr, rotated in place when it is a plain file (launchd's StandardErrorPath,
    which nothing else rotates): past `max_bytes` its content is copied to `<log>.1`
    (older copies shifted, `keep` kept) and the file truncated. The descriptor is
    the service manager's; it is switched to O_APPEND so writes after the
    truncation start at its new end. A journal, a pipe or a terminal is left alone."""

    CHECK_EVERY = 50  # records between size checks

    def __init__(self, max_bytes: int | None = None, keep: int = LOG_KEEP) -> None:
        super().__init__(sys.stderr)
        if max_bytes is None:
            try:
                max_bytes = int(os.environ.get("MLX_WATCHDOG_LOG_MAX_BYTES", LOG_MAX_BYTES))
            except ValueError:
                max_bytes = LOG_MAX_BYTES
        self.max_bytes, self.keep, self._since = max_bytes, keep, 0
        self.path: str | None = None
        try:
            fd = sys.stderr.fileno()
            if stat.S_ISREG(os.fstat(fd).st_mode):
                self.path = _path_of(fd)
                import fcntl

                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        except (OSError, ValueError, AttributeError):
            self.path = None

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record, and every so often rotate the file when it grew too big."""
        super().emit(record)
        self._since += 1
        if self.path is not None and self._since >= self.CHECK_EVERY:
            self._since = 0
            self._rotate_if_big()

    def _rotate_if_big(self) -> None:
        assert self.path is not None
        try:
            self.flush()
            fd = self.stream.fileno()
            if os.fstat(fd).st_size <= self.max_bytes:
                return
            for n in range(self.keep - 1, 0, -1):
                older = f"{self.path}.{n}"
                if os.path.lexists(older):
                    os.replace(older, f"{self.path}.{n + 1}")
            copy = os.open(f"{self.path}.1", os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                           | os.O_NOFOLLOW, 0o640)
            try:
                # Read by its path (the descriptor is write-only), never through a link.
                with os.fdopen(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as src:
                    while chunk := src.read(1 << 20):
                        os.write(copy, chunk)
            finally:
                os.close(copy)
            os.ftruncate(fd, 0)
        except OSError:
            self.path = None  # cannot rotate here: never try again, never fail a log line
