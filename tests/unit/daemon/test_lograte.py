"""Repeated log lines aggregated (issue 30, item 9): pure, a fake clock."""

from __future__ import annotations

import logging

from watchdog.daemon.lograte import RepeatFilter


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("watchdog.x", logging.WARNING, __file__, 1, msg, args, None)


def test_each_kind_is_written_a_burst_a_window_and_the_rest_is_counted() -> None:
    now = [0.0]
    rate = RepeatFilter(burst=3, window=60.0, clock=lambda: now[0])
    written = [r for n in range(100) if rate.filter(r := _record("skipping %r: %s", n, "x"))]
    assert len(written) == 4  # the burst, and one saying the rest is counted
    assert "counted, not written" in written[-1].getMessage()
    assert rate.filter(_record("another kind %s", 1))  # other lines are not held back
    for level in (logging.INFO, logging.ERROR):  # ranks' news and errors: always written
        assert all(rate.filter(logging.LogRecord("watchdog.x", level, __file__, 1,
                                                 "pid %s exited", (n,), None))
                   for n in range(50))
    now[0] = 61.0
    after = _record("skipping %r: %s", "late", "x")
    assert rate.filter(after)
    assert "and 96 more lines like this in 61s, not written" in after.getMessage()


def test_a_plain_file_stderr_is_rotated_in_place(tmp_path, monkeypatch) -> None:
    """launchd's StandardErrorPath is a plain file nothing rotates: past its cap its
    content goes to <log>.1 (then .2 ...) and the file starts again, written at its
    new end (O_APPEND on the service manager's descriptor)."""
    import sys

    from watchdog.daemon.lograte import RotatingStream

    path = tmp_path / "mlx-watchdog.log"
    stream = open(path, "w")  # noqa: SIM115 - as launchd hands it: not O_APPEND
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        handler = RotatingStream(max_bytes=2000, keep=2)
        handler.CHECK_EVERY = 5
        assert handler.path == str(path)
        for n in range(401):  # the last one after the last rotation
            handler.emit(_record(f"line {n:04d} " + "x" * 40))
        handler.flush()
    finally:
        stream.close()
    assert path.stat().st_size <= 2000 + 5 * 60
    assert (tmp_path / "mlx-watchdog.log.1").exists() and (tmp_path / "mlx-watchdog.log.2").exists()
    assert not (tmp_path / "mlx-watchdog.log.3").exists()
    text = path.read_bytes()
    assert b"\0" not in text and text.rstrip().endswith(b"line 0400 " + b"x" * 40)
