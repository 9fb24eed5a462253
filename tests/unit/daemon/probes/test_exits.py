"""The pidfd exit watcher (Linux): a watched process's exit wakes the loop at once, a
change of the watched set takes effect at once, and with nothing to do it sleeps (it
woke 5 times a second before, rebuilding its poll set each time)."""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time

import pytest

from watchdog.daemon.probes import exits
from watchdog.daemon.probes.exits import ExitWatcher

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux's pidfd")]


@pytest.fixture
def watcher(monkeypatch):
    polls = []
    real = select.poll

    class Counted:
        def __init__(self):
            self.inner = real()

        def register(self, fd, mask):
            self.inner.register(fd, mask)

        def poll(self, timeout):
            polls.append(timeout)
            return self.inner.poll(timeout)

    monkeypatch.setattr(exits.select, "poll", Counted)
    wake = threading.Event()
    w = ExitWatcher(wake)
    w.polls = polls
    w.start()
    yield w
    w.stop()
    w.join(2)
    assert w._thread is not None and not w._thread.is_alive()  # stop wakes its poll


def test_an_exit_wakes_the_loop_at_once_and_an_idle_watcher_sleeps(watcher):
    proc = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)  # idle: nothing watched
        watcher.watch({proc.pid})
        time.sleep(1.0)  # watching a live process: asleep in poll
        assert len(watcher.polls) <= 3, watcher.polls  # ~7 at the old 0.2 s
        watcher.wake.clear()
        proc.kill()
        assert watcher.wake.wait(2.0)  # at once, not after its 5 s of idle sleep
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_already_gone_wakes_the_loop_when_it_is_watched(watcher):
    proc = subprocess.Popen(["true"])
    proc.wait()
    time.sleep(0.3)
    watcher.wake.clear()
    watcher.watch({proc.pid})  # the watcher was asleep: the change wakes it
    assert watcher.wake.wait(1.0)


def test_a_pid_that_is_no_process_wakes_the_loop_once(watcher):
    """Issue 57, item 9: a thread's id (no pidfd: ENOENT or EINVAL) wakes the loop once
    as a gone pid does, not at every retry (5 times a second, for every user)."""
    ready, done = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (ready.set(), done.wait(10)))
    worker.start()
    try:
        ready.wait(2)
        assert worker.native_id != os.getpid()
        watcher.wake.clear()
        watcher.watch({worker.native_id})
        assert watcher.wake.wait(1.0)  # the scan looks at it now
        watcher.wake.clear()
        time.sleep(1.0)
        assert not watcher.wake.is_set()  # ~5 wakes at the old retry every 0.2 s
    finally:
        done.set()
        worker.join()
