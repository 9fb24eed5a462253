"""The zero-code hook's late open under threads and fork.

Each race is made to happen every time: the window is held open by the test
(a writer whose slots are slow to hand out, a lock the test holds), instead of
hoping a switch interval lands in it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.ranks import wait_for
from watchdog.rank import heartbeat, hook
from watchdog.rank.heartbeat import Heartbeat
from watchdog.record import RecordWriter


def writer_for(path: Path) -> RecordWriter:
    return RecordWriter(str(path), pid=os.getpid(), start_time=0.0, uid=os.getuid(), host="h",
                        job="j", rank=0, world_size=1, backend="ring", dump_signal=0)


class SlowSlots:
    """A real writer whose first `slot()` runs `meanwhile` first: the moment an open
    is between taking the record and binding its hot path."""

    def __init__(self, writer: RecordWriter, meanwhile: Any) -> None:
        self._writer, self._meanwhile = writer, meanwhile

    def slot(self, k: int) -> Any:
        meanwhile, self._meanwhile = self._meanwhile, None
        if meanwhile is not None:
            meanwhile()
        return self._writer.slot(k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_a_second_threads_first_wait_during_the_open_calls_the_original(tmp_path, monkeypatch,
                                                                         path):
    """Another thread's first wait while the record opens: the opening wrapper must
    not call itself (RecursionError into mx.eval); the original runs, once."""
    from watchdog.rank import compiled

    monkeypatch.setenv(compiled.ENV, path)
    got: list[Any] = []
    hb: Heartbeat

    def second_thread() -> None:
        def original(x: int) -> int:
            return x + 1

        def run() -> None:
            try:
                got.append(hb._wait(original, 1, (41,), {}))
            except BaseException as err:  # noqa: BLE001 - what reached the user
                got.append(err)

        t = threading.Thread(target=run)
        t.start()
        t.join(10)

    hb = Heartbeat(None, opener=lambda: SlowSlots(writer_for(tmp_path / "r.rec"),
                                                  second_thread))  # type: ignore[arg-type,return-value]
    try:
        assert hb._wait(lambda: "first", 1, (), {}) == "first"
        assert got == [42], got
        assert hb.published
    finally:
        hb.close()


def test_idle_before_a_lazy_open_does_not_hold_cold_while_waiting_for_the_open_lock(tmp_path):
    """idle()/expect() before the open take _cold, then the open takes _open_lock and
    _cold: so idle must let _cold go before it opens, or it deadlocks with another
    thread's open that holds _open_lock and waits for _cold."""
    hb = Heartbeat(None, opener=lambda: writer_for(tmp_path / "r.rec"))
    heartbeat._open_lock.acquire()  # another thread's open, under way
    try:
        entered = threading.Event()

        def idle() -> None:
            with hb.idle():
                entered.set()

        t = threading.Thread(target=idle, daemon=True)
        t.start()
        wait_for(lambda: hb._stretch[0] == 1, 5, what="idle() applied")

        def cold_free() -> bool:
            if hb._cold.acquire(blocking=False):
                hb._cold.release()
                return True
            return False

        wait_for(cold_free, 3, what="idle() waiting for the open without holding _cold")
    finally:
        heartbeat._open_lock.release()
    wait_for(entered.is_set, 5, what="idle() entered once the open lock was free")
    t.join(5)
    assert hb.published
    hb.close()


@pytest.mark.parametrize("lock", ["install", "open"])
def test_a_fork_while_another_thread_holds_a_hook_lock_leaves_the_child_free(lock):
    """A thread inside install() (or a late open) at the moment of a fork: the child
    must not inherit that lock held for ever."""
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        target = hook._install_lock if lock == "install" else heartbeat._open_lock
        with target:
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(5)
        pid = os.fork()
        if pid == 0:
            target = hook._install_lock if lock == "install" else heartbeat._open_lock
            os._exit(0 if target.acquire(timeout=2) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child found the lock held"
    finally:
        release.set()
        t.join(5)
