"""The signals of a ladder's teardown: the freeze, the thaw, and the rounds of SIGTERM
with SIGCONT; and what a target's record says of it (leaving on its own error, its wait
returned).

The teardown order is one for every kill, a verdict's, a fence's or a death's: every
rank of the job is frozen first (SIGSTOP, on the peers by the fence), the evidence
is taken from frozen ranks, then every rank gets SIGTERM and SIGCONT back to back,
so no rank of the job runs between the first signal to any of them and its own end
(a survivor would see its peer's socket reset: print ring errors, or catch
"connection to a peer was lost" and compute on with a rank missing). A frozen rank
is never left stopped: a response closed or resumed without its SIGTERM thaws it.

Every signal goes through a `Signaller` (signaller.py), which re-checks the process
identity right before it signals, and is listed in the ladder's `sent`. The journal's
writes between rounds are the steps' (steps.py): these only signal and note, in the
ladder's `round` (ladder.py), which no one else writes.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

from watchdog import record
from watchdog.daemon.act.ladder import Ladder
from watchdog.daemon.probes import UNINTERRUPTIBLE, Probe, ProbeError
from watchdog.daemon.signaller import Result, Signaller, Target, end_of
from watchdog.record import RecordError, read_path
from watchdog.record.layout import STACKS_SUFFIX, SUFFIX
from watchdog.states import STOPPED_STATUSES
from watchdog.status import Incident, SignalSent

log = logging.getLogger(__name__)


class Teardown:
    """Signals a ladder's targets, each through the signaller, each listed as sent."""

    def __init__(self, signaller: Signaller, probe: Probe, wall: Callable[[], float]) -> None:
        self.signaller, self.probe, self.wall = signaller, probe, wall

    def send(self, sent: list[SignalSent], target: Target, signum: int) -> Result:
        """One signal through the signaller, listed in `sent` and logged; its result."""
        result = self.signaller.send(target, signum)
        sent.append(SignalSent(pid=target.pid, rank=target.rank,
                               signal=signal.Signals(signum).name, time=self.wall(),
                               result=result))
        log.info("%s to pid %s (job %s rank %s): %s", signal.Signals(signum).name,
                 target.pid, target.job, target.rank, result)
        return result

    def not_gone(self, target: Target) -> bool:
        """Not known to be gone: a failed probe proves neither an end nor a survival,
        so it is waited on still."""
        return self.signaller.identify(target) in (Result.OURS, Result.UNKNOWN)

    def still_there(self, ladder: Ladder) -> bool:
        """Those of the round not known to be gone yet, looked at again; whether any are."""
        ladder.round.left = [t for t in ladder.round.left if self.not_gone(t)]
        return bool(ladder.round.left)

    def resumed(self, ladder: Ladder, stale: list[Target], frozen: list[Target]) -> None:
        """An earlier daemon's ladder taken over (resume.py's plan): those it froze for a
        verdict no longer acted on thawed, and those it froze to end, frozen still."""
        if stale:
            ladder.round.frozen = list(stale)
            self.thaw(ladder, "an earlier daemon froze it, and its verdict is not acted on")
        ladder.round.frozen = list(frozen)

    def status(self, target: Target) -> str:
        """The process's status (psutil's words), "" when it cannot be sampled. Stopped
        ones are not the ladder's to resume; one in uninterruptible sleep ('D') takes
        a SIGSTOP only once it leaves it."""
        try:
            sample = self.probe.sample(target.pid)
        except ProbeError:
            return ""
        return sample.status if sample is not None else ""

    def freeze(self, ladder: Ladder) -> str:
        """SIGSTOP to every target, back to back, first of all signals: no rank of the
        job runs on to see a peer end (its ring errors, a caught "connection to a peer
        was lost" computed on with a rank missing). Sets the ladder's `sent` and
        `frozen`; what could not be frozen is said in the words returned (`freeze`)."""
        sent: list[SignalSent] = []
        notes = []
        leaving = [t for t in ladder.targets if ending_itself(t)]
        for target in leaving:
            notes.append(f"rank {target.rank} (pid {target.pid}) not frozen: leaving on "
                         "its own error")
        # Sampled before any SIGSTOP, so the SIGSTOPs go back to back.
        status = {t.pid: self.status(t) for t in ladder.targets if t not in leaving}
        for target in [t for t in ladder.targets if t not in leaving]:
            if self.send(sent, target, signal.SIGSTOP) != Result.SENT:
                continue
            if status[target.pid] in STOPPED_STATUSES:
                # Stopped by someone else (the rank the job waits on, often): never
                # resumed by the ladder before its SIGTERM, not even for a dump.
                notes.append(f"rank {target.rank} (pid {target.pid}) was stopped already")
            else:
                ladder.round.frozen.append(target)
        for target in ladder.round.frozen:
            if UNINTERRUPTIBLE in (status[target.pid], self.status(target)):
                notes.append(f"rank {target.rank} (pid {target.pid}) not frozen: in "
                             "uninterruptible sleep (it stops once it leaves it)")
        count = len(ladder.round.frozen)
        ladder.sent = sent
        return "; ".join(([f"{count} rank{'' if count == 1 else 's'} frozen"] if count else
                          [] if notes else ["nothing frozen"]) + notes)

    def thaw(self, ladder: Ladder, why: str) -> None:
        """SIGCONT to every target frozen and not SIGTERMed (a response closed without
        its SIGTERM): never left stopped."""
        for target in ladder.round.frozen:
            log.warning("thawing pid %s (job %s rank %s): %s", target.pid, target.job,
                        target.rank, why)
            self.send(ladder.sent, target, signal.SIGCONT)
        ladder.round.frozen = []

    def leaving(self, ladder: Ladder, targets: list[Target]) -> bool:
        """The round's start: those of `targets` leaving on their own error (`ending`)
        get the grace to finish, unsignalled (thawed, if they reached their error after
        the freeze); whether there are any."""
        ladder.round.live = list(targets)
        ladder.round.ending = [t for t in targets if ending_itself(t)]
        if not ladder.round.ending:
            return False
        for target in [t for t in ladder.round.frozen if t in ladder.round.ending]:
            self.send(ladder.sent, target, signal.SIGCONT)
        ladder.round.frozen = [t for t in ladder.round.frozen if t not in ladder.round.ending]
        ladder.round.left = [t for t in ladder.round.ending if self.not_gone(t)]
        return True

    def term(self, ladder: Ladder, targets: list[Target]) -> None:
        """SIGTERM to every target, then SIGCONT to each it reached: a stopped (frozen)
        rank takes its SIGTERM as it resumes, before it runs a line of its own (the
        default action ends it even stopped); never resumed first, to see a peer end."""
        for target in targets:
            result = self.send(ladder.sent, target, signal.SIGTERM)
            if result != Result.SENT:
                ladder.outcome[target.pid] = end_of(result)
        ladder.round.live = [t for t in targets if t.pid not in ladder.outcome]
        for target in targets:
            # Gone already: it is ended. One frozen that the SIGTERM did not reach (its
            # identity unknown for a moment) is thawed if it can be: never left stopped.
            if target in ladder.round.live or target in ladder.round.frozen:
                self.send(ladder.sent, target, signal.SIGCONT)
        ladder.round.frozen = []
        ladder.round.left = [t for t in ladder.round.live if self.not_gone(t)]

    def kill(self, ladder: Ladder) -> None:
        """SIGKILL to those left after the grace."""
        for target in ladder.round.left:
            self.send(ladder.sent, target, signal.SIGKILL)
        ladder.round.left = [t for t in ladder.round.left if self.not_gone(t)]


def ending_itself(target: Target) -> bool:
    """Its record says the rank is leaving on an uncaught exception (the backend's
    own error: "[ring] connection to a peer was lost"). The hook writes that at
    exit, which a SIGTERM's default action never reaches: so a rank found so
    after the ladder ended on its own error, not by the watchdog's signal."""
    if not target.record_path:
        return False
    try:
        rec = record.read_path(target.record_path)
    except (record.RecordError, OSError):
        return False  # removed, or unreadable: nothing proves it
    return (rec.status == record.STATUS_ERROR and rec.pid == target.pid
            and rec.start_time == target.start_time)


def progressed(incident: Incident, target: Target) -> bool:
    """The target's wait returned since the verdict (its record counts more
    completed waits than the incident saw): no longer hung, not to be ended."""
    seen = next((r.progress for r in incident.ranks if r.pid == target.pid), None)
    if seen is None or not target.stacks_path:
        return False
    path = target.stacks_path[: -len(STACKS_SUFFIX)] + SUFFIX
    try:
        rec = read_path(path)
    except RecordError:
        return False  # unreadable or removed: the identity check decides
    return rec.pid == target.pid and rec.waits_completed > seen
