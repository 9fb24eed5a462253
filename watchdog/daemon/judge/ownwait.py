"""Pure: a rank in a wait of its own (a checkpoint's `save*`, a `load`, any wait with no
collective of its own outstanding), whether it holds the ranks of its job that wait for
it, and how that is told.

The ranks that wait in collective #N wait for the one that has not issued #N; while that
one is busy in a wait of its own within that wait's own deadline, or moving bytes (its
I/O counters), it is the job's pace, not a hang (docs/judging.md, "A rank in a wait
of its own"). Storage that never answers moves no byte: a `save*` or `load` quiet for
the stuck window (the `auto_floor`, 60 s at the defaults) holds nobody any more.
"""

from __future__ import annotations

from dataclasses import dataclass

SAVE_OPS = frozenset({"save", "savez", "savez_compressed", "save_safetensors", "save_gguf"})
IO_OPS = SAVE_OPS | {"load"}
# A save or load whose bytes keep moving holds its job this long at most (seconds of
# its wait): a 140 GB checkpoint at 50 MB/s takes 47 minutes. The bound is there because
# the counters are the whole process's: a logging thread's writes could otherwise keep a
# save stuck on a dead mount holding its job forever.
MAX_IO_HOLD = 3600.0


def size_text(count: int) -> str:
    """Bytes as a person reads them: 812 B, 40 kB, 1.1 MB, 140 GB."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 10 else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class OwnWait:
    """A rank's current wait, when it has no collective of its own outstanding."""

    op: str
    seconds: float  # in the wait
    deadline: float  # the wait's own deadline (learned per kind, expect, fixed)
    read: int | None = None  # bytes read since the wait began; None: no counters
    written: int | None = None  # bytes written since the wait began
    quiet: float | None = None  # seconds since the counters last moved; None: no counters
    # A thread of it spins over the wait (the shape of a wait on a peer): then it is not
    # busy with its own work, whatever its flight recorder says (collectives issued in
    # an `mx.compile`d function are counted once, at the trace, so counts can tie).
    spinning: bool = False
    window: float = 60.0  # the stuck window it is judged with (the auto_floor)

    def moving(self, window: float) -> bool:
        """A save or load whose bytes moved within the window: progress, however slow."""
        return (self.op in IO_OPS and self.quiet is not None and self.quiet < window
                and (self.read or 0) + (self.written or 0) > 0
                and self.seconds < MAX_IO_HOLD)

    def stuck(self, window: float) -> bool:
        """A save or load that moved no byte for the window: storage that does not answer."""
        return (self.op in IO_OPS and self.quiet is not None and self.quiet >= window
                and self.seconds >= window)

    def holds(self, window: float) -> str:
        """What it is doing, when it holds the ranks waiting for it; "" when it does not."""
        if self.moving(window):
            return self.describe()
        if self.spinning or self.stuck(window) or self.seconds >= self.deadline:
            return ""
        return self.describe()

    def holding(self) -> str:
        """`holds` by the window it was judged with: what a peer node is told."""
        return self.holds(self.window)

    def describe(self) -> str:
        """The wait in words, as a hold names it (`writing a checkpoint (...)`)."""
        seconds = f"{self.seconds:.0f} s"
        if self.op in SAVE_OPS:
            return (f"writing a checkpoint ({self.op}, {seconds}, "
                    f"{size_text(self.written or 0)} written)")
        if self.op == "load":
            return f"loading ({self.op}, {seconds}, {size_text(self.read or 0)} read)"
        return (f"in a wait of its own ({self.op or 'a wait'}, {seconds}, within its "
                f"{self.deadline:g} s deadline)")
