"""The daemon's one clock: monotonic time for every deadline and bound, wall time only
for labels and timestamps, and the sleep that goes with them. Passed in, so tests move
time themselves (tests/support/fakes.py's FakeClock)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """The daemon's one seam for time: monotonic and wall clocks and sleep, replaced
    together by tests."""
    monotonic_ns: Callable[[], int] = time.monotonic_ns
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

    def monotonic(self) -> float:
        """Monotonic seconds (`monotonic_ns` in seconds: one source of now)."""
        return self.monotonic_ns() / 1e9
