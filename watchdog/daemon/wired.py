"""The node's wired memory as the loop sees it: sampled once a scan, and its baseline,
the node at rest (no live rank, no response under way), which wired memory must come
back to after a kill (the enforcer's settle; a leak flags the node for reboot)."""

from __future__ import annotations

import logging
import time

from watchdog.daemon.counters import Counters
from watchdog.daemon.probes import Probe, ProbeError

log = logging.getLogger(__name__)

# Seconds between two reads, at rest, of the wired memory live processes hold (every
# process's /proc status: ~2 ms for a hundred): the settle takes off only what they
# locked since (act/wired.py), never what they held at rest.
HELD_EVERY = 10.0


class Wired:
    """Wired bytes now and at rest (None: not known yet), through the probe."""

    def __init__(self, probe: Probe, counters: Counters) -> None:
        self.probe, self.counters = probe, counters
        self.now: int | None = None
        self.baseline: int | None = None
        self.held: int | None = None  # what live processes held at rest (None: not read)
        self.held_at = -HELD_EVERY

    def sample(self, at_rest: bool) -> None:
        """The wired bytes now; the baseline too when the node is `at_rest` (or none
        is known yet). A probe that fails is counted and logged, and changes nothing."""
        try:
            self.now = self.probe.wired_bytes()
        except ProbeError as err:
            self.counters.probe_failed()
            log.warning("wired memory probe failed: %s", err)
            return
        if self.now is not None and (self.baseline is None or at_rest):
            self.baseline = self.now  # the node at rest: what a kill must return to
            if at_rest and time.monotonic() - self.held_at >= HELD_EVERY:
                self.held_at = time.monotonic()
                try:
                    self.held = self.probe.held_wired_bytes()
                except (ProbeError, OSError) as err:
                    self.held = None
                    log.warning("reading the wired memory live processes hold failed: %s",
                                err)
