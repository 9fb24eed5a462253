"""Wake the daemon the moment a watched rank exits, instead of at the next scan.

A crashed rank ends its job; its peers on other nodes wait on the fence this
node sends, so every scan interval of delay is paid by every survivor. Linux
gives a pidfd that becomes readable on exit; macOS gives kqueue's NOTE_EXIT.
One thread polls them and sets `wake`; all descriptors are opened and closed
on that thread, so the scan only hands over the set of pids to watch.

kqueue as the kernel does it (kevent(2)): a change that fails, such as
EVFILT_PROC on a pid that is already gone, comes back as an event flagged
EV_ERROR with the errno in `data` when the event list has room, and raises
(ProcessLookupError for ESRCH) only when it has none. CPython retries a
kevent interrupted by a signal (PEP 475), so EINTR is handled only in case.
Tests pass a scripted `select`-like module as `kq`.

Descriptors are bounded: at most `max_pidfds()` pidfds (a quarter of the soft
open-files limit, at most MAX_PIDFDS), handed out in turn across the owners'
uids, so one user's many records cannot take them all; a pid without one is
seen at the next scan as before. A pidfd that cannot be opened for want of
descriptors (EMFILE) is not taken for an exit.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import threading
from typing import Any

from watchdog import host
from watchdog.daemon.probes import simulation

log = logging.getLogger(__name__)
POLL_SECONDS = 0.2  # how soon a change of the watched set takes effect (kqueue), or a
# pid the pidfd watcher could not open is tried again
IDLE_SECONDS = 5.0  # the pidfd watcher's longest sleep with nothing to do (it is woken)
MAX_PIDFDS = 1024


def max_pidfds() -> int:
    """Pidfds the watcher may hold: a quarter of the soft limit, at most MAX_PIDFDS."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MAX_PIDFDS if soft == resource.RLIM_INFINITY else max(8, min(MAX_PIDFDS, soft // 4))


def fair(pids_by_uid: dict[int, list[int]], limit: int) -> set[int]:
    """At most `limit` pids, taken in turn from each uid's list (in its order)."""
    chosen: set[int] = set()
    queues = [list(pids) for _, pids in sorted(pids_by_uid.items())]
    while len(chosen) < limit and any(queues):
        for queue in queues:
            if queue and len(chosen) < limit:
                chosen.add(queue.pop(0))
    return chosen


