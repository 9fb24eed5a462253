"""The escalation ladder: evidence, SIGCONT, SIGTERM, grace, SIGKILL, confirm.

A response is a `Ladder`: `begin` (a verdict) or `resume` (an earlier daemon's
unfinished one) makes it, and `step` takes every step that is due, whenever the
daemon's loop calls it; no thread sleeps through a grace. The evidence and the
parse of the native dumps run on a worker (`FairWork`, workers.py: one capture in
flight per uid; without one, at once), and neither is waited for past its time box:
the evidence's counts from the verdict, so work queued behind another user's hung
captures never delays the signals.

Each step has one handler on `Enforcer` (`Enforcer.HANDLERS`): once the step is due it
does what the step does and returns the step the ladder goes to (None while it waits:
on a worker, a grace, a timeout, the settle). `Enforcer.advance` takes it and is the
one place a ladder's step is set. `[j]` marks a write of the write-ahead journal
(store/pending.py), the only ones there are.

    step      waits for                     goes to, and why
    BEGIN     - (a verdict)                 DONE in observe mode: nothing is signalled,
                                            not even the dump signal; the incident closed
                                            EVIDENCE: [j] the verdict, before the first
                                            signal; SIGSTOP to every target, [j] once
                                            sent; the stacks of frozen ranks on a worker
    RESUME    - (at start, an earlier       DONE: it was closed, only its writes were
              daemon's entry)               missing (the incident line, the flag)
                                            LEAVING or TERM, as from HOLD: a target still
                                            ours and due goes down the rest of the ladder
                                            (an interrupted SIGTERM must not leave it
                                            half-ended), without evidence
                                            SETTLE or DONE, as from a resumed KILL: no
                                            target is left to end
    EVIDENCE  the dumps (worker), or the    HOLD: with or without them; the kill never
              time box from the verdict     waits past the time box
    HOLD      the moment the peers were     LEAVING: [j] the round; a rank leaving on its
              told to end theirs (a         own error gets the grace to go, unsignalled
              fence's; at once without)     TERM: [j] the round; SIGTERM then SIGCONT to
                                            every target, back to back
    LEAVING   those leaving on their own    TERM: SIGTERM, SIGCONT to the rest; one gone
              error gone, or the grace      meanwhile ended itself (`exited`)
    TERM      every target gone, or the     KILL: to those still there, if any, [j] the
              grace                         SIGTERMs and SIGCONTs, then SIGKILL
    KILL      every target gone, or         FRAMES: each target's outcome; the native
              kill_timeout                  dumps parsed on a worker, after the kill,
                                            which must not wait on them
                                            SETTLE or DONE when resumed: it has no dumps;
                                            settled only if it ended something
    FRAMES    the parse (worker), or the    SETTLE: [j] the outcome, before a settle of up
              evidence time box             to minutes
                                            DONE, as SETTLE's end, without a wired baseline
    SETTLE    wired memory back, or the     DONE: the reboot flag if one is called for
              settle time
    DONE      -                             (reached through `_close`: [j] closed, then
                                            the incident line and the flag, each written
                                            or held in the backlog)
    any step  its loop giving up on it      DONE: `close_unfinished`, with what is known
                                            (thawed, every outcome not known `unknown`)

What `resume` infers from the journal. An entry holds what its last write said: a
daemon that died at a step leaves the last `[j]` before its death. For every step:
a target is ended now only if it is still ours (its identity), the verdict fresh
(`replay_within`), the mode `enforce`, the action "ending" or "ended", and its wait not
returned since (`_progressed`); it goes down the ladder from HOLD's round (`resumed`:
it takes no evidence and parses no dumps). One still ours and not ended now is
`unknown`, left to the scan to judge afresh. One gone counts `killed` only if the entry
says a signal to end it may have gone (`ladder: "begun"`, or a SIGTERM or SIGKILL
listed); else what its identity check found (its own end). One listed SIGSTOPped and
not SIGTERMed is frozen still: ended now (SIGTERM first), or thawed, never left
stopped. Step by step:

    died at   its entry holds               so resume
    BEGIN     none, or the verdict alone    no entry: nothing was signalled, the scan
              (action "ending")             judges afresh; else no target is frozen
                                            that it knows of (a SIGSTOP sent and not yet
                                            journaled is not: a stale target so stopped
                                            is not thawed; the window is the back-to-back
                                            SIGSTOPs'), none gone was ours
    EVIDENCE, the SIGSTOPs sent (`freeze`)  the frozen are known: ended, or thawed when
    HOLD                                    stale; none gone was ours
    LEAVING,  the round begun (`ladder`,    a target gone was ended by us; its SIGTERMs
    TERM      action "ended")               are not listed, so every SIGSTOPped one
                                            counts as frozen (ended again, or thawed: a
                                            SIGCONT after its SIGTERM harms nothing)
    KILL,     the SIGTERMs and SIGCONTs     none is frozen; one still there gets the
    FRAMES    (if one outlived the grace;   round again (SIGTERM, the grace, SIGKILL)
              else as at TERM)
    SETTLE    the outcome (`native_hot`)    its targets gone, ended by us: the settle
                                            again, in full, if it ended something
    DONE      `closed_at` (it died before   the writes alone (`_reclose`): the line and
              the line and the flag were    the flag, each only if not on disk yet
              on disk, or a write failed)

The teardown order is one for every kill, a verdict's, a fence's or a death's: every
rank of the job is frozen first (SIGSTOP, on the peers by the fence), the evidence
is taken from frozen ranks, then every rank gets SIGTERM and SIGCONT back to back,
so no rank of the job runs between the first signal to any of them and its own end
(a survivor would see its peer's socket reset: print ring errors, or catch
"connection to a peer was lost" and compute on with a rank missing). A frozen rank
is never left stopped: a response closed or resumed without its SIGTERM thaws it.

Every signal goes through a `Signaller` (signaller.py), which re-checks the
process identity right before it signals; evidence comes from `Evidence`
(evidence.py). An unkillable rank or leaked wired memory flags the node for
reboot. Tests pass a fake signaller and a fake clock.
"""

