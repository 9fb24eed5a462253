"""The hook's hot path: one thread's slot of the record, and the functions that
write it on every wait and collective. This is the pure-Python path; its compiled
twin (`_fastpath.c`, chosen in `compiled.py`) writes the same words in the same
order, and tests/unit/rank/test_compiled.py holds the two to the same bytes.

Each thread that calls MLX owns one slot of the record and is its only
writer, so nothing here takes a lock. The functions are closures over locals
(no attribute lookups on the Heartbeat); `Heartbeat` builds them once and
again after a late open. Order inside each one: everything that calls (the
clock, `hash`) first, then only loads and stores; the store that commits
comes after the data it commits (a reader derives everything from committed
words).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from watchdog.record import OP_CODE
from watchdog.record.layout import (
    KIND_SHIFT,
    PACE_OPS,
    RING,
    S_COLLECTIVES,
    S_COMPLETED,
    S_LAST_WAIT,
    S_MAX_WAIT,
    S_OP,
    S_PACE,
    S_PROGRESS,
    S_RING,
    S_SINCE,
    S_STEPS,
)


class Opening(Protocol):
    """What `opening()` needs of a Heartbeat: its late open and its current functions."""

    enter_wait: Callable[[int], int]
    exit_wait: Callable[[int, int], None]
    collective: Callable[[int, Any], None]
    step: Callable[[], None]
    _wait: Callable[[Any, int, tuple[Any, ...], dict[str, Any]], Any]

    def _open_late(self) -> bool: ...

INIT_OP = OP_CODE["init"]
# The word of each op code's pace entry in a slot (a list: an index, bounds-checked, that
# takes an integer-like op as a store into the map does).
PACE_AT = [S_PACE + 2 * code for code in range(PACE_OPS)]
# Record dtype code by hash(mx dtype) & 0xFF (MLX hashes a dtype to its own small number).
DTYPE_CODES: list[int] = [0] * 256


class Slot:
    """One thread's part of the record: its words, and Python copies of its counters
    (reading a Python attribute is several times cheaper than reading the map)."""

    __slots__ = ("w", "k", "depth", "since", "completed", "collectives", "steps",
                 "max_wait", "waits", "longest")

    def __init__(self, words: memoryview, k: int = -1) -> None:
        self.w, self.k = words, k  # k: its index among the record's slots
        self.depth = self.since = self.completed = self.collectives = self.steps = 0
        self.max_wait = 0
        # The pace table's words, per op code: completed waits and the longest.
        self.waits, self.longest = [0] * PACE_OPS, [0] * PACE_OPS


class Release:
    """Kept in the thread's local storage: when the thread ends, its slot goes back."""

    __slots__ = ("slot", "free", "compiled")

    def __init__(self, slot: Slot, free: list[Slot], compiled: Any = None) -> None:
        self.slot, self.free, self.compiled = slot, free, compiled

    def __del__(self) -> None:
        slot = self.slot
        if slot.depth:  # a thread cannot end inside a wait; never leave one open anyway
            slot.depth = 0
            with contextlib.suppress(Exception):
                slot.w[S_SINCE] = 0
        if self.compiled is not None:  # the compiled path keeps its depth in C
            with contextlib.suppress(Exception):
                self.compiled.release(slot.k)
        self.free.append(slot)  # list.append is atomic: no lock


class HotPath(NamedTuple):
    """The functions a Heartbeat hands to the wrappers (and to the user, for `step`)."""

    enter_wait: Callable[[int], int]
    exit_wait: Callable[[int, int], None]
    collective: Callable[[int, Any], None]
    step: Callable[[], None]
    # wait(original, op, args, kwargs): original(*args, **kwargs) inside a wait; what the
    # wrappers of MLX's blocking calls call.
    wait: Callable[[Any, int, tuple[Any, ...], dict[str, Any]], Any]


