"""The ladder's steps, one handler each, in the order of ladder.py's `STEPS` (what each
waits for, the signals it sends, where it goes): once its step is due a handler does
what the step does and returns the step the ladder goes to (None while it waits: on a
worker, a grace, a timeout, the settle), which `Enforcer.advance` takes only along an
edge of the table. Below them, the moves more than one step ends with (the round of
signals, each target's outcome, the settle, the close), each returning its edge.

The handlers act through the enforcer's means (acting.py: its settings read at use, the
signals of teardown.py, the journal's writes, the evidence and its workers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from watchdog.daemon.act import resume as resuming
from watchdog.daemon.act.acting import Acting
from watchdog.daemon.act.exo import peer_delay
from watchdog.daemon.act.ladder import EVIDENCE_SLACK, Ladder, Outcome, Step
from watchdog.daemon.act.teardown import progressed
from watchdog.daemon.act.wired import held_since, over, settled
from watchdog.daemon.act.workers import run_for
from watchdog.daemon.signaller import Result, Target
from watchdog.states import End, Mode
from watchdog.status import Incident, RebootReason

log = logging.getLogger(__name__)


# -- each step's handler (ladder.STEPS) ---------------------------------------------------

def _step_begin(enf: Acting, ladder: Ladder, now: float) -> Step:
    """Observe mode signals nothing, not even the stack-dump signal, and does not
    ptrace: the thread CPU and flight recorder are the evidence."""
    if enf.settings.mode == Mode.OBSERVE:
        ladder.incident = replace(ladder.incident, evidence=(), outcome={},
                                  action="observed (mode observe: nothing signalled)")
        return _close(enf, ladder, None)
    incident = ladder.incident = replace(ladder.incident, action="ending")
    enf.write_ahead(ladder)  # the verdict, before the first signal (the freeze)
    said = enf.teardown.freeze(ladder)
    ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent), freeze=said)
    if ladder.sent:
        enf.write_ahead(ladder)
    by = ladder.asked.evidence_by  # a fence's window: the capture ends before it
    ladder.work = run_for(enf.executor, incident.uid or 0, enf.capture, incident.id,
                          list(ladder.targets), frozenset(t.pid for t in ladder.round.frozen),
                          None if by is None else by - EVIDENCE_SLACK / 2
                          ) if ladder.asked.gather else None
    # Read after the freeze and the capture's hand-over (at once without a worker).
    ladder.until = (enf.clock() if ladder.asked.verdict_at is None else ladder.asked.verdict_at) \
        + enf.settings.evidence_timeout + EVIDENCE_SLACK
    if by is not None:
        ladder.until = min(ladder.until, by)
    # Never past the time box; a fenced exo job's by exo's stagger more (act/exo.py).
    ladder.term_at = min(ladder.term_at, ladder.until + peer_delay(incident.job or ""))
    return Step.EVIDENCE


def _step_resume(enf: Acting, ladder: Ladder, now: float) -> Step:
    """An earlier daemon's entry, acted on as resume.py's plan says."""
    incident, targets = ladder.incident, ladder.targets
    # A closed one's targets are not looked at: its writes alone are left.
    identities = {} if incident.closed_at is not None else {
        t.pid: enf.signaller.identify(t) for t in targets}
    plan = resuming.plan(
        incident, targets, identities, fresh=enf.wall() - incident.time < enf.replay_within(),
        enforce=enf.settings.mode == Mode.ENFORCE,
        progressed={t.pid for t in targets
                    if identities.get(t.pid) == Result.OURS and progressed(incident, t)})
    if plan.closed:  # all done but the journal line, or the flag
        enf.writes.reclose(incident, ladder.baseline)
        ladder.result = Outcome(incident, {}, ())
        return Step.DONE
    log.warning("completing incident %s of job %s left unfinished by an earlier daemon",
                incident.id, incident.job)
    ladder.incident = replace(incident, signals=incident.signals or (),
                              completed_at_start=enf.wall())
    ladder.outcome.update(plan.outcomes)
    ladder.sent = list(ladder.incident.signals or ())
    enf.teardown.resumed(ladder, list(plan.stale), list(plan.frozen))
    if plan.stale:
        ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent))
    if plan.live:  # from HOLD's round: a dead daemon's evidence time box is long past
        ladder.incident = replace(ladder.incident, action="ended")
        return _signals(enf, ladder, list(plan.live))
    return _decided(enf, ladder)  # nothing to end: as a resumed KILL ends


def _step_evidence(enf: Acting, ladder: Ladder, now: float) -> Step | None:
    """The stack dumps in, or their time box over: HOLD either way."""
    if ladder.working and now < ladder.until:
        return None
    files: tuple[str, ...] = ()
    if ladder.working:  # queued behind others, or a capture past its own bound
        assert ladder.work is not None
        ladder.work.cancel()  # never run if still queued
        why = (f"not gathered within {enf.settings.evidence_timeout + EVIDENCE_SLACK:g}s"
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


def _step_hold(enf: Acting, ladder: Ladder, now: float) -> Step | None:
    """Frozen until the moment the peers were told to end theirs: then the round."""
    if now < ladder.term_at:
        return None
    return _signals(enf, ladder, ladder.targets)


def _step_leaving(enf: Acting, ladder: Ladder, now: float) -> Step | None:
    """Those leaving on their own error gone, or the grace over: the rest's round."""
    if enf.teardown.still_there(ladder) and now < ladder.until:
        return None
    for target in ladder.round.ending:
        if target not in ladder.round.left:
            ladder.outcome[target.pid] = End.EXITED
            log.info("pid %s (job %s rank %s) ended on its own error; not signalled",
                     target.pid, target.job, target.rank)
    return _term(enf, ladder, [t for t in ladder.round.live if t.pid not in ladder.outcome])


