"""The enforcer's means, which the ladder's steps act through: its settings read at use,
the signals (teardown.py), the journal's writes, the evidence and its workers, the
wired-memory probe. The steps themselves are steps.py's; the one place a ladder's step
is set is enforcer.py's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor

from watchdog.daemon.act.evidence import Evidence
from watchdog.daemon.act.ladder import Ladder
from watchdog.daemon.act.teardown import Teardown
from watchdog.daemon.act.workers import FairWork
from watchdog.daemon.act.writes import Writes
from watchdog.daemon.config import LadderSettings, Live, Settings, live
from watchdog.daemon.probes import Probe, ProbeError
from watchdog.daemon.signaller import Signaller, Target

log = logging.getLogger(__name__)


class Acting:
    """The enforcer's means (enforcer.py's `Enforcer` is this with its steps)."""

    def __init__(self, settings: Settings | Live, signaller: Signaller, probe: Probe, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time,
                 executor: FairWork | Executor | None = None) -> None:
        self.live = live(settings)
        self.signaller, self.probe = signaller, probe
        self.clock, self.sleep, self.wall = clock, sleep, wall
        # Where evidence is gathered and parsed; without one (tests), at once.
        self.executor = executor
        self.evidence = Evidence(self.settings.state_dir, self.settings.evidence_timeout, signaller,
                                 probe, clock=clock, sleep=sleep, wall=wall)
        self.teardown = Teardown(signaller, probe, wall)
        self.writes = Writes(lambda: self.settings.state_dir, wall)
        self.backlog = self.writes.backlog  # what a failed write held back (loop, status)

    @property
    def settings(self) -> LadderSettings:
        """Read at use: a reload reaches a response under way."""
        return self.live.ladder

    def capture(self, incident_id: str, targets: list[Target],
                frozen: frozenset[int] = frozenset(), until: float | None = None
                ) -> list[str]:
        """Stack dumps of every target (`frozen`: pids the ladder froze), time-boxed
        (by `until` too, monotonic, when given: a fence's window); their files."""
        return self.evidence.capture(incident_id, targets, frozen, until)

    def write_ahead(self, ladder: Ladder) -> None:
        """The response so far, on disk before its next step (writes.py)."""
        self.writes.write_ahead(ladder)

    def replay_within(self) -> float:
        """Seconds after its verdict an interrupted response is still completed at
        start: every step's bound, as for a response presumed stuck."""
        return self.settings.response_bound()

    def wired(self) -> int | None:
        """The node's wired memory now; None when the probe fails (logged)."""
        try:
            return self.probe.wired_bytes()
        except ProbeError as err:
            log.warning("wired memory probe failed: %s", err)
            return None

    def held_wired(self, leaver: int | None = None) -> int | None:
        """The wired memory live processes hold (not what `leaver`'s ended ranks left
        behind); None when it cannot be read (logged)."""
        try:
            return self.probe.held_wired_bytes(leaver)
        except (ProbeError, OSError) as err:
            log.warning("reading the wired memory live processes hold failed: %s", err)
            return None