from __future__ import annotations

import enum
import logging
import signal
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from watchdog import record
from watchdog.daemon.act.evidence import Evidence
from watchdog.daemon.act.exo import peer_delay
from watchdog.daemon.act.workers import FairWork
from watchdog.daemon.config import LadderSettings, Live, Settings, live
from watchdog.daemon.probes import UNINTERRUPTIBLE, Probe, ProbeError
from watchdog.daemon.signaller import Result, Signaller, Target
from watchdog.daemon.store import journal, pending
from watchdog.record import RecordError, read_path
from watchdog.record.layout import STACKS_SUFFIX, SUFFIX
from watchdog.states import STOPPED_STATUSES, Mode, State
from watchdog.status import (
    ABSENT,
    Incident,
    PeerView,
    RebootFlag,
    RebootReason,
    SignalSent,
    WiredCheck,
)

log = logging.getLogger(__name__)

# Seconds past the evidence timeout a capture may take to hand back its files (the
# prune, the copies): the time box from the verdict is the two together.
EVIDENCE_SLACK = 1.0


@dataclass(frozen=True)
class Outcome:
    """What one response to a hung job did, handed back to the daemon's loop."""

    incident: Incident  # as written to incidents.jsonl
    # pid -> KILLED, UNKILLABLE (States), UNKNOWN, or what stopped the ladder early (GONE,
    # NOT_OURS, DENIED); empty when nothing was signalled (observe mode, a hold)
    results: dict[int, str] = field(default_factory=dict)
    signals_sent: tuple[str, ...] = ()  # names of the signals that reached a rank
    held: str = ""  # not acted on: why (a rank of the job computes on another node)


