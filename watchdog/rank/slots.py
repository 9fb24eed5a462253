"""The record's thread slots, who holds each, and the hot path bound over them.

A record has `layout.THREAD_SLOTS` slots. Each thread that calls MLX claims one at
its first call (`claim`, the cold path, once per thread) and is its only writer;
its `Release` in the thread's local storage gives it back when the thread ends.
A thread that finds none free writes to scratch memory, unrecorded (warned once).
`bind` builds the hot path over the slots: the compiled one (`compiled.py`) if it
is there and starts, else the pure-Python one (`hotpath.real`). `retire` points
every slot at scratch memory, so that a closed record is never written again.

The `Heartbeat` (heartbeat.py) owns one, and decides when to bind and retire.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from watchdog.rank import compiled, hotpath
from watchdog.rank.env import warn as _warn
from watchdog.rank.hotpath import Release, Slot
from watchdog.record import RecordWriter, layout


class ThreadSlots:
    """The thread slots of the open record (none before it opens) and the hot path
    over them: compiled if it can be (`fast`; `hotpath` says which in words)."""

    def __init__(self) -> None:
        self.local = threading.local()  # each thread's `slot` and `release`
        self.fast, self.hotpath = compiled.choice()
        self.cpath: Any = None  # the compiled Path over the open record
        self._scratch = memoryview(bytearray(layout.SLOT_SIZE)).cast("Q")
        self._overflow = Slot(self._scratch)
        self._overflowed = False
        self.slots: list[Slot] = []
        self.free: list[Slot] = []

    def take(self, writer: RecordWriter | None) -> None:
        """Use `writer`'s slots (none: no record)."""
        self.slots = [Slot(writer.slot(k), k) for k in range(layout.THREAD_SLOTS)] \
            if writer is not None else []
        self.free = self.slots[::-1]  # claimed with list.pop(): atomic, slot 0 first

    def claim(self) -> Slot:
        """This thread's first call: take a free slot (cold, once per thread)."""
        try:
            slot = self.free.pop()
        except IndexError:
            slot = self._overflow  # scratch memory: this thread's calls go unrecorded
            if not self._overflowed:
                self._overflowed = True
                _warn(f"more than {layout.THREAD_SLOTS} threads call MLX at once; the "
                      "waits of the others are not recorded")
        else:
            with contextlib.suppress(Exception):
                slot.w[layout.S_OWNER] = threading.get_native_id()
            self.local.release = Release(slot, self.free, self.cpath)
        self.local.slot = slot
        return slot

    def claim_index(self) -> int:
        """The compiled path's claim: this thread's slot index, -1 for none free."""
        slot = self.claim()
        return slot.k if slot is not self._overflow else -1

    def totals(self) -> tuple[int, int, int, int]:
        """(collectives, waits completed, threads in a wait, steps) over the slots."""
        if self.cpath is not None:
            return self.cpath.totals()  # type: ignore[no-any-return]
        slots = self.slots
        return (sum(s.collectives for s in slots), sum(s.completed for s in slots),
                sum(bool(s.depth) for s in slots), sum(s.steps for s in slots))

    def unbind(self) -> None:
        """Before a rebuild: the old compiled Path lets go of the map."""
        if self.cpath is not None:
            self.cpath.retire()
            self.cpath = None

    def bind(self, writer: RecordWriter, clock: Callable[[], int],
             fail: Callable[[BaseException], None], stretch: list[int]) -> hotpath.HotPath:
        """The hot path over `writer`'s record: compiled, or pure Python."""
        return self._compiled(writer, clock, fail, stretch) or hotpath.real(
            self.local, self.claim, clock, fail, stretch)

    def _compiled(self, writer: RecordWriter, clock: Callable[[], int],
                  fail: Callable[[BaseException], None], stretch: list[int]
                  ) -> hotpath.HotPath | None:
        """The compiled hot path over the open record, or None (pure Python)."""
        if self.fast is None:
            return None
        try:
            path, self.cpath = compiled.real(self.fast, writer.words, self.claim_index,
                                             fail, stretch, clock)
        except Exception as err:  # noqa: BLE001 - the pure-Python path still works
            _warn(f"the compiled hot path would not start ({err!r}); using Python's")
            self.fast = None
            self.hotpath = f"pure Python (the compiled one would not start: {err!r})"
            return None
        return path

    def retire(self) -> None:
        """Point every slot at scratch memory: later hot-path stores go nowhere."""
        for slot in self.slots:
            slot.w = self._scratch
        if self.cpath is not None:
            self.cpath.retire()  # lets go of the map, so that it can close
