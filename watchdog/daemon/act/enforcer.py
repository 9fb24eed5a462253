"""The escalation ladder: SIGSTOP, evidence, SIGTERM with SIGCONT, grace, SIGKILL, confirm.

A response is a `Ladder` (ladder.py): `begin` (a verdict) or `resume` (an earlier
daemon's unfinished one) makes it, and `step` takes every step that is due, whenever the
daemon's loop calls it; no thread sleeps through a grace. The evidence and the parse of
the native dumps run on a worker (`FairWork`, workers.py: one capture in flight per uid;
without one, at once), and neither is waited for past its time box: the evidence's
counts from the verdict, so work queued behind another user's hung captures never
delays the signals.

Each step has one handler on `Enforcer` (`Enforcer.HANDLERS`): once the step is due it
does what the step does and returns the step the ladder goes to (None while it waits:
on a worker, a grace, a timeout, the settle). `Enforcer.advance` takes it, only along
an edge of `ladder.EDGES`, and is the one place a ladder's step is set.

The rooms beside it: what the steps share, and the enforcer's means (acting.py); the
signals and their order (teardown.py); what a restarted daemon makes of a journal's
entry (resume.py, pure); the settle's verdict and the reboot flag (wired.py, pure); the
journal's writes (writes.py); the evidence (evidence.py). Tests pass a fake signaller
and a fake clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

from watchdog.daemon.act import resume as resuming
from watchdog.daemon.act.acting import Acting
from watchdog.daemon.act.exo import peer_delay
from watchdog.daemon.act.ladder import EVIDENCE_SLACK, Ladder, Outcome, Step, may_go
from watchdog.daemon.act.teardown import progressed
from watchdog.daemon.act.wired import over
from watchdog.daemon.act.workers import run_for
from watchdog.daemon.signaller import Result, Target
from watchdog.daemon.store import pending
from watchdog.states import End, Mode
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
              term_at: float | None = None, evidence_by: float | None = None) -> Ladder:
        """A response to one hung job: journaled, its evidence under way (or, in
        observe mode, closed at once). `cluster` is the peers' view when they were
        asked (`asked`); `evidence=False` skips stack dumps (a local death's orphans,
        ended at once: a fence's are taken within its window). `verdict_at` (monotonic, by this
        enforcer's clock; default now) starts the evidence's time box. Every target is
        frozen first; `term_at` (monotonic) holds the SIGTERMs until then (the moment a
        fence told the peers to end theirs), never past the evidence's time box;
        `evidence_by` (monotonic) ends the evidence sooner (a fence's window: a fenced
        node takes what it can of its frozen ranks before the moment its fence names)."""
        incident = replace(incident, signals=(), wired_before=self._wired(),
                           wired_baseline=baseline)
        if asked:
            incident = replace(incident, cluster=cluster)
        ladder = Ladder(incident, list(targets), baseline, others_live, gather=evidence,
                        verdict_at=verdict_at, term_at=0.0 if term_at is None else term_at,
                        evidence_by=evidence_by)
        self.step(ladder)
        return ladder

    def resume(self, entry: pending.Entry, others_live: Callable[[], bool]) -> Ladder:
        """At start: a response an earlier daemon journaled and never closed, to finish
        (its `RESUME` step, taken at once; resume.py says what it infers from the
        entry, step by step)."""
        ladder = Ladder(entry.incident, list(entry.targets), entry.baseline, others_live,
                        step=Step.RESUME, resumed=True)
        self.advance(ladder)
        return ladder

    def close_unfinished(self, ladder: Ladder, why: str) -> Outcome:
        """A ladder its loop gives up waiting on: closed and journaled with what is
        known (the signals sent so far, each target's outcome or "unknown"), never
        dropped: a begun ladder may have signalled, and every kill is journaled."""
        self.advance(ladder, unfinished=why)
        assert ladder.result is not None
        return ladder.result

    # -- the ladder, step by step (ladder.EDGES) ---------------------------------------

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
            after: Step | None = self._unfinished(ladder, unfinished)
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

    def _step_begin(self, ladder: Ladder, now: float) -> Step:
        """Observe mode signals nothing, not even the stack-dump signal, and does not
        ptrace: the thread CPU and flight recorder are the evidence."""
        if self.settings.mode == Mode.OBSERVE:
            ladder.incident = replace(ladder.incident, evidence=(), outcome={},
                                      action="observed (mode observe: nothing signalled)")
            return self._close(ladder, None)
        incident = ladder.incident = replace(ladder.incident, action="ending")
        self.write_ahead(ladder)  # the verdict, before the first signal (the freeze)
        said = self.teardown.freeze(ladder)
        ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent), freeze=said)
        if ladder.sent:
            self.write_ahead(ladder)
        by = ladder.evidence_by  # a fence's window: the capture ends before it
        ladder.work = run_for(self.executor, incident.uid or 0, self.capture, incident.id,
                              list(ladder.targets), frozenset(t.pid for t in ladder.frozen),
                              None if by is None else by - EVIDENCE_SLACK / 2
                              ) if ladder.gather else None
        # Read after the freeze and the capture's hand-over (at once without a worker).
        ladder.until = (self.clock() if ladder.verdict_at is None else ladder.verdict_at) \
            + self.settings.evidence_timeout + EVIDENCE_SLACK
        if by is not None:
            ladder.until = min(ladder.until, by)
        # Never past the time box; a fenced exo job's by exo's stagger more (act/exo.py).
        ladder.term_at = min(ladder.term_at, ladder.until + peer_delay(incident.job or ""))
        return Step.EVIDENCE

    def _step_resume(self, ladder: Ladder, now: float) -> Step:
        """An earlier daemon's entry, acted on as resume.py's plan says."""
        incident, targets = ladder.incident, ladder.targets
        # A closed one's targets are not looked at: its writes alone are left.
        identities = {} if incident.closed_at is not None else {
            t.pid: self.signaller.identify(t) for t in targets}
        plan = resuming.plan(
            incident, targets, identities, fresh=self.wall() - incident.time < self.replay_within(),
            enforce=self.settings.mode == Mode.ENFORCE,
            progressed={t.pid for t in targets
                        if identities.get(t.pid) == Result.OURS and progressed(incident, t)})
        if plan.closed:  # all done but the journal line, or the flag
            self.writes.reclose(incident, ladder.baseline)
            ladder.result = Outcome(incident, {}, ())
            return Step.DONE
        log.warning("completing incident %s of job %s left unfinished by an earlier daemon",
                    incident.id, incident.job)
        ladder.incident = replace(incident, signals=incident.signals or (),
                                  completed_at_start=self.wall())
        ladder.outcome.update(plan.outcomes)
        ladder.sent = list(ladder.incident.signals or ())
        if plan.stale:
            ladder.frozen = list(plan.stale)
            self.teardown.thaw(ladder, "an earlier daemon froze it, and its verdict is not "
                                       "acted on")
            ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent))
        ladder.frozen = list(plan.frozen)
        if plan.live:  # from HOLD's round: a dead daemon's evidence time box is long past
            ladder.incident = replace(ladder.incident, action="ended")
            return self._signals(ladder, list(plan.live))
        return self._decided(ladder)  # nothing to end: as a resumed KILL ends

    def _step_evidence(self, ladder: Ladder, now: float) -> Step | None:
        """The stack dumps in, or their time box over: HOLD either way."""
        if ladder.working and now < ladder.until:
            return None
        files: tuple[str, ...] = ()
        if ladder.working:  # queued behind others, or a capture past its own bound
            assert ladder.work is not None
            ladder.work.cancel()  # never run if still queued
            why = (f"not gathered within {self.settings.evidence_timeout + EVIDENCE_SLACK:g}s"
                   " of the verdict")
            log.warning("evidence for incident %s %s; acting without it",
                        ladder.incident.id, why)
            ladder.incident = replace(ladder.incident, evidence_error=why)
        elif ladder.work is not None:
            try:
                files = tuple(ladder.work.result())
            except Exception as err:  # noqa: BLE001 - evidence is never worth a missed kill
                log.error("gathering evidence for incident %s failed: %s",
                          ladder.incident.id, err)
                ladder.incident = replace(ladder.incident, evidence_error=str(err))
        ladder.work = None
        ladder.incident = replace(ladder.incident, evidence=files, action="ended")
        return Step.HOLD

    def _step_hold(self, ladder: Ladder, now: float) -> Step | None:
        """Frozen until the moment the peers were told to end theirs: then the round."""
        if now < ladder.term_at:
            return None
        return self._signals(ladder, ladder.targets)

    def _step_leaving(self, ladder: Ladder, now: float) -> Step | None:
        """Those leaving on their own error gone, or the grace over: the rest's round."""
        ladder.left = [t for t in ladder.left if self.teardown.not_gone(t)]
        if ladder.left and now < ladder.until:
            return None
        for target in ladder.ending:
            if target not in ladder.left:
                ladder.outcome[target.pid] = End.EXITED
                log.info("pid %s (job %s rank %s) ended on its own error; not signalled",
                         target.pid, target.job, target.rank)
        return self._term(ladder, [t for t in ladder.live if t.pid not in ladder.outcome])

    def _step_term(self, ladder: Ladder, now: float) -> Step | None:
        """Every target gone, or the grace over: SIGKILL to those still there."""
        ladder.left = [t for t in ladder.left if self.teardown.not_gone(t)]
        if ladder.left and now < ladder.until:
            return None
        if ladder.left:  # SIGCONT and SIGTERM as sent, before the SIGKILLs
            ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent))
            self.write_ahead(ladder)
            self.teardown.kill(ladder)
        ladder.until = self.clock() + self.settings.kill_timeout
        return Step.KILL

    def _step_kill(self, ladder: Ladder, now: float) -> Step | None:
        """Every target gone, or the kill timeout over: each target's outcome."""
        ladder.left = [t for t in ladder.left if self.teardown.not_gone(t)]
        if ladder.left and now < ladder.until:
            return None
        return self._ended(ladder)

    def _step_frames(self, ladder: Ladder, now: float) -> Step | None:
        """The native dumps parsed, or their time box over: the outcome journaled, then
        the settle."""
        if ladder.working and now < ladder.until:
            return None
        assert ladder.work is not None
        hot: list[Any] = []
        if ladder.working:  # a parse queued behind others: the incident goes without
            ladder.work.cancel()
            log.warning("the native dumps of incident %s were not read within %.0fs; "
                        "closing it without their hot frames", ladder.incident.id,
                        self.settings.evidence_timeout)
        else:
            try:
                hot = ladder.work.result()
            except Exception as err:  # noqa: BLE001 - a parse never undoes a kill
                log.error("reading the native dumps of incident %s failed: %s",
                          ladder.incident.id, err)
        ladder.work = None
        if hot:
            ladder.incident = replace(ladder.incident, native_hot=tuple(hot))
        self.write_ahead(ladder)  # the outcome, before the settle (up to minutes)
        return self._settle(ladder)

    def _step_settle(self, ladder: Ladder, now: float) -> Step | None:
        """Wired memory back, or the settle time over: the close."""
        if now < ladder.next_probe:
            return None
        wired = self._wired()
        if over(ladder.baseline, wired, self.settings.wired_threshold) and now < ladder.until:
            ladder.next_probe = now + 0.25
            return None
        return self._settled(ladder, wired)

    # Each step's handler. DONE has none (nothing follows it).
    HANDLERS: ClassVar[dict[Step, Callable[[Enforcer, Ladder, float], Step | None]]] = {
        Step.BEGIN: _step_begin,
        Step.RESUME: _step_resume,
        Step.EVIDENCE: _step_evidence,
        Step.HOLD: _step_hold,
        Step.LEAVING: _step_leaving,
        Step.TERM: _step_term,
        Step.KILL: _step_kill,
        Step.FRAMES: _step_frames,
        Step.SETTLE: _step_settle,
    }