class Step(enum.Enum):
    """Where a response's ladder stands (the module's table). Each step but the worker
    ones (`EVIDENCE`, `FRAMES`) and the two it starts at is a wait with a deadline,
    checked by `Enforcer.step` whenever it is called (each tick of the daemon's loop)."""

    BEGIN = "beginning"  # a verdict's: journaled, frozen, its evidence under way
    RESUME = "resuming"  # an earlier daemon's unfinished response, from its entry
    EVIDENCE = "gathering evidence"  # stack dumps, on a worker
    HOLD = "holding frozen"  # until the moment the peers end theirs (a fence's)
    LEAVING = "leaving on its own error"  # such ranks get the grace, unsignalled
    TERM = "SIGTERM sent"  # SIGCONT and SIGTERM sent: the grace
    KILL = "SIGKILL sent"  # the kill timeout
    FRAMES = "reading the native dumps"  # on a worker, after the kill
    SETTLE = "settling"  # wired memory gets the settle time to come back
    DONE = "done"


@dataclass(eq=False)
class Ladder:
    """One response to a hung job under way: what it has done and the step it is at.

    Made by `Enforcer.begin` (a verdict) or `Enforcer.resume` (an earlier daemon's
    unfinished response), advanced by `Enforcer.step` until it hands back its
    `Outcome`. Only the daemon's loop thread touches it; its worker steps run a
    `Future` and read nothing else of it.
    """

    incident: Incident
    targets: list[Target]
    baseline: int | None
    others_live: Callable[[], bool]
    step: Step = Step.BEGIN  # set by `Enforcer.advance` alone
    until: float = 0.0  # monotonic deadline of the current wait (or worker step)
    work: Future[Any] | None = None  # the current worker step's
    resumed: bool = False  # an earlier daemon's: no evidence, settled only after a kill
    sent: list[SignalSent] = field(default_factory=list)
    outcome: dict[int, str] = field(default_factory=dict)
    ending: list[Target] = field(default_factory=list)  # leaving on their own error
    live: list[Target] = field(default_factory=list)  # down the signal ladder
    left: list[Target] = field(default_factory=list)  # not known to be gone yet
    next_probe: float = 0.0  # of wired memory, while settling
    result: Outcome | None = None
    frozen: list[Target] = field(default_factory=list)  # SIGSTOPped, not yet SIGTERMed
    term_at: float = 0.0  # monotonic: no SIGTERM before (the moment the peers were told)
    # What `begin` was asked, for its step: the stack dumps taken (a fenced job's are
    # not), and when the verdict was (monotonic; None: when the step is taken).
    gather: bool = True
    verdict_at: float | None = None

    @property
    def working(self) -> bool:
        """A worker step is under way (what may get stuck: a sampler, a filesystem)."""
        return self.work is not None and not self.work.done()