class ExitWatcher:
    """Wakes the daemon's loop the moment a watched rank exits (pidfd on Linux, kqueue's
    NOTE_EXIT on macOS), so a crash is seen at once, not at the next scan."""
    def __init__(self, wake: threading.Event, kq: Any = None) -> None:
        """`kq`: the module giving kqueue, kevent and the KQ_* constants (`select`
        on macOS); given, the kqueue watcher is used whatever this OS is."""
        self.wake = wake
        self._kq = kq
        if kq is None and host.simulated():
            self._kq = simulation().kqueue_module()
        elif kq is None and host.os_name() == host.DARWIN and hasattr(select, "kqueue"):
            self._kq = select
        self._wanted: frozenset[int] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The pidfd watcher sleeps in poll() until a rank exits or this pipe says the
        # watched set changed (or the watcher stops): no wake-ups while nothing happens.
        self._changed: tuple[int, int] | None = None

    def available(self) -> bool:
        """Whether this OS lets the watcher wait on exits (kqueue or pidfd)."""
        return self._kq is not None or hasattr(os, "pidfd_open")

    def watch(self, pids: set[int] | dict[int, list[int]]) -> None:
        """The pids to watch, or the pids of each owner's uid (shared out fairly)."""
        if isinstance(pids, dict):
            pids = fair(pids, max_pidfds())
        wanted = frozenset(pids)
        if wanted != self._wanted:
            self._wanted = wanted  # one reference swap: no lock needed
            self._poke()

    def _poke(self) -> None:
        """Wake the pidfd watcher's poll (a byte in its pipe; a full pipe wakes it too)."""
        if self._changed is not None:
            try:
                os.write(self._changed[1], b"x")
            except OSError:
                pass  # full (it wakes anyway) or closed (it has stopped)

    def start(self) -> None:
        """Start the watcher's thread, where the OS allows one."""
        if self.available():
            self._thread = threading.Thread(target=self._run, name="exits", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ask the watcher's thread to end, waking it."""
        self._stop.set()
        self._poke()

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the watcher's thread to end."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            if self._kq is not None:
                self._run_kqueue(self._kq)
            else:
                self._run_pidfd()
        except Exception:  # noqa: BLE001 - the scan still sees every exit, only later
            log.exception("exit watcher stopped; exits are seen at the next scan")

    def _run_pidfd(self) -> None:
        fds: dict[int, int] = {}  # pid -> pidfd
        changed = os.pipe()
        os.set_blocking(changed[0], False)
        os.set_blocking(changed[1], False)
        self._changed = changed
        try:
            self._watch_pidfds(fds, changed[0])
        finally:
            self._changed = None
            for fd in (*fds.values(), *changed):
                os.close(fd)

    def _watch_pidfds(self, fds: dict[int, int], changed: int) -> None:
        # Pids whose pidfd could not be opened (gone, or not a process: ENOENT, EINVAL):
        # one wake each, then left to the scan while they stay wanted. Tried again every
        # POLL_SECONDS, one pid not a process (a thread) would wake every scan 5 times a
        # second, for every user.
        refused: set[int] = set()
        while not self._stop.is_set():
            wanted = self._wanted
            refused &= wanted
            for pid in [p for p in fds if p not in wanted]:
                os.close(fds.pop(pid))
            limit = max_pidfds()
            for pid in sorted(wanted - fds.keys() - refused):
                if len(fds) >= limit:
                    break  # the rest are seen by the scan
                try:
                    fds[pid] = os.pidfd_open(pid)
                except OSError as err:
                    if err.errno in (errno.EMFILE, errno.ENFILE):
                        break  # out of descriptors: no exit to report, and none to spend
                    refused.add(pid)
                    self.wake.set()  # gone (ESRCH), or no process: let the scan see it now
            poller = select.poll()
            poller.register(changed, select.POLLIN)
            for fd in fds.values():
                poller.register(fd, select.POLLIN)
            # Until a rank exits or the set changes; a pid that could not be opened
            # (out of descriptors) is tried again after POLL_SECONDS.
            ready = {fd for fd, _ in poller.poll(
                POLL_SECONDS * 1000 if wanted - fds.keys() - refused
                else IDLE_SECONDS * 1000)}
            if changed in ready:
                try:
                    while os.read(changed, 4096):
                        pass
                except BlockingIOError:
                    pass
            exited = [pid for pid, fd in fds.items() if fd in ready]
            for pid in exited:
                os.close(fds.pop(pid))
            if exited:
                self.wake.set()

    def _run_kqueue(self, kq: Any) -> None:
        queue = kq.kqueue()
        watched: set[int] = set()  # registered, exit not yet reported
        done: set[int] = set()  # reported (exited, gone or refused): not registered again
        try:
            while not self._stop.is_set():
                wanted = self._wanted
                done &= wanted
                # A pid no longer wanted keeps its one-shot registration until it
                # exits (one spare wake at most); the kernel drops it with the process.
                watched &= wanted
                new = wanted - watched - done
                changes = [kq.kevent(pid, kq.KQ_FILTER_PROC,
                                     kq.KQ_EV_ADD | kq.KQ_EV_ONESHOT, kq.KQ_NOTE_EXIT)
                           for pid in sorted(new)]
                watched |= new
                try:
                    # Room for one event per change, so a failed change is an
                    # EV_ERROR event, not an exception that hides which pid failed.
                    events = queue.control(changes, max(64, len(changes)), POLL_SECONDS)
                except InterruptedError:
                    watched -= new  # re-adding is harmless: EV_ADD on a knote modifies it
                    continue
                except ProcessLookupError:
                    # Only without room in the event list: which pid is unknown.
                    watched -= new
                    done |= new  # the scan sees these; never a busy loop on them
                    self.wake.set()
                    continue
                except (ValueError, OSError) as err:
                    # A closed (ValueError) or broken (EBADF) queue: start afresh.
                    log.warning("exit watcher: kqueue failed (%s); reopening it", err)
                    queue.close()
                    queue = kq.kqueue()
                    watched.clear()
                    self.wake.set()  # an exit may have been missed meanwhile
                    self._stop.wait(POLL_SECONDS)
                    continue
                if self._handle_kevents(kq, events, watched, done):
                    self.wake.set()
        finally:
            queue.close()

    @staticmethod
    def _handle_kevents(kq: Any, events: list[Any], watched: set[int], done: set[int]
                        ) -> bool:
        """Book the events in; True when the scan should look now."""
        wake = False
        for event in events:
            pid = int(event.ident)
            watched.discard(pid)
            done.add(pid)
            if not event.flags & kq.KQ_EV_ERROR:
                wake = True  # NOTE_EXIT: data holds the exit status
            elif event.data == errno.ESRCH:
                wake = True  # gone before it could be watched
            else:
                log.info("exit watcher cannot watch pid %s: %s", pid,
                         os.strerror(int(event.data)))
        return wake
