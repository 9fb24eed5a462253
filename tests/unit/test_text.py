"""Untrusted strings shown or logged stay on one line and cannot drive a terminal."""

from __future__ import annotations

import io
import logging

from watchdog.text import OneLineFormatter, printable


def test_printable_escapes_every_line_break_and_escape() -> None:
    hostile = "job\nX-Forged: 1\r\x1b[31mred\x1b]0;title\x07\u2028\u2029\x85\x7f"
    shown = printable(hostile)
    assert shown.isprintable() and "\\n" in shown and "\\x1b" in shown and "\\u2028" in shown
    assert len(shown.splitlines()) == 1
    assert printable("plain job-1 ünïcode") == "plain job-1 ünïcode"


def test_log_lines_stay_one_line_but_tracebacks_stay_readable() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter("%(levelname)s %(message)s"))
    log = logging.getLogger("test_text")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("skipping %r: %s", "a.rec", "bad\nWARNING forged line")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("loop error")
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines[0] == "WARNING skipping 'a.rec': bad\\nWARNING forged line"
    assert lines[1] == "ERROR loop error" and lines[2].startswith("Traceback")


def test_printable_escapes_unicode_format_characters() -> None:
    """Issue 48, defect 7: zero-width and bidi characters (Unicode's Cf) hide or reverse
    what a job name says in the log, `status` and metric labels."""
    hostile = "job\u202egnp.exe\u200b\u200d\u2066x\u2069\ufeff\u00ad\U000e0001"
    shown = printable(hostile)
    assert shown.isprintable() and shown.isascii() or "\\u202e" in shown
    for ch in "\u202e\u200b\u200d\u2066\u2069\ufeff\u00ad\U000e0001":
        assert ch not in shown
    assert "\\u202e" in shown and "\\u200b" in shown
    assert printable("日本語 job-é") == "日本語 job-é"
