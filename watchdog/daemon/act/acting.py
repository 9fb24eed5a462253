"""What the ladder's steps share: the enforcer's wiring (its settings read at use, the
signals, the journal's writes, the evidence and its workers) and the moves more than one
step makes (the round of signals, each target's outcome, the settle, the close). The
steps themselves, and the one place a ladder's step is set, are enforcer.py's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace

from watchdog.daemon.act.evidence import Evidence
from watchdog.daemon.act.ladder import EVIDENCE_SLACK, Ladder, Outcome, Step
from watchdog.daemon.act.teardown import Teardown
from watchdog.daemon.act.wired import settled
from watchdog.daemon.act.workers import FairWork, run_for
from watchdog.daemon.act.writes import Writes
from watchdog.daemon.config import LadderSettings, Live, Settings, live
from watchdog.daemon.probes import Probe, ProbeError
from watchdog.daemon.signaller import Result, Signaller, Target
from watchdog.states import End
from watchdog.status import Incident, RebootReason

log = logging.getLogger(__name__)


class Acting:
    """The enforcer's means and the moves its steps share (enforcer.py's `Enforcer`
    is this with its steps)."""

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

    # -- what the handlers share -------------------------------------------------------

    def _signals(self, ladder: Ladder, targets: list[Target]) -> Step:
        """The first round: SIGTERM and SIGCONT to every target, back to back (TERM),
        but to those leaving on their own error (LEAVING, first)."""
        ladder.sent = list(ladder.incident.signals or ())
        # Journaled before the first signal of each round, not before each signal:
        # a write (an fsync) between two ranks' signals would let one see its peer
        # die. A target gone after the ladder began was ended by it (resume.py).
        ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent), ladder="begun")
        self.write_ahead(ladder)
        if self.teardown.leaving(ladder, targets):
            ladder.until = self.clock() + self.settings.grace
            return Step.LEAVING
        return self._term(ladder, targets)

    def _term(self, ladder: Ladder, targets: list[Target]) -> Step:
        """SIGTERM then SIGCONT (teardown.py), and the grace."""
        self.teardown.term(ladder, targets)
        ladder.until = self.clock() + self.settings.grace
        return Step.TERM

    def _ended(self, ladder: Ladder) -> Step:
        """The signals are done: each target's outcome, then the evidence's parse
        (FRAMES; a resumed one has none to parse: its settle or its close)."""
        # "unkillable" (and the reboot flag) only on a positive match: a
        # process that could not be probed is "unknown", never a false alarm.
        survivors = {t.pid for t in ladder.left if self.signaller.identify(t) == Result.OURS}
        # A rank found leaving on its own error *before* the ladder was left alone above.
        # One that reached its error exit while the ladder ran is still the ladder's: its
        # peers' signals caused that error, and SIGTERM often ends it mid-exit (it then
        # dies of the signal), so which came first cannot be told apart reliably.
        for target in ladder.live:
            ladder.outcome.setdefault(
                target.pid, End.KILLED if target not in ladder.left else
                End.UNKILLABLE if target.pid in survivors else End.UNKNOWN)
        ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent))
        if ladder.resumed:
            return self._decided(ladder)
        ladder.incident = replace(ladder.incident, outcome={
            str(pid): result for pid, result in ladder.outcome.items()})
        # Parsed after the kill, which must not wait on it.
        ladder.until = self.clock() + self.settings.evidence_timeout + EVIDENCE_SLACK
        ladder.work = run_for(self.executor, ladder.incident.uid or 0,
                              self.evidence.hot_frames, ladder.incident.id, ladder.targets,
                              list(ladder.incident.evidence or ()))
        return Step.FRAMES

    def _unfinished(self, ladder: Ladder, why: str) -> Step:
        """Any step, given up on (`close_unfinished`): closed with what is known."""
        if ladder.work is not None:
            ladder.work.cancel()
        self.teardown.thaw(ladder, f"its response is closed unfinished ({why})")
        for target in ladder.targets:
            ladder.outcome.setdefault(target.pid, End.UNKNOWN)
        ladder.incident = replace(
            ladder.incident, signals=tuple(ladder.sent) or ladder.incident.signals,
            evidence_error=ladder.incident.evidence_error or why,
            outcome={str(pid): result for pid, result in ladder.outcome.items()})
        log.error("incident %s closed unfinished (%s) at step %r", ladder.incident.id, why,
                  ladder.step.value)
        return self._close(ladder, None)

    def _decided(self, ladder: Ladder) -> Step:
        """A resumed response's outcome: settled only if it ended something."""
        ladder.incident = replace(ladder.incident, outcome={
            str(pid): result for pid, result in ladder.outcome.items()})
        if any(r in (End.KILLED, End.UNKILLABLE) for r in ladder.outcome.values()):
            return self._settle(ladder)
        return self._close(ladder, None)

    def _settle(self, ladder: Ladder) -> Step:
        """SETTLE: wired memory gets its time to come back; without a baseline to
        judge it by, the close at once."""
        if ladder.baseline is None:
            return self._settled(ladder, None)
        ladder.until = self.clock() + self.settings.settle
        ladder.next_probe = 0.0
        return Step.SETTLE

    def _wired(self) -> int | None:
        try:
            return self.probe.wired_bytes()
        except ProbeError as err:
            log.warning("wired memory probe failed: %s", err)
            return None

    def _settled(self, ladder: Ladder, wired: int | None) -> Step:
        """The settle's verdict, the reboot flag it calls for (wired.py), and the close."""
        ladder.incident, flag = settled(
            ladder.incident, ladder.baseline, wired, ladder.outcome,
            threshold=self.settings.wired_threshold, kill_timeout=self.settings.kill_timeout,
            others_live=ladder.others_live, wall=self.wall(), held=self._held)
        return self._close(ladder, flag)

    def _held(self) -> int | None:
        try:
            return self.probe.held_wired_bytes()
        except (ProbeError, OSError) as err:
            log.warning("reading the wired memory live processes hold failed: %s", err)
            return None

    def _close(self, ladder: Ladder, flag: RebootReason | None) -> Step:
        """Journal the incident closed, then its line and the flag (writes.py). DONE."""
        ladder.incident = self.writes.closed(ladder)
        self.write_ahead(ladder)
        self.writes.close(ladder.incident, flag)
        ladder.work = None
        ladder.result = Outcome(ladder.incident, dict(ladder.outcome), _sent(ladder.incident))
        return Step.DONE



def _sent(incident: Incident) -> tuple[str, ...]:
    """The names of the signals that reached a rank."""
    return tuple(s.signal for s in incident.signals or () if s.result == Result.SENT and s.signal)
