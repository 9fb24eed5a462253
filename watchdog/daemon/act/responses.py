"""Responses under way: each hung job's response is a `Ladder` the daemon's loop
steps on every tick (enforcer.py), and what each one did comes back as a typed
`Outcome`.

A response first asks the peers, where there are any, whether a rank of the job
computes on another node (then it holds: a slow peer is not a hang); else it
fences the peers at once and begins the enforcer's ladder. Only the peers' answer,
the evidence and its parse run on workers, each kind on its own: the peers' views
and the fences each on a thread of their own (never behind evidence, another view
or a slow peer: each exchange with a peer has a total bound, net/cluster.py), the
evidence on `FairWork` (one capture in flight per uid). No worker is waited for past
its bound: peers that do not answer within theirs count as unreachable; evidence
not gathered within its time box from the verdict is done without. A response
still waiting past every step's bounds is closed with what is known (journaled,
never dropped: its ladder may have signalled).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from watchdog.daemon.act import told
from watchdog.daemon.act.enforcer import Enforcer
from watchdog.daemon.act.exo import delay_here
from watchdog.daemon.act.incidents import fence_culprit, view_culprit, with_view
from watchdog.daemon.act.ladder import EVIDENCE_SLACK, Ladder, Outcome, Step
from watchdog.daemon.act.peers import Peers
from watchdog.daemon.clock import Clock
from watchdog.daemon.config import LadderSettings, Live, Settings, live
from watchdog.daemon.holds import peer_hold, peer_traced
from watchdog.daemon.lifecycle import Key
from watchdog.daemon.signaller import Target
from watchdog.states import Mode
from watchdog.status import FenceSent, Incident, NodeStatus, PeerView

log = logging.getLogger(__name__)



@dataclass(eq=False)
class Response:
    """One hung job's response: the ranks it ends, the peers' answer it waits for,
    then its ladder."""

    keys: list[Key]
    started: float  # monotonic seconds
    uid: int
    job: str
    incident: Incident
    targets: list[Target]
    others_live: Callable[[], bool]
    may_hold: bool = False
    evidence: bool = True
    asking: Future[PeerView | None] | None = None
    ladder: Ladder | None = None
    failed: bool = False  # its start raised: its ranks are tried again
    verdict_at: float = 0.0  # the enforcer's clock at the verdict (the time boxes)
    term_at: float | None = None  # the enforcer's clock: no SIGTERM before (a fence's)
    fencing: Future[list[FenceSent]] | None = None  # the peers' answers to our fence
    fenced: bool = False  # the peers were told to hold theirs frozen until `term_at`
    hurried: bool = False  # ... and told again to end them now (our evidence was done)
    fenced_since: float = 0.0  # wall time the first fence found the job dead
    later: float = 0.0  # our SIGTERMs this long after the moment told (an exo job's, act/exo.py)

    @property
    def acting(self) -> Incident:
        """Its incident as it stands: the ladder's once begun, with the peers' cause."""
        return self.ladder.incident if self.ladder is not None else self.incident

    @property
    def working(self) -> bool:
        """Waiting on a worker (the peers, a sampler, a parse): what may get stuck."""
        if self.ladder is None:
            return self.asking is not None and not self.asking.done()
        return self.ladder.working


def _on_thread(fn: Callable[..., PeerView | None], *args: Any) -> Future[PeerView | None]:
    """`fn(*args)` on a daemon thread of its own (a view never queues behind another's
    slow peer; it ends by its own bound, Peers.view); its future."""
    future: Future[PeerView | None] = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # noqa: BLE001 - read by the step
                future.set_exception(err)

    threading.Thread(target=run, name="peer-view", daemon=True).start()
    return future


class Responses:
    """The responses under way, one per hung job: each started at a verdict (or a peer's
    fence), its ladder stepped by the loop through the `Enforcer`, its fences sent to
    the peers, its incident journalled before each next step."""

    def __init__(self, settings: Settings | Live, enforcer: Enforcer, peers: Peers,
                 snapshot: Callable[[], NodeStatus],
                 baseline: Callable[[], int | None]) -> None:
        self.live, self.enforcer, self.peers = live(settings), enforcer, peers
        self.snapshot, self.baseline = snapshot, baseline
        self.pending: list[Response] = []

    @property
    def settings(self) -> LadderSettings:
        """Read at use: a reload reaches a response under way."""
        return self.live.ladder

    def bound(self) -> float:
        """Seconds a response may take before it is presumed stuck (config.py)."""
        return self.settings.response_bound()

    def start(self, keys: list[Key], now: float, uid: int, job: str,
              incident: Incident, targets: list[Target],
              others_live: Callable[[], bool], *, ask_peers: bool, may_hold: bool,
              evidence: bool, term_in: float | None = None) -> None:
        """A response begun (or its peers asked first). `term_in`: seconds from now
        its SIGTERMs wait at least (a fence's, for its ranks frozen meanwhile)."""
        verdict_at = self.enforcer.clock()
        response = Response(keys, now, uid, job, incident, targets, others_live, may_hold,
                            evidence, verdict_at=verdict_at,
                            term_at=None if term_in is None else verdict_at + term_in)
        self.pending.append(response)
        try:
            if ask_peers:
                response.asking = _on_thread(self.peers.view, uid, job, self.snapshot())
            else:
                self._begin(response, None, asked=False)
        except Exception:  # noqa: BLE001 - the scan goes on; the ranks are retried
            log.exception("escalation failed; the hung ranks will be tried again")
            response.failed = True

    def causes(self) -> dict[Key, str | None]:
        """Each rank under a response: its incident's cause as it stands (the peers'
        view may have refined it since the verdict)."""
        return {key: response.acting.cause for response in self.pending
                for key in response.keys}

    def adopt(self, ladder: Ladder, keys: list[Key], now: float) -> None:
        """A response an earlier daemon left unfinished, resumed at start."""
        incident = ladder.incident
        self.pending.append(Response(keys, now, incident.uid or 0, incident.job or "",
                                     incident, ladder.targets, ladder.others_live,
                                     ladder=ladder))

    def _begin(self, response: Response, view: PeerView | None, asked: bool) -> None:
        incident = response.incident
        if asked and incident.culprit is None:
            # No local rank stopped: the peers' view names the rank that holds the job
            # up, with its host and pid (a frozen exo runner on the other Mac), for the
            # incident and for the fence that tells the peers.
            named = view_culprit(view)
            if named is not None:
                incident = response.incident = replace(incident, culprit=replace(
                    named, cause=incident.cause, summary=incident.summary))
        fencing = (response.evidence and self.settings.mode == Mode.ENFORCE  # a verdict of ours
                   and bool(self.live.peering.secret) and bool(self.live.peering.peers))
        term_at = response.term_at
        culprit = fence_culprit(incident, view)
        if fencing:
            # Every rank of the job ends at one moment, here and on the peers: the
            # evidence's time box from the verdict (the peers freeze theirs meanwhile);
            # an exo job's nodes but the first EXO_STAGGER later, each adding its own.
            term_at = response.verdict_at + self.settings.evidence_timeout + EVIDENCE_SLACK
            response.later = delay_here(response.job, incident.host or "", culprit.host,
                                        incident.host or "")
            term_at += response.later
        # Ours frozen first (a rank frozen sees no peer end), then the peers told.
        response.ladder = self.enforcer.begin(incident, response.targets, self.baseline(),
                                              response.others_live, view,
                                              evidence=response.evidence, asked=asked,
                                              verdict_at=response.verdict_at, term_at=term_at)
        if fencing and term_at is not None:
            # The peers wait on this job's end: fence them now, not after evidence,
            # grace and wired-memory settling (30 s and more).
            response.fenced_since = self.enforcer.wall()
            response.fencing = self.peers.fence(
                response.uid, response.job, f"{incident.verdict}: {incident.reason}",
                culprit, term_in=max(0.0, term_at - response.later - self.enforcer.clock()),
                since=response.fenced_since)
            response.fenced = response.fencing is not None

    def hurry(self, uid: int, job: str, term_in: float) -> None:
        """A fence for a job a response holds frozen already (the origin's evidence was
        done before the moment it had announced): its SIGTERM no later than `term_in`
        seconds from now."""
        due = self.enforcer.clock() + term_in
        for response in self.pending:
            if (response.uid, response.job) == (uid, job) and response.ladder is not None:
                response.ladder.term_at = min(response.ladder.term_at, due)

    def ask_bound(self) -> float:
        """Seconds the peers' answer is waited for (Peers.view: a background ask
        under way, then a fresh one), with room to spare."""
        return 2 * self.settings.peer_timeout + 3.0

    def _answered(self, response: Response) -> Outcome | None:
        """The peers answered (or their bound is out): hold (its outcome), or begin
        the ladder (None)."""
        assert response.asking is not None
        if not response.asking.done():
            response.asking.cancel()
            view: PeerView | None = PeerView(
                error=f"the peers did not answer within {self.ask_bound():g}s")
        else:
            try:
                view = response.asking.result()
            except Exception as err:  # noqa: BLE001 - the kill must not wait on peers
                view = PeerView(error=str(err))
        response.asking = None
        # Past every other excuse's bound, a person's tracer on a peer still holds the
        # job (not when a peer fenced it: `evidence` is False then).
        held = (peer_hold(view, response.incident) if response.may_hold
                else peer_traced(view) if response.evidence else "")
        if held:
            return Outcome(response.incident, held=held)
        response.incident = with_view(response.incident, view)
        log.error("%s", told.verdict_line(response.incident, self.settings.mode == Mode.ENFORCE,
                                          (t.rank for t in response.targets)))
        self._begin(response, view, asked=True)
        return None

    def step(self, now: float) -> list[tuple[list[Key], Outcome | None]]:
        """Every response's steps that are due; each one that ended, with what it did
        (None: it failed, or a worker of it was presumed stuck)."""
        ended: list[tuple[list[Key], Outcome | None]] = []
        for response in list(self.pending):
            failed = response.failed
            if failed:
                outcome = None
            elif (response.ladder is not None and response.working
                  and now - response.started > self.bound()):
                # Past every step's bound (a worker that never returns): closed with
                # what is known, never dropped, for it may have signalled.
                outcome = self._close(response, f"still working after "
                                                f"{now - response.started:.0f}s")
                failed = outcome is None
            else:
                try:
                    outcome = self._step(response)
                except Exception:  # noqa: BLE001 - the loop goes on
                    log.exception("escalation failed")
                    # Begun: closed with what is known. Else its ranks are tried again.
                    outcome = self._close(response, "its step failed")
                    failed = outcome is None
            if outcome is not None or failed:
                self.pending.remove(response)
                ended.append((response.keys, outcome))
                if outcome is not None and not outcome.held:
                    level, line = told.end_line(outcome.incident)
                    log.log(level, "%s", line)  # one line: how it ended
        return ended

    def _close(self, response: Response, why: str) -> Outcome | None:
        """A begun ladder closed unfinished (its outcome); None when it had not begun
        (nothing was signalled: its ranks are tried again)."""
        if response.ladder is None:
            return None
        try:
            return self.enforcer.close_unfinished(response.ladder, why)
        except Exception:  # noqa: BLE001 - the loop goes on
            log.exception("closing incident %s failed", response.incident.id)
            return None

    def _step(self, response: Response) -> Outcome | None:
        if response.ladder is None:
            if response.working and \
                    self.enforcer.clock() - response.verdict_at < self.ask_bound():
                return None
            held = self._answered(response)
            if held is not None:
                return held
        assert response.ladder is not None
        if response.fencing is not None and response.fencing.done():
            self._fenced(response.ladder, response.fencing)
            response.fencing = None
        ladder = response.ladder
        if response.fenced and not response.hurried and ladder.step is Step.HOLD \
                and self.enforcer.clock() < ladder.term_at:
            # Our evidence is in before the moment the peers were told: tell them again,
            # to end theirs now, and end ours with them (their SIGTERMs a fence's trip
            # after ours).
            response.hurried = True
            self.peers.fence(response.uid, response.job,
                             f"{ladder.incident.verdict}: {ladder.incident.reason}",
                             ladder.incident.culprit, term_in=0.0,
                             since=response.fenced_since,  # never a relaunch since
                             again=True)
            ladder.term_at = self.enforcer.clock() + response.later
        return self.enforcer.step(ladder)

    def _fenced(self, ladder: Ladder, fencing: Future[list[FenceSent]]) -> None:
        """The peers' answers to our fence: one that did not take it (unreachable, a
        refusal) ends its ranks by its own verdict, unfrozen meanwhile; the incident
        says so."""
        try:
            answers = fencing.result()
        except Exception as err:  # noqa: BLE001 - a failed send is a result
            missed = [f"fence not sent ({err})"]
        else:
            missed = [f"peer {a.peer} did not take the fence ({a})" for a in answers
                      if a.answer is None or a.answer.error is not None]
        if missed:
            said = ladder.incident.freeze
            ladder.incident = replace(ladder.incident, freeze="; ".join(
                [said] + missed if said else missed))

    def finish(self, clock: Clock) -> None:
        """At the daemon's stop: step every response to its end, for at most the
        ladder's own bounds (what is left is completed by the next daemon, from the
        journal). `clock` is the loop's."""
        until = clock.monotonic() + self.settings.ladder_span()
        while self.pending and clock.monotonic() < until:
            self.step(clock.monotonic())
            if self.pending:
                clock.sleep(self.enforcer.TICK)
