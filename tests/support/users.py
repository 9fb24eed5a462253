"""Processes of another local user, and records naming any job, for the isolation tests.

The tests run as root, so a forked child can drop to another uid (65534,
"nobody") for real: the daemon sees a process and a record file owned by
that uid, exactly as it would another user's. A child reports every signal
it receives on a pipe, so a test can assert a process was never signalled
(not even SIGCONT, which changes nothing visible).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tests.support.records import SyntheticWriter
from watchdog import record
from watchdog.procstat import read_start_ticks
from watchdog.record import OP_CODE
from watchdog.states import Phase

OTHER_UID = 65534
REPORTED = (signal.SIGCONT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)


def become(uid: int = OTHER_UID) -> None:
    """In a forked child: become `uid` for real (no supplementary groups, its gid and uid),
    dumpable as a process that user started: setuid() cleared the flag, an exec'd
    process of that user has it, and the daemon refuses one without it."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE


def fork_as(uid: int, work: Callable[[int], object]) -> tuple[int, int]:
    """A forked child that becomes `uid` (unless it is ours already) and runs
    `work(write_end)`, reporting on the pipe; it never returns into pytest (exit 0 when
    `work` returns, 1 when it raises). (Its pid, the pipe's read end.)"""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(read)
            if uid != os.getuid():
                become(uid)
            work(write)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


class UserProc:
    """A forked child running as `uid`: sleeps; every signal it gets goes on a pipe."""

    def __init__(self, uid: int = OTHER_UID, spin: bool = False) -> None:
        self.uid = uid

        def sleep_and_report(write: int) -> None:
            def report(signum: int, _frame: object) -> None:
                os.write(write, bytes([signum]))
                if signum == signal.SIGTERM:
                    os._exit(128 + signum)

            for signum in REPORTED:
                signal.signal(signum, report)
            while True:
                if spin:
                    pass
                else:
                    time.sleep(1)

        pid, read = fork_as(uid, sleep_and_report)
        os.set_blocking(read, False)
        self.pid, self._read, self._got = pid, read, b""
        self.returncode: int | None = None

    def signals(self) -> list[int]:
        """Every signal the child reported so far."""
        try:
            while chunk := os.read(self._read, 64):
                self._got += chunk
        except BlockingIOError:
            pass
        return list(self._got)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.returncode = -signal.SIGKILL

    def close(self) -> None:
        self.kill()
        os.close(self._read)

    def __enter__(self) -> UserProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def publish(directory: Path, pid: int, uid: int, job: str, *, hung: bool, world_size: int = 2,
            rank: int = 0, name: str | None = None, status: int = record.STATUS_OPEN) -> Path:
    """A record for `pid` owned by `uid` naming `job`: hung in a wait since boot
    (deadline 0.5 s), or healthy (running, just made progress)."""
    path = directory / (name or f"{pid}{record.SUFFIX}")
    writer = SyntheticWriter(str(path), pid=pid, start_time=psutil.Process(pid).create_time(),
                          uid=uid, host="node", job=job, rank=rank, world_size=world_size,
                          backend="ring", dump_signal=0, start_ticks=read_start_ticks(pid))
    now = time.monotonic_ns()
    writer.begin()
    if hung:
        writer.write_hot(1, 1, 0, 0, Phase.WAIT, OP_CODE["eval"], 1, 1, 1, 0, 0)
        writer.write_expect(0.5, 1, "")
    else:
        writer.write_hot(5, 5, 5, 0, Phase.RUNNING, 0, now, 0, now, 0, 0)
    writer.end()
    writer.close(status, remove=False)
    os.chown(path, uid, uid)
    return path
