"""The escalation ladder: SIGSTOP, evidence, SIGTERM with SIGCONT, grace, SIGKILL, confirm.

A response is a `Ladder` (ladder.py): `begin` (a verdict) or `resume` (an earlier
daemon's unfinished one) makes it, and `step` takes every step that is due, whenever the
daemon's loop calls it; no thread sleeps through a grace. The evidence and the parse of
the native dumps run on a worker (`FairWork`, workers.py: one capture in flight per uid;
without one, at once), and neither is waited for past its time box: the evidence's
counts from the verdict, so work queued behind another user's hung captures never
delays the signals.

A step is read in one place: ladder.py's `STEPS` says what each waits for, the
signals it sends and where it goes; steps.py has its handler (`Enforcer.HANDLERS`), in
the same order: once the step is due it does what the step does and returns the step
the ladder goes to (None while it waits). `Enforcer.advance` takes it, only along an
edge of the table, and is the one place a ladder's step is set.

The rooms beside it: the enforcer's means (acting.py); the signals and their order
(teardown.py); what a restarted daemon makes of a journal's entry (resume.py, pure);
the settle's verdict and the reboot flag (wired.py, pure); the journal's writes
(writes.py); the evidence (evidence.py). Tests pass a fake signaller and a fake clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar

from watchdog.daemon.act import steps
from watchdog.daemon.act.acting import Acting
from watchdog.daemon.act.ladder import EVIDENCE_SLACK, Asked, Ladder, Outcome, Step, may_go
from watchdog.daemon.signaller import Target
from watchdog.daemon.store import pending
from watchdog.status import Incident, PeerView

log = logging.getLogger(__name__)

__all__ = ["EVIDENCE_SLACK", "Enforcer", "Ladder", "Outcome", "Step"]


class Enforcer(Acting):
    """Steps one response's escalation ladder (freeze, evidence, SIGTERM with SIGCONT,
    grace, SIGKILL, confirm, wired settle) along its edge table, each step
    journalled before the next; resumes a ladder a restarted daemon left mid-way."""

    TICK = 0.05  # seconds between a ladder's steps: the loop's wait while one is under way

    # -- starting a response -------------------------------------------------------

    def begin(self, incident: Incident, targets: list[Target], baseline: int | None = None,
              others_live: Callable[[], bool] = lambda: False,
              cluster: PeerView | None = None, evidence: bool = True,
              asked: bool = False, verdict_at: float | None = None,
              term_at: float | None = None, evidence_by: float | None = None,
              held_before: int | None = None) -> Ladder:
        """A response to one hung job: journaled, its evidence under way (or, in
        observe mode, closed at once). `cluster` is the peers' view when they were
        asked (`asked`); `evidence=False` skips stack dumps (a local death's orphans,
        ended at once: a fence's are taken within its window). `verdict_at` (monotonic, by this
        enforcer's clock; default now) starts the evidence's time box. Every target is
        frozen first; `term_at` (monotonic) holds the SIGTERMs until then (the moment a
        fence told the peers to end theirs), never past the evidence's time box;
        `evidence_by` (monotonic) ends the evidence sooner (a fence's window: a fenced
        node takes what it can of its frozen ranks before the moment its fence names).
        `held_before`: the wired memory live processes held with the node at rest, when
        `baseline` was (the settle takes off only what they locked since)."""
        incident = replace(incident, signals=(), wired_before=self.wired(),
                           wired_baseline=baseline)
        if asked:
            incident = replace(incident, cluster=cluster)
        ladder = Ladder(incident, list(targets), baseline, others_live,
                        term_at=0.0 if term_at is None else term_at,
                        asked=Asked(evidence, verdict_at, evidence_by),
                        held_before=held_before)
        self.step(ladder)
        return ladder

    def resume(self, entry: pending.Entry, others_live: Callable[[], bool]) -> Ladder:
        """At start: a response an earlier daemon journaled and never closed, to finish
        (its `RESUME` step, taken at once; resume.py says what it infers from the
        entry, step by step)."""
        ladder = Ladder(entry.incident, list(entry.targets), entry.baseline, others_live,
                        step=Step.RESUME, resumed=True, held_before=entry.held)
        self.advance(ladder)
        return ladder

    def close_unfinished(self, ladder: Ladder, why: str) -> Outcome:
        """A ladder its loop gives up waiting on: closed and journaled with what is
        known (the signals sent so far, each target's outcome or "unknown"), never
        dropped: a begun ladder may have signalled, and every kill is journaled."""
        self.advance(ladder, unfinished=why)
        assert ladder.result is not None
        return ladder.result

    # -- the ladder, step by step (ladder.STEPS) ---------------------------------------

    def step(self, ladder: Ladder) -> Outcome | None:
        """Take every step of the ladder that is due now; its outcome once done."""
        while ladder.step is not Step.DONE:
            if not self.advance(ladder):
                return None  # waiting: on a worker, a grace, a timeout or the settle
        return ladder.result

    def advance(self, ladder: Ladder, unfinished: str = "") -> bool:
        """Take the ladder's step if it is due; whether it was. The one place a
        ladder's step is set: the step's handler (`HANDLERS`) returns the step it goes
        to, or None while it waits. `unfinished` (why) is the edge from any step: its
        loop gives up waiting on it (`close_unfinished`). An edge not in the table
        raises (a bug: the response is then closed unfinished)."""
        if unfinished:
            after: Step | None = steps.give_up(self, ladder, unfinished)
        elif ladder.step is Step.DONE:
            return False
        else:
            after = self.HANDLERS[ladder.step](self, ladder, self.clock())
        if after is None:
            return False
        if not may_go(ladder.step, after, bool(unfinished)):
            raise RuntimeError(f"incident {ladder.incident.id}: no edge from "
                               f"{ladder.step.name} to {after.name} in the ladder's table")
        ladder.step = after
        return True

    # Each step's handler (steps.py, in ladder.STEPS's order). DONE has none.
    HANDLERS: ClassVar[dict[Step, Callable[[Enforcer, Ladder, float], Step | None]]] = {
        **steps.HANDLERS}
