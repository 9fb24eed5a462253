"""The record's table of Python threads: written by the hook, read by the daemon."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil

from watchdog import record
from watchdog.rank.heartbeat import Heartbeat
from watchdog.rank.patches import _wrap_thread_start
from watchdog.record import RecordWriter, layout


def writer(path: Path) -> RecordWriter:
    return RecordWriter(str(path), pid=os.getpid(), start_time=psutil.Process().create_time(),
                        uid=os.getuid(), host="h", job="j", rank=0, world_size=2,
                        backend="ring", dump_signal=0)


def test_a_fresh_record_publishes_no_table(tmp_path: Path) -> None:
    w = writer(tmp_path / "1.rec")
    rec = record.read_path(w.path)
    assert rec.python_threads is None and not rec.python_threads_overflow
    w.close(record.STATUS_CLOSED)


def test_thread_start_publishes_live_python_threads(tmp_path: Path) -> None:
    hb = Heartbeat(writer(tmp_path / "1.rec"))
    hb.publish_threads()
    before = record.read_path(hb.path).python_threads
    assert before is not None and threading.main_thread().native_id not in before
    release = threading.Event()
    start = _wrap_thread_start(hb, threading.Thread.start)
    worker = threading.Thread(target=release.wait, daemon=True)
    start(worker)
    try:
        rec = record.read_path(hb.path)
        assert worker.native_id in rec.python_threads  # type: ignore[operator]
        assert worker.native_id in {t.id for t in psutil.Process().threads()}
    finally:
        release.set()
        worker.join()
    hb.close()


def test_more_threads_than_slots_is_marked_partial(tmp_path: Path) -> None:
    hb = Heartbeat(writer(tmp_path / "1.rec"))
    release = threading.Event()
    workers = [threading.Thread(target=release.wait, daemon=True)
               for _ in range(layout.PY_THREAD_SLOTS + 1)]
    for t in workers:
        t.start()
    try:
        hb.publish_threads()
        rec = record.read_path(hb.path)
        assert rec.python_threads_overflow
        assert len(rec.python_threads or ()) == layout.PY_THREAD_SLOTS
    finally:
        release.set()
        for t in workers:
            t.join()
    hb.close()
