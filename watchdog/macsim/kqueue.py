"""kqueue's EVFILT_PROC/NOTE_EXIT as `select` gives it on macOS, on Linux pidfds.

The exit watcher (probes/exits.py) takes a `select`-like module; this is one whose
kqueue behaves as kevent(2) for the one filter it uses: a change naming a pid that is
gone comes back as an EV_ERROR event with ESRCH in `data` (there is room: the watcher
gives it); a one-shot knote is dropped once its exit is reported; constants are
<sys/event.h>'s values on macOS.
"""

from __future__ import annotations

import errno
import os
import select
from typing import Any

KQ_FILTER_PROC = -5
KQ_EV_ADD = 0x0001
KQ_EV_ONESHOT = 0x0010
KQ_EV_ERROR = 0x4000
KQ_NOTE_EXIT = 0x80000000


class kevent:  # noqa: N801 - the name select gives it
    """select.kevent as macOS gives it: one change or one event."""
    def __init__(self, ident: int, filter: int = 0, flags: int = KQ_EV_ADD,  # noqa: A002
                 fflags: int = 0, data: int = 0, udata: int = 0) -> None:
        self.ident, self.filter, self.flags = ident, filter, flags
        self.fflags, self.data, self.udata = fflags, data, udata


class kqueue:  # noqa: N801 - the name select gives it
    """select.kqueue as macOS gives it, for EVFILT_PROC NOTE_EXIT only, built on pidfds."""
    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pid -> pidfd
        self.closed = False

    def control(self, changes: list[Any] | None, max_events: int,
                timeout: float | None = None) -> list[kevent]:
        """kqueue.control: register each EVFILT_PROC change (a pid gone already is
        an EV_ERROR event, ESRCH), then wait up to `timeout` seconds for at most
        `max_events` exits, each reported once (NOTE_EXIT, EV_ONESHOT)."""
        if self.closed:
            raise ValueError("I/O operation on closed kqueue object")
        events: list[kevent] = []
        for change in changes or ():
            if change.filter != KQ_FILTER_PROC or change.ident in self._fds:
                continue
            try:
                self._fds[change.ident] = os.pidfd_open(change.ident)
            except ProcessLookupError:
                if len(events) >= max_events:
                    raise
                events.append(kevent(change.ident, KQ_FILTER_PROC, KQ_EV_ERROR,
                                     data=errno.ESRCH))
        if events:
            return events
        poller = select.poll()
        by_fd = {fd: pid for pid, fd in self._fds.items()}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(None if timeout is None else timeout * 1000):
            if len(events) >= max_events:
                break
            pid = by_fd[fd]
            os.close(self._fds.pop(pid))  # one-shot: dropped once reported
            events.append(kevent(pid, KQ_FILTER_PROC, KQ_EV_ONESHOT, KQ_NOTE_EXIT))
        return events

    def close(self) -> None:
        """Close every pidfd held; the kqueue is closed."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self.closed = True
