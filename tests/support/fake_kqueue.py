"""A scripted stand-in for the kqueue half of `select` (macOS), on any OS.

It behaves as kevent(2) and CPython's select.kqueue do, not as the watcher
expects: a change that fails (EVFILT_PROC on a pid that is gone: ESRCH) comes
back as an event flagged EV_ERROR with the errno in `data` when the event list
has room, and raises only when it has none; a closed queue raises ValueError
("I/O operation on closed kqueue object"); EV_ONESHOT knotes are dropped once
reported; EV_ADD on an existing knote modifies it. Faults are scripted with
`fail_next`. Constants are macOS's <sys/event.h> values.
"""

from __future__ import annotations

import errno
import threading
from typing import Any

from watchdog.macsim.kqueue import (  # macOS's <sys/event.h> values, and select's kevent
    KQ_EV_ADD,
    KQ_EV_ERROR,
    KQ_EV_ONESHOT,
    KQ_FILTER_PROC,
    KQ_NOTE_EXIT,
)
from watchdog.macsim.kqueue import kevent as _kevent

__all__ = ["KQ_EV_ADD", "KQ_EV_ERROR", "KQ_EV_ONESHOT", "KQ_FILTER_PROC", "KQ_NOTE_EXIT",
           "FakeKqueueModule", "kevent"]


class kevent(_kevent):  # noqa: N801 - the name select gives it
    def __repr__(self) -> str:
        return (f"kevent(ident={self.ident}, filter={self.filter}, flags={self.flags:#x}, "
                f"fflags={self.fflags:#x}, data={self.data})")


class FakeKqueueModule:
    """The processes of a fake machine and the kqueues opened on it."""

    KQ_FILTER_PROC = KQ_FILTER_PROC
    KQ_EV_ADD = KQ_EV_ADD
    KQ_EV_ONESHOT = KQ_EV_ONESHOT
    KQ_EV_ERROR = KQ_EV_ERROR
    KQ_NOTE_EXIT = KQ_NOTE_EXIT
    kevent = kevent

    def __init__(self, alive: set[int], forbidden: set[int] = frozenset()) -> None:
        self.alive = set(alive)
        self.forbidden = set(forbidden)  # pids kevent refuses with EPERM
        self.queues: list[FakeQueue] = []
        self.cond = threading.Condition()
        self.registrations: list[int] = []  # every pid an EV_ADD named, in order
        self.controls = 0
        self.faults: list[BaseException] = []  # raised by the next control() calls

    def kqueue(self) -> FakeQueue:
        queue = FakeQueue(self)
        queue.fail_next, self.faults = self.faults, []
        with self.cond:
            self.queues.append(queue)
        return queue

    def exit(self, pid: int, status: int = 0) -> None:
        """The process ends: every queue watching it gets NOTE_EXIT."""
        with self.cond:
            self.alive.discard(pid)
            for queue in self.queues:
                if pid in queue.knotes:
                    queue.knotes.discard(pid)  # one-shot
                    queue.pending.append(kevent(pid, KQ_FILTER_PROC, KQ_EV_ONESHOT,
                                                KQ_NOTE_EXIT, status))
            self.cond.notify_all()

    def wait_for(self, predicate: Any, timeout: float = 5.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)


class FakeQueue:
    def __init__(self, machine: FakeKqueueModule) -> None:
        self.machine = machine
        self.closed = False
        self.knotes: set[int] = set()
        self.pending: list[kevent] = []
        self.fail_next: list[BaseException] = []  # raised by the next control() calls

    def close(self) -> None:
        self.closed = True

    def control(self, changelist: list[kevent] | None, max_events: int,
                timeout: float | None = None) -> list[kevent]:
        m = self.machine
        with m.cond:
            m.controls += 1
            m.cond.notify_all()
            if self.closed:
                raise ValueError("I/O operation on closed kqueue object")
            if self.fail_next:
                raise self.fail_next.pop(0)
            out: list[kevent] = []
            for change in changelist or []:
                assert change.filter == KQ_FILTER_PROC and change.fflags & KQ_NOTE_EXIT
                assert change.flags & KQ_EV_ADD and change.flags & KQ_EV_ONESHOT
                m.registrations.append(change.ident)
                code = (errno.ESRCH if change.ident not in m.alive
                        else errno.EPERM if change.ident in m.forbidden else 0)
                if code:
                    if len(out) >= max_events:
                        raise OSError(code, "kevent failed")  # ESRCH: ProcessLookupError
                    out.append(kevent(change.ident, KQ_FILTER_PROC, KQ_EV_ERROR, 0, code))
                else:
                    self.knotes.add(change.ident)
            if not out:
                m.cond.wait_for(lambda: self.pending or self.closed, timeout)
            room = max_events - len(out)
            out += self.pending[:room]
            del self.pending[:room]
            return out
