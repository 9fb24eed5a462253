"""The kqueue exit watcher (macOS) against a scripted kqueue that behaves as kevent(2)."""

from __future__ import annotations

import errno
import threading

import pytest

from tests.support.fake_kqueue import FakeKqueueModule
from watchdog.daemon.probes.exits import ExitWatcher


@pytest.fixture
def running():
    started: list[ExitWatcher] = []

    def start(machine: FakeKqueueModule, pids: set[int]) -> tuple[ExitWatcher, threading.Event]:
        wake = threading.Event()
        watcher = ExitWatcher(wake, kq=machine)
        watcher.watch(pids)
        watcher.start()
        started.append(watcher)
        return watcher, wake

    yield start
    for watcher in started:
        watcher.stop()
        watcher.join(5)


def settled(machine: FakeKqueueModule, calls: int = 3) -> None:
    """Let the watcher go round its loop a few more times."""
    target = machine.controls + calls
    assert machine.wait_for(lambda: machine.controls >= target)


def test_darwin_picks_kqueue_and_linux_pidfd(darwin, monkeypatch):
    import select

    monkeypatch.setattr(select, "kqueue", object(), raising=False)
    assert ExitWatcher(threading.Event())._kq is select
    darwin.OS = darwin.LINUX
    assert ExitWatcher(threading.Event())._kq is None


@pytest.mark.slow
def test_note_exit_wakes_the_scan_once(running):
    machine = FakeKqueueModule(alive={100, 101})
    _, wake = running(machine, {100, 101})
    assert machine.wait_for(lambda: set(machine.registrations) == {100, 101})
    assert not wake.is_set()
    machine.exit(100, status=9)
    assert wake.wait(5)
    wake.clear()
    settled(machine)
    # Still wanted (the scan has not dropped it yet) but reported: not re-added.
    assert machine.registrations.count(100) == 1
    assert not wake.is_set()
    machine.exit(101)
    assert wake.wait(5)


@pytest.mark.slow
def test_pid_already_gone_is_an_ev_error_event_and_wakes_without_a_busy_loop(running):
    machine = FakeKqueueModule(alive={100})
    _, wake = running(machine, {100, 555})
    assert wake.wait(5)
    settled(machine, 5)
    assert machine.registrations.count(555) == 1
    assert 100 in machine.queues[0].knotes  # the good pid in the same batch is watched


@pytest.mark.slow
def test_refused_pid_does_not_wake(running):
    machine = FakeKqueueModule(alive={100, 7}, forbidden={7})
    watcher, wake = running(machine, {7})
    settled(machine, 5)
    assert machine.registrations.count(7) == 1
    assert not wake.is_set()


@pytest.mark.slow
def test_a_dropped_then_rewanted_pid_is_watched_again(running):
    machine = FakeKqueueModule(alive={100, 101})
    watcher, wake = running(machine, {100})
    assert machine.wait_for(lambda: 100 in machine.registrations)
    watcher.watch({101})
    assert machine.wait_for(lambda: 101 in machine.registrations)
    watcher.watch({100, 101})
    assert machine.wait_for(lambda: machine.registrations.count(100) == 2)


@pytest.mark.slow
def test_eintr_is_survived(running):
    machine = FakeKqueueModule(alive={100})
    machine.faults.append(InterruptedError(errno.EINTR, "Interrupted system call"))
    _, wake = running(machine, {100})
    # The interrupted call applied nothing; the next one adds the pid again.
    assert machine.wait_for(lambda: 100 in machine.queues[0].knotes)
    assert not machine.queues[0].fail_next
    machine.exit(100)
    assert wake.wait(5)


@pytest.mark.slow
def test_eventlist_without_room_raises_esrch_and_the_scan_is_woken(running):
    machine = FakeKqueueModule(alive=set())
    machine.faults.append(OSError(errno.ESRCH, "No such process"))
    assert isinstance(machine.faults[0], ProcessLookupError)
    _, wake = running(machine, {300})
    assert wake.wait(5)
    settled(machine)
    assert machine.registrations.count(300) == 0  # never retried in a loop


@pytest.mark.slow
def test_closed_queue_is_reopened_and_pids_registered_again(running):
    machine = FakeKqueueModule(alive={100})
    _, wake = running(machine, {100})
    assert machine.wait_for(lambda: 100 in machine.registrations)
    first = machine.queues[0]
    first.close()
    with machine.cond:
        machine.cond.notify_all()
    assert wake.wait(5)  # an exit may have been missed while it was broken
    assert machine.wait_for(lambda: len(machine.queues) == 2
                            and 100 in machine.queues[1].knotes)
    wake.clear()
    machine.exit(100)
    assert wake.wait(5)


@pytest.mark.slow
def test_stop_closes_the_queue(running):
    machine = FakeKqueueModule(alive={100})
    watcher, _ = running(machine, {100})
    assert machine.wait_for(lambda: 100 in machine.registrations)
    watcher.stop()
    watcher.join(5)
    assert machine.queues[0].closed


def test_no_kqueue_at_all_stops_the_watcher_not_the_daemon(caplog):
    class NoQueues(FakeKqueueModule):
        def kqueue(self):  # type: ignore[override]
            raise OSError(errno.EMFILE, "Too many open files")

    wake = threading.Event()
    watcher = ExitWatcher(wake, kq=NoQueues(alive={100}))
    watcher.watch({100})
    watcher.start()
    watcher.join(5)
    assert watcher._thread is not None and not watcher._thread.is_alive()
    assert "exit watcher stopped; exits are seen at the next scan" in caplog.text
