"""The Heartbeat: this process's record, its thread slots, and the user's API.

The hot path itself (one function call per wait or collective) is built in
`hotpath.py` (or `_fastpath.c`), over the thread slots `slots.py` hands out; here
are the cold parts: opening the record late, `idle()`/`expect()`/`step()`, the
group identity, failure and close.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from watchdog import record
from watchdog.rank import hotpath
from watchdog.rank.env import warn as _warn
from watchdog.rank.slots import ThreadSlots
from watchdog.record import RecordWriter
from watchdog.states import Phase

_open_lock = threading.Lock()  # two threads' first waits open one record


def reset_open_lock() -> None:
    """In a forked child: a fresh lock (the parent's may be held by a thread gone)."""
    global _open_lock
    _open_lock = threading.Lock()


class Heartbeat:
    """This process's counters and phase, kept in its mapped record.

    Each thread that calls MLX gets a slot of the record of its own and is its
    only writer, so the hot path (`enter_wait`, `exit_wait`, `collective`,
    `step`) takes no lock: a signal handler that calls into MLX, or an
    interrupt at any point, can never block it. A wait is open while the
    slot's `since` word is non-zero: one store opens it, one store closes it.
    On Python 3.11+ no signal can be delivered between a hot path's clock read
    and its last store (the interpreter only runs handlers on calls and
    backward jumps), and the wrapper closes a wait with no call before the
    store, so an interrupt can neither leave a wait open nor hide one.

    `idle()`, `expect()` and the group identity are rare and go to the
    record's cold words under a reentrant lock and the seqlock. A Heartbeat
    whose record could not be opened still works: every method is a no-op.

    With an `opener` and no writer, the record is opened late: on the first wait,
    collective or call of the user's API, i.e. when the process first acts like a
    rank. Zero-code activation installs this way so that a process that only
    imports mlx.core (`mlx.launch` itself, a tool) is never published as a rank.
    """

    enter_wait: Callable[[int], int]
    exit_wait: Callable[[int, int], None]
    collective: Callable[[int, Any], None]
    step: Callable[[], None]
    _wait: Callable[[Any, int, tuple[Any, ...], dict[str, Any]], Any]

    def __init__(self, writer: RecordWriter | None = None,
                 clock: Callable[[], int] = time.monotonic_ns,
                 opener: Callable[[], RecordWriter] | None = None,
                 on_open: Callable[[Heartbeat], None] | None = None) -> None:
        self._writer = writer
        self._opener = opener if writer is None else None
        self._on_open = on_open  # after a late open: re-wrap MLX with the real hot path
        # The job the caller named (install(job=...)); None: derived from the launch's
        # environment at the open and again when the group forms (mx.distributed.init).
        self.pinned_job: str | None = None
        self._closed = False
        self._clock = clock
        self._cold = threading.RLock()  # reentrant: a signal handler may publish inside
        self._idle_depth = 0
        self._idle_since = self._idle_ended = 0
        self._expects: list[tuple[float, int, str]] = []
        self._stretch = [0]  # non-zero inside idle() or expect(): waits do not teach
        # The compiled hot path if it is there (compiled.py); `compiled` says which runs.
        self._threads = ThreadSlots()
        self._take(writer)

    def _take(self, writer: RecordWriter | None) -> None:
        """Use `writer`'s slots, and build the hot path over them."""
        self._threads.take(writer)
        self._build(writer)

    def _open_late(self) -> bool:
        """Open the record now (the cold path, taken once); False if there is none."""
        opener = self._opener
        if opener is None:
            return self._writer is not None
        try:
            with _open_lock:
                if self._writer is not None or self._opener is None:
                    return self._writer is not None
                self._opener = None
                writer = opener()
                with self._cold:
                    if self._closed:  # uninstall() won the race: publish nothing
                        writer.close(record.STATUS_CLOSED, remove=True)
                        return False
                    # The path is built first, the writer published last: another
                    # thread's first wait meanwhile sees no record yet and calls the
                    # original, instead of the opening wrapper calling itself.
                    self._take(writer)
                    self._writer = writer
            self._cold_update(lambda now: None)  # idle/expect entered before the open
        except Exception as err:  # noqa: BLE001 - never into the user's program
            _warn(f"not instrumenting this process: {err}")
            return False
        if self._on_open is not None:
            self._on_open(self)
        return True

    @property
    def active(self) -> bool:
        """Instrumented: the record is open, or opens at the first sign of a rank."""
        return self._writer is not None or self._opener is not None

    @property
    def compiled(self) -> bool:
        """The compiled hot path runs (or will, once a lazy record opens)."""
        return self._threads.fast is not None

    @property
    def hotpath(self) -> str:
        """Which hot path runs, in words (and why not the compiled one)."""
        return self._threads.hotpath

    @property
    def published(self) -> bool:
        """The record exists (zero-code activation opens it late)."""
        return self._writer is not None

    @property
    def path(self) -> str | None:
        """The record's path, None while it is not open."""
        return self._writer.path if self._writer is not None else None

    collectives = property(lambda self: self._threads.totals()[0])
    waits_entered = property(lambda self: sum(self._threads.totals()[1:3]))
    waits_completed = property(lambda self: self._threads.totals()[1])
    steps = property(lambda self: self._threads.totals()[3])

    @property
    def phase(self) -> Phase:
        """The rank's phase now: idle, waiting (any thread in a wait) or running."""
        if self._idle_depth:
            return Phase.IDLE
        return Phase.WAIT if self._threads.totals()[2] else Phase.RUNNING

    # -- the hot path --------------------------------------------------------

    def _build(self, writer: RecordWriter | None = None) -> None:
        """Bind the hot-path functions: real over the record (compiled or Python),
        opening, or nothing. `writer`: the record about to be published."""
        writer = writer if writer is not None else self._writer
        self._threads.unbind()
        if writer is not None:
            path = self._threads.bind(writer, self._clock, self._fail, self._stretch)
        elif self._opener is not None:
            path = hotpath.opening(self)
        else:
            path = hotpath.nothing()
        self.enter_wait, self.exit_wait, self.collective, self.step, self._wait = path

    # -- the user's API (cold) -------------------------------------------------

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """Declared idle (e.g. waiting for requests): never judged a stall."""
        self._set_idle(1)
        try:
            yield
        finally:
            self._set_idle(-1)

    @contextlib.contextmanager
    def expect(self, seconds: float, reason: str = "") -> Iterator[None]:
        """This stretch may take up to `seconds`: waits inside get that deadline."""
        seconds = float(seconds)
        if not 0 <= seconds < float("inf"):  # NaN and inf too: never `Infinity` in JSON
            raise ValueError(f"expect() needs finite seconds >= 0, got {seconds}")
        self._cold_update(lambda now: self._expects.append((seconds, now, reason)))
        try:
            yield
        finally:
            self._cold_update(lambda now: self._expects.pop() if self._expects else None)

    def _set_idle(self, delta: int) -> None:
        def change(now: int) -> None:
            was, self._idle_depth = self._idle_depth, max(0, self._idle_depth + delta)
            if not was and self._idle_depth:
                self._idle_since = now
            elif was and not self._idle_depth:
                self._idle_since, self._idle_ended = 0, now

        self._cold_update(change)

    def _cold_update(self, change: Callable[[int], object]) -> None:
        """Apply a change to the idle depth or the expect stack, and publish both."""
        opening = False
        try:
            with self._cold:
                now = self._clock()
                change(now)
                self._stretch[0] = self._idle_depth + len(self._expects)
                writer = self._writer
                # The late open takes _open_lock, then _cold: it is called below,
                # with _cold let go, never inside it (the other lock order deadlocks
                # against another thread's open).
                opening = writer is None and self._opener is not None
                if writer is None:
                    return
                seconds, since, reason = self._expects[-1] if self._expects else (0.0, 0, "")
                writer.begin()
                try:
                    writer.write_idle(self._idle_since, self._idle_ended)
                    writer.write_expect(seconds, since, reason)
                finally:
                    writer.end()
        except Exception as err:  # noqa: BLE001
            self._fail(err)
        finally:
            if opening:
                self._open_late()  # publishes the change once open

    # -- identity and lifetime -----------------------------------------------

    def set_group(self, rank: int, world_size: int, backend: str | None,
                  job: str | None = None) -> None:
        """Publish the rank's place in its group (and its job, when the group forms)."""
        if self._writer is None and self._opener is not None:
            self._open_late()
        try:
            with self._cold:
                writer = self._writer
                if writer is not None:
                    writer.set_identity(rank=rank, world_size=world_size, backend=backend,
                                        job=job)
        except Exception as err:  # noqa: BLE001
            self._fail(err)

    def publish_threads(self) -> None:
        """Publish the native ids of this process's Python threads (main excluded).

        The daemon's backstop (docs/judging.md) needs to know which of the
        process's threads run Python: one of them computing at 100% is the
        user's work, while a spinning thread that is not one of them is MLX's.
        Called at install and after each `threading.Thread.start`, never on the
        hot path. A thread that ended stays listed until the next start: a
        recycled id then reads as Python, which can only withhold a verdict.
        """
        main = threading.main_thread()
        tids = [t.native_id for t in threading.enumerate()
                if t is not main and t.native_id is not None]
        try:
            with self._cold:
                writer = self._writer
                if writer is None:
                    return  # not published yet (a lazy record): done again at the open
                writer.begin()
                try:
                    writer.write_threads(tids)
                finally:
                    writer.end()
        except Exception as err:  # noqa: BLE001 - never into the user's program
            self._fail(err)

    def _fail(self, err: BaseException) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return  # closed already (uninstall, another thread's failure): nothing to say
        self._threads.retire()
        also = ""
        try:
            # Not STATUS_ERROR: the rank runs on; its frozen words must not
            # be judged, nor its later exit taken for a crash.
            writer.close(record.STATUS_ABANDONED, remove=False)
        except Exception as close_err:  # noqa: BLE001 - never into the user's program
            also = f" (nor could it be marked abandoned: {close_err!r})"
        _warn(f"record disabled after an error ({err!r}){also}; the rank runs on "
              "uninstrumented")

    def close(self, status: int = record.STATUS_CLOSED) -> None:
        """Mark the record closed; remove it unless the rank is ending on an error,
        whose record the daemon reports (and fences the job over)."""
        with self._cold:
            writer, self._writer = self._writer, None
            self._opener, self._closed = None, True
        self._threads.retire()
        if writer is not None:
            try:
                writer.close(status, remove=status != record.STATUS_ERROR)
            except Exception as err:  # noqa: BLE001 - never into the user's program
                _warn(f"could not close the record {writer.path} ({err!r})")

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's record is not ours to write or remove."""
        self._writer = self._opener = None
        self._threads.retire()
        self._cold = threading.RLock()
