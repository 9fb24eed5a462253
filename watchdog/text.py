"""Untrusted text from records (job ids, hosts, reasons) made safe to show.

A record is written by any user's rank: its strings may hold newlines, ANSI
escapes or other control characters. Everything the watchdog prints or logs
goes through `printable`, so one event stays one line and no string can
repaint a terminal.
"""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: object) -> str:
    """`text` with every control character shown as an escape (\\n, \\x1b, ...)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))


def plural(count: int, word: str, words: str | None = None) -> str:
    """"1 rank", "2 ranks": a count with its noun."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def who(rank: object = None, host: object = None, pid: object = None) -> str:
    """A rank as a person reads it, "rank 1 on mac-02 (pid 4242)", leaving out what
    is not known (a peer may not say), never "None" or "?"."""
    text = f"rank {rank}" if rank is not None else "a rank"
    if host:
        text += f" on {host}"
    if pid is not None:
        text += f" (pid {pid})"
    return text


class OneLineFormatter(logging.Formatter):
    """Log lines with control characters escaped; tracebacks stay as they are."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        return printable(super().formatMessage(record))