def _step_term(enf: Acting, ladder: Ladder, now: float) -> Step | None:
    """Every target gone, or the grace over: SIGKILL to those still there."""
    if enf.teardown.still_there(ladder) and now < ladder.until:
        return None
    if ladder.round.left:  # SIGCONT and SIGTERM as sent, before the SIGKILLs
        ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent))
        enf.write_ahead(ladder)
        enf.teardown.kill(ladder)
    ladder.until = enf.clock() + enf.settings.kill_timeout
    return Step.KILL


def _step_kill(enf: Acting, ladder: Ladder, now: float) -> Step | None:
    """Every target gone, or the kill timeout over: each target's outcome."""
    if enf.teardown.still_there(ladder) and now < ladder.until:
        return None
    return _ended(enf, ladder)


def _step_frames(enf: Acting, ladder: Ladder, now: float) -> Step | None:
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
                    enf.settings.evidence_timeout)
    else:
        try:
            hot = ladder.work.result()
        except Exception as err:  # noqa: BLE001 - a parse never undoes a kill
            log.error("reading the native dumps of incident %s failed: %s",
                      ladder.incident.id, err)
    ladder.work = None
    if hot:
        ladder.incident = replace(ladder.incident, native_hot=tuple(hot))
    enf.write_ahead(ladder)  # the outcome, before the settle (up to minutes)
    return _settle(enf, ladder)


def _step_settle(enf: Acting, ladder: Ladder, now: float) -> Step | None:
    """Wired memory back, or the settle time over: the close."""
    if now < ladder.next_probe:
        return None
    wired = enf.wired()
    if over(ladder.baseline, wired, enf.settings.wired_threshold) and now < ladder.until:
        ladder.next_probe = now + 0.25
        return None
    return _settled(enf, ladder, wired)


# Each step's handler. DONE has none (nothing follows it).
HANDLERS: dict[Step, Callable[[Acting, Ladder, float], Step | None]] = {
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


# -- the moves more than one step ends with, each returning its edge ----------------------

def _signals(enf: Acting, ladder: Ladder, targets: list[Target]) -> Step:
    """The first round: SIGTERM and SIGCONT to every target, back to back (TERM),
    but to those leaving on their own error (LEAVING, first)."""
    ladder.sent = list(ladder.incident.signals or ())
    # Journaled before the first signal of each round, not before each signal:
    # a write (an fsync) between two ranks' signals would let one see its peer
    # die. A target gone after the ladder began was ended by it (resume.py).
    ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent), ladder="begun")
    enf.write_ahead(ladder)
    if enf.teardown.leaving(ladder, targets):
        ladder.until = enf.clock() + enf.settings.grace
        return Step.LEAVING
    return _term(enf, ladder, targets)


def _term(enf: Acting, ladder: Ladder, targets: list[Target]) -> Step:
    """SIGTERM then SIGCONT (teardown.py), and the grace."""
    enf.teardown.term(ladder, targets)
    ladder.until = enf.clock() + enf.settings.grace
    return Step.TERM


