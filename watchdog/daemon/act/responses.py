"""Responses under way: each hung job's response runs on a worker thread while the
loop keeps scanning, and the loop collects what each one did (a typed `Outcome`).

A response first asks the peers, where there are any, whether a rank of the job
computes on another node (then it holds: a slow peer is not a hang); else it
fences the peers at once and runs the enforcer's ladder. One that runs past every
step's own bounds is presumed stuck and handed back, so its ranks are tried again
beside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from watchdog.daemon.act.enforcer import Enforcer, Outcome
from watchdog.daemon.act.peers import Peers
from watchdog.daemon.config import Settings
from watchdog.daemon.signaller import Target
from watchdog.status import Culprit, Incident, NodeStatus

log = logging.getLogger(__name__)

Key = tuple[int, float]  # a rank: (pid, start time)
Fence = Callable[[int, str, str, "Culprit | None"], None]


class Responses:
    def __init__(self, settings: Settings, enforcer: Enforcer, peers: Peers,
                 executor: ThreadPoolExecutor, fence: Fence,
                 snapshot: Callable[[], NodeStatus],
                 baseline: Callable[[], int | None]) -> None:
        self.settings, self.enforcer, self.peers = settings, enforcer, peers
        self.executor, self.fence = executor, fence
        self.snapshot, self.baseline = snapshot, baseline
        self.pending: dict[Future[Outcome], list[Key]] = {}
        self.since: dict[Future[Outcome], float] = {}

    def bound(self) -> float:
        """Seconds a response may take before it is presumed stuck: every step's own
        bound, with room to spare."""
        s = self.settings
        return 2 * (s.peer_timeout + s.evidence_timeout + s.grace + s.kill_timeout
                    + s.settle) + 30.0

    def start(self, keys: list[Key], now: float, uid: int, job: str,
              incident: Incident, targets: list[Target],
              others_live: Callable[[], bool], *, ask_peers: bool, may_hold: bool,
              evidence: bool) -> None:
        future = self.executor.submit(self.respond, uid, job, incident, targets, others_live,
                                      ask_peers, may_hold, evidence)
        self.pending[future] = keys
        self.since[future] = now

    def adopt(self, future: Future[Outcome], keys: list[Key], now: float) -> None:
        """A response started elsewhere (an earlier daemon's, completed at start)."""
        self.pending[future] = keys
        self.since[future] = now

    def respond(self, uid: int, job: str, incident: Incident, targets: list[Target],
                others_live: Callable[[], bool], ask_peers: bool, may_hold: bool,
                evidence: bool) -> Outcome:
        """On the worker thread: hold, or fence the peers and end the ranks."""
        view: dict[str, Any] | None = None
        if ask_peers:
            try:
                view = self.peers.view(uid, job, self.snapshot())
            except Exception as err:  # noqa: BLE001 - the kill must not wait on peers
                view = {"error": str(err)}
            busy = (view or {}).get("computing") or []
            if busy and may_hold:
                names = ", ".join(f"{b['rank']} on {b['host']}" for b in busy)
                return Outcome(incident, held=f"held: rank {names} of the job is computing "
                                              "(a slow peer, not a hang)")
            log.error("job %s: %s; %s %s ranks %s", job, incident.reason,
                      "ending" if self.settings.mode == "enforce" else "observing",
                      len(targets), sorted(t.rank for t in targets))
        if evidence and self.settings.mode == "enforce":  # a verdict of ours, not a fence
            # The peers wait on this job's end: fence them now, not after evidence,
            # grace and wired-memory settling (30 s and more).
            self.fence(uid, job, f"{incident.verdict}: {incident.reason}", incident.culprit)
        return self.enforcer.handle(incident, targets, self.baseline(), others_live,
                                    cluster=(lambda: view) if ask_peers else None,
                                    evidence=evidence)

    def overdue(self, now: float) -> list[list[Key]]:
        """The ranks of responses presumed stuck (a sampler that ignores its kill, a
        hung filesystem), no longer waited for."""
        stuck = []
        for future, started in list(self.since.items()):
            if not future.done() and now - started > self.bound():
                stuck.append(self.pending.pop(future))
                del self.since[future]
                log.error("an escalation has run for %.0fs; trying those ranks again",
                          now - started)
        return stuck

    def finished(self) -> list[tuple[list[Key], Outcome | None]]:
        """Each response that ended, with what it did (None: it failed)."""
        ended: list[tuple[list[Key], Outcome | None]] = []
        for future in [f for f in self.pending if f.done()]:
            keys = self.pending.pop(future)
            self.since.pop(future, None)
            try:
                ended.append((keys, future.result()))
            except Exception:  # noqa: BLE001 - the loop goes on; the ranks are retried
                log.exception("escalation failed; the hung ranks will be tried again")
                ended.append((keys, None))
        return ended
