"""The launcher's plumbing to its mlx.launch child: stderr passed through and read for the
per-rank exit lines, stdin fed through a pipe that stays open, signals passed on to the
child and every process under it."""

from __future__ import annotations

import os
import subprocess
import sys
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


def pump(stream: IO[bytes], attempt: Attempt) -> None:
    """Pass mlx.launch's stderr through as it comes, and read its per-rank lines."""
    out = sys.stderr.buffer
    pending = b""
    fd = stream.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        try:
            out.write(chunk)
            out.flush()
        except (OSError, ValueError):
            pass  # our own stderr is gone: keep reading, or mlx.launch blocks on the pipe
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            attempt.see_line(line.decode(errors="replace"))
        pending = pending[-4096:]
    if pending:
        attempt.see_line(pending.decode(errors="replace"))
