"""The evidence workers: one piece of work in flight per uid, uids in turn (issue 30, 1)."""

from __future__ import annotations

import threading
import time

from watchdog.daemon.act.workers import FairWork


def test_one_uids_crowd_holds_one_worker_and_another_uid_runs_at_once() -> None:
    pool = FairWork(4)
    release = threading.Event()
    running: list[int] = []
    lock = threading.Lock()

    def hung(uid: int) -> int:
        with lock:
            running.append(uid)
        release.wait(10)
        return uid

    try:
        crowd = [pool.submit(65534, hung, 65534) for _ in range(20)]
        victim = pool.submit(0, lambda: "ran")
        assert victim.result(timeout=5) == "ran"  # not behind the crowd
        time.sleep(0.1)
        assert running == [65534], running  # one of the crowd's at a time
        for future in crowd[5:]:
            assert future.cancel()  # queued: cancelled and never run
        release.set()
        assert [f.result(timeout=5) for f in crowd[:5]] == [65534] * 5
        assert all(f.cancelled() for f in crowd[5:])
        assert len(running) == 5
    finally:
        release.set()
        pool.shutdown(wait=True, cancel_futures=True)


def test_an_error_is_handed_to_the_future_and_the_uid_goes_on() -> None:
    pool = FairWork(1)
    try:
        failed = pool.submit(7, lambda: 1 / 0)
        after = pool.submit(7, lambda: "next")
        assert isinstance(failed.exception(timeout=5), ZeroDivisionError)
        assert after.result(timeout=5) == "next"
    finally:
        pool.shutdown(wait=True)