def _bare(original: Any, op: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return original(*args, **kwargs)


def nothing() -> HotPath:
    """No record: every function does nothing."""
    def none(*args: Any) -> Any:
        return 0

    return HotPath(none, none, none, none, _bare)


def real(local: Any, claim: Callable[[], Slot], clock: Callable[[], int],
         fail: Callable[[BaseException], None], stretch: list[int]) -> HotPath:
    """The hot path over a thread-local slot; `stretch[0]` non-zero inside idle/expect."""
    codes = DTYPE_CODES
    pace = PACE_AT

    def enter(op: int) -> Slot | None:
        """A blocking call starts: open a wait on this thread's slot; returns it."""
        try:
            try:
                st: Slot = local.slot
            except AttributeError:
                st = claim()
            now = clock()
            d = st.depth
            if not d:
                st.since = now
                w = st.w
                w[S_OP] = op
                w[S_SINCE] = now  # commits: this thread is in a wait since now
            st.depth = d + 1
        except Exception as err:  # noqa: BLE001 - never into the user's program
            fail(err)
            return None
        return st

    # The public pair does what `enter` and the wrapper's close and count do, written
    # out again rather than calling them: a Python call costs as much as two stores (so
    # `wait` below writes its close and count out in its `finally` too).
    def enter_wait(op: int) -> int:
        """A blocking call starts; returns its start time for `exit_wait`."""
        try:
            try:
                st: Slot = local.slot
            except AttributeError:
                st = claim()
            now = clock()
            d = st.depth
            if not d:
                st.since = now
                w = st.w
                w[S_OP] = op
                w[S_SINCE] = now
            st.depth = d + 1
        except Exception as err:  # noqa: BLE001
            fail(err)
            return 0
        return now

    def exit_wait(started: int, op: int) -> None:
        """The blocking call returned (or raised): close the wait, count it, and time it
        from `started`."""
        if not started:
            return
        try:
            st: Slot = local.slot
            w = st.w
            d = st.depth - 1
            if d < 1:
                w[S_SINCE] = 0  # commits: out of the wait
                d = 0
            st.depth = d
            now = clock()
            w[S_PROGRESS] = now
            c = st.completed + 1
            st.completed = c
            w[S_COMPLETED] = c
            if op != INIT_OP and not d:
                last = now - started
                w[S_LAST_WAIT] = last
                # Waits inside idle() or expect() are not the rank's normal pace: they
                # are neither counted in the pace table nor stretch the learned deadline.
                if not stretch[0]:
                    waits = st.waits
                    c = waits[op] + 1  # a list: bounds-checked, takes an integer-like op
                    waits[op] = c
                    w[pace[op]] = c  # the op's pace entry: its count, then its longest
                    longest = st.longest
                    if last > longest[op]:
                        longest[op] = last
                        w[pace[op] + 1] = last
                        if last > st.max_wait:
                            st.max_wait = last
                            w[S_MAX_WAIT] = last
        except Exception as err:  # noqa: BLE001
            fail(err)

    def collective(op: int, out: Any) -> None:
        """A collective was issued: count it and add it to the thread's flight ring."""
        try:
            kind = out.nbytes << KIND_SHIFT | codes[hash(out.dtype) & 0xFF] << 8 | op
            try:
                st = local.slot
            except AttributeError:
                st = claim()
            now = clock()
            n = st.collectives + 1
            i = S_RING + n % RING * 2
            w = st.w
            w[i] = now
            w[i + 1] = kind
            st.collectives = n
            w[S_COLLECTIVES] = n  # commits the entry
        except Exception as err:  # noqa: BLE001
            fail(err)

    def step() -> None:
        """One unit of user progress (a training step, a generated token)."""
        try:
            try:
                st = local.slot
            except AttributeError:
                st = claim()
            s = st.steps + 1
            st.steps = s
            st.w[S_STEPS] = s
        except Exception as err:  # noqa: BLE001
            fail(err)

    def wait(original: Any, op: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A blocking call inside a wait. The close is written out in the `finally`: it
        comes before any call, so no signal can be delivered between the end of the
        wait and its close."""
        st = enter(op)
        try:
            return original(*args, **kwargs)
        finally:
            if st is not None:
                d = st.depth - 1
                if d < 1:
                    try:  # not contextlib.suppress: that is a call before the store
                        st.w[S_SINCE] = 0
                    except Exception:  # noqa: BLE001, S110 - a closed record: nothing to close
                        pass
                    d = 0
                st.depth = d
                try:  # count it, the progress, and time the thread's outermost wait
                    since = st.since  # before the clock: a handler that runs there waits anew
                    now = clock()
                    w = st.w
                    w[S_PROGRESS] = now
                    c = st.completed + 1
                    st.completed = c
                    w[S_COMPLETED] = c
                    if op != INIT_OP and not d:
                        last = now - since
                        w[S_LAST_WAIT] = last
                        if not stretch[0]:
                            waits = st.waits
                            c = waits[op] + 1
                            waits[op] = c
                            w[pace[op]] = c
                            longest = st.longest
                            if last > longest[op]:
                                longest[op] = last
                                w[pace[op] + 1] = last
                                if last > st.max_wait:
                                    st.max_wait = last
                                    w[S_MAX_WAIT] = last
                except Exception as err:  # noqa: BLE001
                    fail(err)

    return HotPath(enter_wait, exit_wait, collective, step, wait)


def opening(hb: Opening) -> HotPath:
    """Before a late open: each function opens the record, then does its work through
    the real one. Wrappers are rebuilt over the real ones at the open (`on_open`), so
    only references taken before it keep this extra call."""
    # Each one calls the real path only once it is bound: should it find itself
    # still in place (another thread's open half done), it does without, and the
    # original runs; never a call of itself, which recurses until RecursionError.
    def enter_wait(op: int) -> int:
        return hb.enter_wait(op) if hb._open_late() and hb.enter_wait is not enter_wait else 0

    def exit_wait(started: int, op: int) -> None:
        if started and hb.exit_wait is not exit_wait:
            hb.exit_wait(started, op)

    def collective(op: int, out: Any) -> None:
        if hb._open_late() and hb.collective is not collective:
            hb.collective(op, out)

    def step() -> None:
        if hb._open_late() and hb.step is not step:
            hb.step()

    def wait(original: Any, op: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if hb._open_late() and hb._wait is not wait:
            return hb._wait(original, op, args, kwargs)
        return original(*args, **kwargs)

    return HotPath(enter_wait, exit_wait, collective, step, wait)
