"""The launcher's plumbing to its mlx.launch child: stderr passed through and read for the
per-rank exit lines, stdin fed through a pipe that stays open, signals passed on to the
child and every process under it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import IO

import psutil

from watchdog.launch.relaunch import Attempt


def signal_tree(child: subprocess.Popen[bytes], signum: int) -> None:
    """`signum` to `child` and every process under it (the local ranks), if it still runs."""
    if child.poll() is not None:
        return
    try:
        tree = [psutil.Process(child.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.Error:
        return
    for proc in tree:
        try:  # psutil checks the process is still the one listed before signalling
            proc.send_signal(signum)
        except psutil.Error:
            continue


def isatty(fd: int) -> bool:
    """Whether `fd` is a terminal (False when it is closed)."""
    try:
        return os.isatty(fd)
    except OSError:
        return False


def feed(pipe: IO[bytes]) -> None:
    """Our stdin into mlx.launch's, then nothing: the pipe stays open until it exits."""
    try:
        while chunk := os.read(0, 65536):
            pipe.write(chunk)
            pipe.flush()
    except (OSError, ValueError):
        return  # no stdin, or mlx.launch is gone


class InterruptTracebacks:
    """After Ctrl-C, mlx.launch and each local rank print a KeyboardInterrupt traceback:
    those are held back (the interrupt is ours, and said); any other traceback, and
    every other line, is passed through."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.held: list[bytes] | None = None
        self.interrupt = False  # the held traceback's last line was KeyboardInterrupt
        self.dropped = 0

    def line(self, line: bytes) -> None:
        """One whole line (with its newline)."""
        text = line.strip()
        if self.held is None:
            if text.startswith(b"Traceback (most recent call last):"):
                self.held = [line]
            else:
                self.write(line)
            return
        chained = text.startswith((b"During handling", b"The above exception"))
        if self.interrupt and text and not chained:  # it ended on KeyboardInterrupt
            self.held, self.interrupt = None, False
            self.dropped += 1
            self.line(line)
            return
        self.held.append(line)
        if chained:
            self.interrupt = False  # the traceback goes on: how it ends decides
        if not text or line[:1] in (b" ", b"\t") or chained \
                or text.startswith(b"Traceback (most recent call last):"):
            return  # still inside the traceback (or a chained one)
        if text.startswith(b"KeyboardInterrupt"):
            self.interrupt = True  # unless a chained traceback follows
            return
        self.write(b"".join(self.held))  # another exception's: shown
        self.held = None

    def close(self) -> None:
        """Flush what is held, and say how many interrupt tracebacks were left out."""
        if self.held and self.interrupt:
            self.dropped += 1
        elif self.held:
            self.write(b"".join(self.held))
        self.held, self.interrupt = None, False
        if self.dropped:
            self.write(f"mlx-watchdog: interrupted: {self.dropped} KeyboardInterrupt "
                       "traceback(s) of mlx.launch and its ranks not shown\n".encode())

    def write(self, data: bytes) -> None:
        """Write to our stderr; a stderr gone is ignored, so the child's pipe keeps draining."""
        try:
            self.out.write(data)
            self.out.flush()
        except (OSError, ValueError):
            pass  # our own stderr is gone: keep reading, or mlx.launch blocks on the pipe


TRACEBACK = b"Traceback (most recent call last):"


def pump(stream: IO[bytes], attempt: Attempt,
         interrupted: Callable[[], bool] = lambda: False) -> None:
    """Pass mlx.launch's stderr through as it comes, and read its per-rank lines; its
    KeyboardInterrupt tracebacks held back. Always, not only once our handler saw the
    interrupt: a terminal's Ctrl-C reaches mlx.launch with us, and its traceback may be
    read before our handler runs. A line is passed on as it comes unless it may start a
    traceback (then whole: `InterruptTracebacks`). `interrupted` is no longer read."""
    del interrupted
    out = sys.stderr.buffer
    quiet = InterruptTracebacks(out)
    pending = b""
    start = b""  # the start of a line held back: it may begin a traceback
    through = False  # the current line's start was passed on: the rest of it goes too
    fd = stream.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        data = chunk
        while data:
            cut = data.find(b"\n") + 1 or len(data)
            piece, data = data[:cut], data[cut:]
            whole = piece.endswith(b"\n")
            if through:
                quiet.write(piece)
                through = not whole
                continue
            start += piece
            if whole:
                quiet.line(start)
                start = b""
            elif quiet.held is None and not TRACEBACK.startswith(start.lstrip()[:len(TRACEBACK)]):
                quiet.write(start)  # a progress bar, a prompt: shown as it comes
                start, through = b"", True
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            attempt.see_line(line.decode(errors="replace"))
        pending = pending[-4096:]
    if start:
        quiet.line(start)
    quiet.close()
    if pending:
        attempt.see_line(pending.decode(errors="replace"))
