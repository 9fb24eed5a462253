"""The responses' evidence workers, shared fairly between the users whose jobs hang.

A capture waits on the rank (its dump handler, a sampler) for up to the evidence
time box, and what the rank does is its owner's to choose: a user with a hundred
hung processes that ignore the dump signal would hold every worker of a plain
pool, and another user's hang would wait behind them. Here each uid has its own
queue and at most one piece of work in flight; the workers take the uids in
turn. A queued piece of work a response no longer waits for (its time box, from
the verdict, ran out) is cancelled and never run.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

log = logging.getLogger(__name__)

Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class FairWork:
    """`workers` threads; per uid, one piece of work at a time, uids in turn."""

    def __init__(self, workers: int, name: str = "evidence") -> None:
        self._cond = threading.Condition()
        self._queues: collections.OrderedDict[int, collections.deque[Work]] = \
            collections.OrderedDict()
        self._busy: set[int] = set()  # uids with work in flight
        self._stopped = False
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-{n}", daemon=True)
                         for n in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, uid: int, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run `fn(*args)` for `uid` when a worker is free and no other work of that
        uid is in flight."""
        future: Future[Any] = Future()
        with self._cond:
            if self._stopped:
                raise RuntimeError("the evidence workers are shut down")
            self._queues.setdefault(uid, collections.deque()).append((future, fn, args))
            self._cond.notify()
        return future

    def _next(self) -> tuple[int, Work] | None:
        """The first uid in turn with work and none in flight, its work (lock held)."""
        for uid in list(self._queues):
            if uid in self._busy:
                continue
            queue = self._queues[uid]
            while queue:
                work = queue.popleft()
                if work[0].set_running_or_notify_cancel():  # False: cancelled, dropped
                    if queue:
                        self._queues.move_to_end(uid)  # its next one waits its turn
                    else:
                        del self._queues[uid]
                    return uid, work
            del self._queues[uid]
        return None

    def _serve(self) -> None:
        while True:
            with self._cond:
                picked = self._next()
                while picked is None:
                    if self._stopped:
                        return
                    self._cond.wait()
                    picked = self._next()
                uid, (future, fn, args) = picked
                self._busy.add(uid)
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # noqa: BLE001 - handed to the step that reads it
                future.set_exception(err)
            finally:
                with self._cond:
                    self._busy.discard(uid)
                    self._cond.notify_all()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """No more work; queued work cancelled if asked; the workers end when idle."""
        with self._cond:
            self._stopped = True
            if cancel_futures:
                for queue in self._queues.values():
                    for future, _, _ in queue:
                        future.cancel()
                self._queues.clear()
            self._cond.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()


def run_for(executor: FairWork | Executor | None, uid: int, fn: Callable[..., Any],
            *args: Any) -> Future[Any]:
    """`fn(*args)` for `uid` on `executor`: a `FairWork` takes the uid, another any
    work; without one (tests), at once, its result or error in the future returned."""
    if isinstance(executor, FairWork):
        return executor.submit(uid, fn, *args)
    if executor is not None:
        return executor.submit(fn, *args)
    future: Future[Any] = Future()
    try:
        future.set_result(fn(*args))
    except Exception as err:  # noqa: BLE001 - handed to the step that reads it
        future.set_exception(err)
    return future
