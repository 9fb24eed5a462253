"""Wake the daemon the moment a watched rank exits, instead of at the next scan.

A crashed rank ends its job; its peers on other nodes wait on the fence this
node sends, so every scan interval of delay is paid by every survivor. Linux
gives a pidfd that becomes readable on exit; macOS gives kqueue's NOTE_EXIT.
One thread polls them and sets `wake`; all descriptors are opened and closed
on that thread, so the scan only hands over the set of pids to watch.
"""

from __future__ import annotations

import logging
import os
import select
import threading

log = logging.getLogger(__name__)
POLL_SECONDS = 0.2  # how soon a change of the watched set takes effect


class ExitWatcher:
    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake
        self._wanted: frozenset[int] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return hasattr(os, "pidfd_open") or hasattr(select, "kqueue")

    def watch(self, pids: set[int]) -> None:
        self._wanted = frozenset(pids)  # one reference swap: no lock needed

    def start(self) -> None:
        if self.available():
            self._thread = threading.Thread(target=self._run, name="exits", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            if hasattr(os, "pidfd_open"):
                self._run_pidfd()
            else:
                self._run_kqueue()
        except Exception:  # noqa: BLE001 - the scan still sees every exit, only later
            log.exception("exit watcher stopped; exits are seen at the next scan")

    def _run_pidfd(self) -> None:
        fds: dict[int, int] = {}  # pid -> pidfd
        while not self._stop.is_set():
            wanted = self._wanted
            for pid in [p for p in fds if p not in wanted]:
                os.close(fds.pop(pid))
            for pid in wanted - fds.keys():
                try:
                    fds[pid] = os.pidfd_open(pid)
                except OSError:
                    self.wake.set()  # already gone: let the scan see it now
            poller = select.poll()
            for fd in fds.values():
                poller.register(fd, select.POLLIN)
            ready = poller.poll(POLL_SECONDS * 1000)
            if ready:
                exited = {fd for fd, _ in ready}
                for pid, fd in list(fds.items()):
                    if fd in exited:
                        os.close(fds.pop(pid))
                self.wake.set()
        for fd in fds.values():
            os.close(fd)

    def _run_kqueue(self) -> None:
        queue = select.kqueue()  # type: ignore[attr-defined]
        watched: set[int] = set()
        try:
            while not self._stop.is_set():
                wanted = self._wanted
                changes = []
                for pid in wanted - watched:
                    changes.append(select.kevent(  # type: ignore[attr-defined]
                        pid, select.KQ_FILTER_PROC,  # type: ignore[attr-defined]
                        select.KQ_EV_ADD | select.KQ_EV_ONESHOT,  # type: ignore[attr-defined]
                        select.KQ_NOTE_EXIT))  # type: ignore[attr-defined]
                watched = set(wanted)
                try:
                    events = queue.control(changes, 64, POLL_SECONDS)
                except ProcessLookupError:
                    events = []
                    self.wake.set()
                if events:
                    watched -= {e.ident for e in events}
                    self.wake.set()
        finally:
            queue.close()
