"""Records written whole, for tests and benchmarks: a state published as one thread's
(slot 0), a pace entry, a collective of the flight recorder.

`SyntheticWriter` is the real `RecordWriter` (the same file, identity, seqlock and
close) with the writes a rank's hot path never makes: a test states what a rank
is doing in one call instead of running MLX.
"""

from __future__ import annotations

from watchdog.record import RecordWriter
from watchdog.record.layout import (
    KIND_SHIFT,
    OP_CODE,
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
    SLOTS_OFFSET,
    W_CREATED,
)
from watchdog.states import Phase


class SyntheticWriter(RecordWriter):
    """A record whose slot 0 a test writes whole, between `begin()` and `end()`."""

    def write_hot(self, collectives: int, entered: int, completed: int, steps: int,
                  phase: int, op: int, phase_since: int, wait_since: int, last_progress: int,
                  last_wait: int, max_wait: int) -> None:
        """Publish a whole state as one thread's (slot 0), between begin and end.

        For synthetic records: the rank's hot path never calls this. The phase
        is what a reader derives: idle (since `phase_since`), a wait or init
        (since `wait_since`, which a wait phase needs), or running.
        """
        w = self.words
        s = SLOTS_OFFSET // 8
        waiting = phase in (Phase.WAIT, Phase.INIT) and wait_since
        w[s + S_SINCE] = wait_since if waiting else 0
        w[s + S_OP] = OP_CODE["init"] if phase == Phase.INIT and waiting else op
        w[s + S_COMPLETED], w[s + S_STEPS] = completed, steps
        w[s + S_PROGRESS], w[s + S_LAST_WAIT], w[s + S_MAX_WAIT] = (last_progress, last_wait,
                                                                    max_wait)
        w[s + S_COLLECTIVES] = collectives
        w[W_CREATED] = 0
        self.write_idle(phase_since if phase == Phase.IDLE else 0,
                        phase_since if phase == Phase.RUNNING else 0)

    def write_pace(self, op: int, count: int, longest_ns: int) -> None:
        """Slot 0's pace entry of `op`: `count` completed waits, the longest `longest_ns`."""
        i = SLOTS_OFFSET // 8 + S_PACE + 2 * op
        self.words[i], self.words[i + 1] = count, longest_ns

    def write_entry(self, number: int, issued_ns: int, nbytes: int, op: int, dtype: int) -> None:
        """Collective `number` of slot 0 (it counts once `write_hot` says so)."""
        i = SLOTS_OFFSET // 8 + S_RING + 2 * (number % RING)
        self.words[i] = issued_ns
        self.words[i + 1] = nbytes << KIND_SHIFT | dtype << 8 | op
