"""Untrusted text from records (job ids, hosts, reasons) made safe to show.

A record is written by any user's rank, and a peer's answer by anything at its
address: their strings may hold newlines, ANSI escapes, other control characters, or
Unicode's format characters (zero-width ones, bidi overrides that show a name
reversed). Everything the watchdog prints, logs or exports as a label goes through
`printable`, the one escaper, so one event stays one line, no string can repaint a
terminal, and what a reader sees is what the string holds.
"""

from __future__ import annotations

import logging


def printable(text: object) -> str:
    """`text` with every character Python does not call printable shown as its escape
    (\\n, \\x1b, \\u202e, ...): the control (Cc) and format (Cf: zero-width, bidi)
    characters, line and paragraph separators, unassigned and private-use code
    points, and spaces other than ' '. Printable text, accents and all, is unchanged."""
    text = str(text)
    if text.isprintable():  # the common case, at C speed
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


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
        """The log line with every field made printable on one line."""
        return printable(super().formatMessage(record))