def _ended(enf: Acting, ladder: Ladder) -> Step:
    """The signals are done: each target's outcome, then the evidence's parse
    (FRAMES; a resumed one has none to parse: its settle or its close)."""
    # "unkillable" (and the reboot flag) only on a positive match: a
    # process that could not be probed is "unknown", never a false alarm.
    survivors = {t.pid for t in ladder.round.left if enf.signaller.identify(t) == Result.OURS}
    # A rank found leaving on its own error *before* the ladder was left alone above.
    # One that reached its error exit while the ladder ran is still the ladder's: its
    # peers' signals caused that error, and SIGTERM often ends it mid-exit (it then
    # dies of the signal), so which came first cannot be told apart reliably.
    for target in ladder.round.live:
        ladder.outcome.setdefault(
            target.pid, End.KILLED if target not in ladder.round.left else
            End.UNKILLABLE if target.pid in survivors else End.UNKNOWN)
    ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent))
    if ladder.resumed:
        return _decided(enf, ladder)
    ladder.incident = replace(ladder.incident, outcome={
        str(pid): result for pid, result in ladder.outcome.items()})
    # Parsed after the kill, which must not wait on it.
    ladder.until = enf.clock() + enf.settings.evidence_timeout + EVIDENCE_SLACK
    ladder.work = run_for(enf.executor, ladder.incident.uid or 0,
                          enf.evidence.hot_frames, ladder.incident.id, ladder.targets,
                          list(ladder.incident.evidence or ()))
    return Step.FRAMES


def give_up(enf: Acting, ladder: Ladder, why: str) -> Step:
    """Any step, given up on (`Enforcer.close_unfinished`): thawed, and closed with what
    is known (every outcome not known `unknown`). DONE."""
    if ladder.work is not None:
        ladder.work.cancel()
    enf.teardown.thaw(ladder, f"its response is closed unfinished ({why})")
    for target in ladder.targets:
        ladder.outcome.setdefault(target.pid, End.UNKNOWN)
    ladder.incident = replace(
        ladder.incident, signals=tuple(ladder.sent) or ladder.incident.signals,
        evidence_error=ladder.incident.evidence_error or why,
        outcome={str(pid): result for pid, result in ladder.outcome.items()})
    log.error("incident %s closed unfinished (%s) at step %r", ladder.incident.id, why,
              ladder.step.value)
    return _close(enf, ladder, None)


def _decided(enf: Acting, ladder: Ladder) -> Step:
    """A resumed response's outcome: settled only if it ended something."""
    ladder.incident = replace(ladder.incident, outcome={
        str(pid): result for pid, result in ladder.outcome.items()})
    if any(r in (End.KILLED, End.UNKILLABLE) for r in ladder.outcome.values()):
        return _settle(enf, ladder)
    return _close(enf, ladder, None)


def _settle(enf: Acting, ladder: Ladder) -> Step:
    """SETTLE: wired memory gets its time to come back; without a baseline to
    judge it by, the close at once."""
    if ladder.baseline is None:
        return _settled(enf, ladder, None)
    ladder.until = enf.clock() + enf.settings.settle
    ladder.next_probe = 0.0
    return Step.SETTLE


def _settled(enf: Acting, ladder: Ladder, wired: int | None) -> Step:
    """The settle's verdict, the reboot flag it calls for (wired.py), and the close."""
    ladder.incident, flag = settled(
        ladder.incident, ladder.baseline, wired, ladder.outcome,
        threshold=enf.settings.wired_threshold, kill_timeout=enf.settings.kill_timeout,
        others_live=ladder.others_live, wall=enf.wall(),
        held=lambda: held_since(enf.held_wired(ladder.incident.uid), ladder.held_before))
    return _close(enf, ladder, flag)


def _close(enf: Acting, ladder: Ladder, flag: RebootReason | None) -> Step:
    """Journal the incident closed, then its line and the flag (writes.py). DONE."""
    ladder.incident = enf.writes.closed(ladder)
    enf.write_ahead(ladder)
    enf.writes.close(ladder.incident, flag)
    ladder.work = None
    ladder.result = Outcome(ladder.incident, dict(ladder.outcome), _sent(ladder.incident))
    return Step.DONE




def _sent(incident: Incident) -> tuple[str, ...]:
    """The names of the signals that reached a rank."""
    return tuple(s.signal for s in incident.signals or () if s.result == Result.SENT and s.signal)