class Enforcer:
    """Steps one response's escalation ladder (freeze, evidence, SIGTERM with SIGCONT,
    grace, SIGKILL, confirm, wired settle) through its edge table, each step
    journalled before the next; resumes a ladder a restarted daemon left mid-way."""

    TICK = 0.05  # seconds between a ladder's steps: the loop's wait while one is under way

    def __init__(self, settings: Settings | Live, signaller: Signaller, probe: Probe, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time,
                 executor: FairWork | Executor | None = None) -> None:
        self.live = live(settings)
        self.signaller = signaller
        self.probe = probe
        self.clock = clock
        self.sleep = sleep
        self.wall = wall
        # Where evidence is gathered and parsed; without one (tests), at once.
        self.executor = executor
        self.evidence = Evidence(self.settings.state_dir, self.settings.evidence_timeout, signaller,
                                 probe, clock=clock, sleep=sleep, wall=wall)
        # Incidents and reboot flags a failed write left in memory (pending.py).
        self.backlog = pending.Backlog(self.settings.state_dir)

    @property
    def settings(self) -> LadderSettings:
        """Read at use: a reload reaches a response under way."""
        return self.live.ladder

    def capture(self, incident_id: str, targets: list[Target],
                frozen: frozenset[int] = frozenset()) -> list[str]:
        """Stack dumps of every target (`frozen`: pids the ladder froze), time-boxed;
        their files."""
        return self.evidence.capture(incident_id, targets, frozen)

    def _work(self, uid: int, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if isinstance(self.executor, FairWork):
            return self.executor.submit(uid, fn, *args)
        if self.executor is not None:
            return self.executor.submit(fn, *args)
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args))
        except Exception as err:  # noqa: BLE001 - handed to the step that reads it
            future.set_exception(err)
        return future

    # -- the journal -------------------------------------------------------------

    def write_ahead(self, ladder: Ladder) -> None:
        """The response so far, on disk before its next step. A failed write is
        reported and the kill goes on: a hung job must end whatever the disk does."""
        try:
            pending.write_ahead(self.settings.state_dir, ladder.incident, ladder.targets,
                                ladder.baseline)
        except OSError as err:
            self.backlog.failures += 1
            log.error("cannot journal incident %s before acting (%s); acting anyway",
                      ladder.incident.id, err)

    # -- starting a response -------------------------------------------------------

    def begin(self, incident: Incident, targets: list[Target], baseline: int | None = None,
              others_live: Callable[[], bool] = lambda: False,
              cluster: PeerView | None = None, evidence: bool = True,
              asked: bool = False, verdict_at: float | None = None,
              term_at: float | None = None) -> Ladder:
        """A response to one hung job: journaled, its evidence under way (or, in
        observe mode, closed at once). `cluster` is the peers' view when they were
        asked (`asked`); `evidence=False` skips stack dumps (a fenced job is known
        dead, and its peers wait on its end). `verdict_at` (monotonic, by this
        enforcer's clock; default now) starts the evidence's time box. Every target is
        frozen first; `term_at` (monotonic) holds the SIGTERMs until then (the moment a
        fence told the peers to end theirs), never past the evidence's time box."""
        incident = replace(incident, signals=(), wired_before=self._wired(),
                           wired_baseline=baseline)
        if asked:
            incident = replace(incident, cluster=cluster)
        ladder = Ladder(incident, list(targets), baseline, others_live, gather=evidence,
                        verdict_at=verdict_at, term_at=0.0 if term_at is None else term_at)
        self.step(ladder)
        return ladder

    def _freeze(self, ladder: Ladder) -> None:
        """SIGSTOP to every target, back to back, first of all signals: no rank of the
        job runs on to see a peer end (its ring errors, a caught "connection to a peer
        was lost" computed on with a rank missing). Journaled once sent, before the
        evidence; what could not be frozen is said in the incident (`freeze`)."""
        sent: list[SignalSent] = []
        notes = []
        leaving = [t for t in ladder.targets if self._ending_itself(t)]
        for target in leaving:
            notes.append(f"rank {target.rank} (pid {target.pid}) not frozen: leaving on "
                         "its own error")
        # Sampled before any SIGSTOP, so the SIGSTOPs go back to back.
        status = {t.pid: self._status(t) for t in ladder.targets if t not in leaving}
        for target in [t for t in ladder.targets if t not in leaving]:
            if self._signal(sent, target, signal.SIGSTOP) != Result.SENT:
                continue
            if status[target.pid] in STOPPED_STATUSES:
                # Stopped by someone else (the rank the job waits on, often): never
                # resumed by the ladder before its SIGTERM, not even for a dump.
                notes.append(f"rank {target.rank} (pid {target.pid}) was stopped already")
            else:
                ladder.frozen.append(target)
        for target in ladder.frozen:
            if UNINTERRUPTIBLE in (status[target.pid], self._status(target)):
                notes.append(f"rank {target.rank} (pid {target.pid}) not frozen: in "
                             "uninterruptible sleep (it stops once it leaves it)")
        count = len(ladder.frozen)
        said = "; ".join(([f"{count} rank{'' if count == 1 else 's'} frozen"] if count else
                          [] if notes else ["nothing frozen"]) + notes)
        ladder.sent = sent
        ladder.incident = replace(ladder.incident, signals=tuple(sent), freeze=said)
        if sent:
            self.write_ahead(ladder)

    def _status(self, target: Target) -> str:
        """The process's status (psutil's words), "" when it cannot be sampled. Stopped
        ones are not the ladder's to resume; one in uninterruptible sleep ('D') takes
        a SIGSTOP only once it leaves it."""
        try:
            sample = self.probe.sample(target.pid)
        except ProbeError:
            return ""
        return sample.status if sample is not None else ""

    def thaw(self, ladder: Ladder, why: str) -> None:
        """SIGCONT to every target frozen and not SIGTERMed (a response closed without
        its SIGTERM): never left stopped."""
        for target in ladder.frozen:
            log.warning("thawing pid %s (job %s rank %s): %s", target.pid, target.job,
                        target.rank, why)
            self._signal(ladder.sent, target, signal.SIGCONT)
        ladder.frozen = []

    def resume(self, entry: pending.Entry, others_live: Callable[[], bool]) -> Ladder:
        """At start: a response an earlier daemon journaled and never closed, to finish
        (its `RESUME` step, taken at once; the module says what it infers from the
        entry, step by step)."""
        ladder = Ladder(entry.incident, list(entry.targets), entry.baseline, others_live,
                        step=Step.RESUME, resumed=True)
        self.advance(ladder)
        return ladder

    # -- the ladder, step by step (the module's table) ---------------------------------

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
        loop gives up waiting on it (`close_unfinished`)."""
        if unfinished:
            after: Step | None = self._unfinished(ladder, unfinished)
        elif ladder.step is Step.DONE:
            return False
        else:
            after = self.HANDLERS[ladder.step](self, ladder, self.clock())
        if after is None:
            return False
        ladder.step = after
        return True

    def _step_begin(self, ladder: Ladder, now: float) -> Step:
        """A verdict's: closed at once in observe mode; else journaled, frozen, and its
        evidence under way."""
        if self.settings.mode == Mode.OBSERVE:
            # Observe signals nothing, not even the stack-dump signal, and does
            # not ptrace: the thread CPU and flight recorder are the evidence.
            ladder.incident = replace(ladder.incident, evidence=(), outcome={},
                                      action="observed (mode observe: nothing signalled)")
            return self._close(ladder, None)
        incident = ladder.incident = replace(ladder.incident, action="ending")
        self.write_ahead(ladder)  # the verdict, before the first signal (the freeze)
        self._freeze(ladder)
        if ladder.gather:
            ladder.work = self._work(incident.uid or 0, self.capture, incident.id,
                                     list(ladder.targets),
                                     frozenset(t.pid for t in ladder.frozen))
        else:
            ladder.work = None
        # Read after the freeze and the capture's hand-over (at once without a worker).
        ladder.until = (self.clock() if ladder.verdict_at is None else ladder.verdict_at) \
            + self.settings.evidence_timeout + EVIDENCE_SLACK
        # Never past the time box; a fenced exo job's by exo's stagger more (act/exo.py).
        ladder.term_at = min(ladder.term_at, ladder.until + peer_delay(incident.job or ""))
        return Step.EVIDENCE

    def _step_resume(self, ladder: Ladder, now: float) -> Step:
        """An earlier daemon's entry. A target still ours, whose wait has not returned,
        goes down the rest of the ladder (its verdict stands, and an interrupted
        SIGTERM must not leave it half-ended); one gone after a signal was journaled
        was ended by us, never a crash. The settle and the flag follow as usual."""
        incident, targets, baseline = ladder.incident, ladder.targets, ladder.baseline
        if incident.closed_at is not None:  # all done but the journal line, or the flag
            self._reclose(incident, baseline)
            ladder.result = Outcome(incident, {}, ())
            return Step.DONE
        log.warning("completing incident %s of job %s left unfinished by an earlier daemon",
                    incident.id, incident.job)
        ladder.incident = replace(incident, signals=incident.signals or (),
                                  completed_at_start=self.wall())
        # The ladder had begun: every target may have had its signals (they are
        # journaled per round); else only those the journal names.
        signalled = ({t.pid for t in targets} if incident.ladder else
                     {s.pid for s in incident.signals or ()
                      if s.signal in ("SIGTERM", "SIGKILL")})
        fresh = self.wall() - incident.time < self.replay_within()
        live = []
        for target in targets:
            who = self.signaller.identify(target)
            if who == Result.OURS and (fresh and self.settings.mode == Mode.ENFORCE
                                and incident.action in ("ending", "ended")
                                and not _progressed(incident, target)):
                live.append(target)
            elif who == Result.OURS:
                ladder.outcome[target.pid] = Result.UNKNOWN  # left to the scan to judge afresh
            else:
                ladder.outcome[target.pid] = State.KILLED if target.pid in signalled else who
        # Frozen by the earlier daemon and not ended now (stale, observe, progressed):
        # thawed, never left stopped. Those ended now are frozen still: SIGTERM first.
        termed = {s.pid for s in incident.signals or () if s.signal == "SIGTERM"}
        ladder.frozen = [t for t in targets if t.pid not in termed and any(
            s.pid == t.pid and s.signal == "SIGSTOP" and s.result == Result.SENT
            for s in incident.signals or ())]
        ladder.sent = list(ladder.incident.signals or ())
        stale = [t for t in ladder.frozen if t not in live
                 and ladder.outcome.get(t.pid) == Result.UNKNOWN]
        if stale:
            ladder.frozen = stale
            self.thaw(ladder, "an earlier daemon froze it, and its verdict is not acted on")
            ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent))
        ladder.frozen = [t for t in ladder.frozen if t in live]
        if live:  # from HOLD's round: a dead daemon's evidence time box is long past
            ladder.incident = replace(ladder.incident, action="ended")
            return self._signals(ladder, live)
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
        ladder.left = [t for t in ladder.left if self._not_gone(t)]
        if ladder.left and now < ladder.until:
            return None
        for target in ladder.ending:
            if target not in ladder.left:
                ladder.outcome[target.pid] = State.EXITED
                log.info("pid %s (job %s rank %s) ended on its own error; not signalled",
                         target.pid, target.job, target.rank)
        return self._term(ladder, [t for t in ladder.live if t.pid not in ladder.outcome])

    def _step_term(self, ladder: Ladder, now: float) -> Step | None:
        """Every target gone, or the grace over: SIGKILL to those still there."""
        ladder.left = [t for t in ladder.left if self._not_gone(t)]
        if ladder.left and now < ladder.until:
            return None
        if ladder.left:  # SIGCONT and SIGTERM as sent, before the SIGKILLs
            ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent))
            self.write_ahead(ladder)
            for target in ladder.left:
                self._signal(ladder.sent, target, signal.SIGKILL)
            ladder.left = [t for t in ladder.left if self._not_gone(t)]
        ladder.until = self.clock() + self.settings.kill_timeout
        return Step.KILL

    def _step_kill(self, ladder: Ladder, now: float) -> Step | None:
        """Every target gone, or the kill timeout over: each target's outcome."""
        ladder.left = [t for t in ladder.left if self._not_gone(t)]
        if ladder.left and now < ladder.until:
            return None
        return self._ended(ladder)

    def _step_frames(self, ladder: Ladder, now: float) -> Step | None:
        """The native dumps parsed, or their time box over: the outcome journaled, then
        the settle."""
        if ladder.working and now < ladder.until:
            return None
        assert ladder.work is not None
        if ladder.working:  # a parse queued behind others: the incident goes without
            ladder.work.cancel()
            log.warning("the native dumps of incident %s were not read within %.0fs; "
                        "closing it without their hot frames", ladder.incident.id,
                        self.settings.evidence_timeout)
            hot = []
        else:
            try:
                hot = ladder.work.result()
            except Exception as err:  # noqa: BLE001 - a parse never undoes a kill
                log.error("reading the native dumps of incident %s failed: %s",
                          ladder.incident.id, err)
                hot = []
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
        if self._over(ladder.baseline, wired) and now < ladder.until:
            ladder.next_probe = now + 0.25
            return None
        return self._settled(ladder, wired)

    # The edge table: each step's handler. DONE has none (nothing follows it).
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

    def _signals(self, ladder: Ladder, targets: list[Target]) -> Step:
        """The first round: SIGTERM and SIGCONT to every target, back to back (TERM),
        but to those leaving on their own error (LEAVING, first)."""
        ladder.sent = list(ladder.incident.signals or ())
        # Journaled before the first signal of each round, not before each signal:
        # a write (an fsync) between two ranks' signals would let one see its peer
        # die. A target gone after the ladder began was ended by it (Enforcer.resume).
        ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent), ladder="begun")
        self.write_ahead(ladder)
        ladder.live = list(targets)
        # A rank already leaving on its own error gets the grace to finish, unsignalled
        # (thawed, if it reached its error after the freeze).
        ladder.ending = [t for t in targets if self._ending_itself(t)]
        if ladder.ending:
            for target in [t for t in ladder.frozen if t in ladder.ending]:
                self._signal(ladder.sent, target, signal.SIGCONT)
            ladder.frozen = [t for t in ladder.frozen if t not in ladder.ending]
            ladder.left = [t for t in ladder.ending if self._not_gone(t)]
            ladder.until = self.clock() + self.settings.grace
            return Step.LEAVING
        return self._term(ladder, targets)

    def _term(self, ladder: Ladder, targets: list[Target]) -> Step:
        """SIGTERM to every target, then SIGCONT to each it reached: a stopped (frozen)
        rank takes its SIGTERM as it resumes, before it runs a line of its own (the
        default action ends it even stopped); never resumed first, to see a peer end."""
        for target in targets:
            result = self._signal(ladder.sent, target, signal.SIGTERM)
            if result != Result.SENT:
                ladder.outcome[target.pid] = result
        ladder.live = [t for t in targets if t.pid not in ladder.outcome]
        for target in targets:
            # Gone already: it is ended. One frozen that the SIGTERM did not reach (its
            # identity unknown for a moment) is thawed if it can be: never left stopped.
            if target in ladder.live or target in ladder.frozen:
                self._signal(ladder.sent, target, signal.SIGCONT)
        ladder.frozen = []
        ladder.left = [t for t in ladder.live if self._not_gone(t)]
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
                target.pid, State.KILLED if target not in ladder.left else
                State.UNKILLABLE if target.pid in survivors else Result.UNKNOWN)
        ladder.incident = replace(ladder.incident, signals=tuple(ladder.sent))
        if ladder.resumed:
            return self._decided(ladder)
        ladder.incident = replace(ladder.incident, outcome={
            str(pid): result for pid, result in ladder.outcome.items()})
        # Parsed after the kill, which must not wait on it.
        ladder.until = self.clock() + self.settings.evidence_timeout + EVIDENCE_SLACK
        ladder.work = self._work(ladder.incident.uid or 0, self.evidence.hot_frames,
                                 ladder.incident.id, ladder.targets,
                                 list(ladder.incident.evidence or ()))
        return Step.FRAMES

    def close_unfinished(self, ladder: Ladder, why: str) -> Outcome:
        """A ladder its loop gives up waiting on: closed and journaled with what is
        known (the signals sent so far, each target's outcome or "unknown"), never
        dropped: a begun ladder may have signalled, and every kill is journaled."""
        self.advance(ladder, unfinished=why)
        assert ladder.result is not None
        return ladder.result

    def _unfinished(self, ladder: Ladder, why: str) -> Step:
        """Any step, given up on (`close_unfinished`): closed with what is known."""
        if ladder.work is not None:
            ladder.work.cancel()
        self.thaw(ladder, f"its response is closed unfinished ({why})")
        for target in ladder.targets:
            ladder.outcome.setdefault(target.pid, Result.UNKNOWN)
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
        if any(r in (State.KILLED, State.UNKILLABLE) for r in ladder.outcome.values()):
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

    def _over(self, baseline: int | None, wired: int | None) -> bool:
        return (wired is not None and baseline is not None
                and wired > baseline + self.settings.wired_threshold)

    def wired_check(self, baseline: int | None, wired: int | None,
                    others_live: Callable[[], bool]) -> WiredCheck:
        """What wired memory read `wired` says after a kill, against the idle baseline."""
        if baseline is None:
            return WiredCheck(wired_check="no baseline")
        if wired is None:
            said = "probe failed"
        elif not self._over(baseline, wired):
            said = "returned"
        elif others_live():
            # Other ranks hold wired memory legitimately; no verdict on a leak.
            said = "skipped: other ranks are live"
        else:
            said = "leaked"
        return WiredCheck(wired_baseline=baseline, wired_after=wired, wired_check=said)

    def _wired(self) -> int | None:
        try:
            return self.probe.wired_bytes()
        except ProbeError as err:
            log.warning("wired memory probe failed: %s", err)
            return None

    def _settled(self, ladder: Ladder, wired: int | None) -> Step:
        """The settle's verdict, the reboot flag it calls for, and the close."""
        settled = self.wired_check(ladder.baseline, wired, ladder.others_live)
        incident = replace(ladder.incident, wired_check=settled.wired_check, **{
            key: getattr(settled, key) for key in ("wired_baseline", "wired_after")
            if getattr(settled, key) is not ABSENT})
        unkillable = [pid for pid, result in ladder.outcome.items() if result == State.UNKILLABLE]
        reasons = []
        if unkillable:
            reasons.append(f"pids {unkillable} survived SIGKILL for "
                           f"{self.settings.kill_timeout:g}s")
        if incident.wired_check == "leaked":
            reasons.append("wired memory stayed above the baseline after the kill")
        flag = None
        if reasons:
            reason = "; ".join(reasons)
            flag = RebootReason(reason=reason, time=self.wall(), incident=incident.id,
                                wired_baseline=ladder.baseline,
                                wired_after=_wired_after(incident))
            incident = replace(incident, reboot_required=reason)
        ladder.incident = incident
        return self._close(ladder, flag)

    def _close(self, ladder: Ladder, flag: RebootReason | None) -> Step:
        """Journal the incident and the flag, each on its own: one failed write
        neither skips the other nor loses itself (held and retried each scan). DONE."""
        incident = ladder.incident
        ladder.incident = replace(incident, closed_at=self.wall(), reboot_required=(
            False if incident.reboot_required is None else incident.reboot_required))
        # Closed in its entry too: a restart before both writes are done completes
        # only the writes (never the ladder again, never a second line).
        self.write_ahead(ladder)
        self.backlog.add(ladder.incident, flag)
        ladder.work = None
        ladder.result = Outcome(ladder.incident, dict(ladder.outcome), _sent(ladder.incident))
        return Step.DONE

    # -- signals, identity, the journal at start ----------------------------------

    def _signal(self, sent: list[SignalSent], target: Target, signum: int) -> str:
        result = self.signaller.send(target, signum)
        sent.append(SignalSent(pid=target.pid, rank=target.rank,
                               signal=signal.Signals(signum).name, time=self.wall(),
                               result=result))
        log.info("%s to pid %s (job %s rank %s): %s", signal.Signals(signum).name,
                 target.pid, target.job, target.rank, result)
        return result

    def _not_gone(self, target: Target) -> bool:
        # A failed probe proves neither an end nor a survival: keep waiting on it.
        return self.signaller.identify(target) in (Result.OURS, Result.UNKNOWN)

    def _ending_itself(self, target: Target) -> bool:
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

    def replay_within(self) -> float:
        """Seconds after its verdict an interrupted response is still completed at
        start: every step's bound, as for a response presumed stuck."""
        return self.settings.response_bound()

    def _reclose(self, incident: Incident, baseline: int | None) -> None:
        """A closed incident an earlier daemon could not finish writing: its line
        and its reboot flag, whichever is not on disk yet (never twice)."""
        state_dir = self.settings.state_dir
        written = any(i.id == incident.id
                      for i in journal.read_incidents(state_dir)[0])
        flag = None
        reason = incident.reboot_required
        present = journal.reboot_flag(state_dir) or RebootFlag()
        told = present.reasons if isinstance(present.reasons, tuple) else ()
        if reason and not any(r.incident == incident.id for r in told):
            flag = RebootReason(reason=str(reason), time=self.wall(), incident=incident.id,
                                wired_baseline=baseline, wired_after=_wired_after(incident))
        if written:
            self.backlog.written(incident.id)
        self.backlog.add(None if written else incident, flag)


def _sent(incident: Incident) -> tuple[str, ...]:
    """The names of the signals that reached a rank."""
    return tuple(s.signal for s in incident.signals or () if s.result == Result.SENT and s.signal)


def _wired_after(incident: Incident) -> int | None:
    return None if incident.wired_after is ABSENT else incident.wired_after


def _progressed(incident: Incident, target: Target) -> bool:
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
