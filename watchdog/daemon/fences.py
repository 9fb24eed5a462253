"""Fences and orphans: a job known dead, ended here and on the peers.

Incoming: a peer's `POST /fence` is authenticated and its ranks picked on the HTTP
thread (for the 202 answer), then queued; the loop's thread begins their response
(`take`), so every ladder is stepped on one thread. Outgoing: a rank of a multi-rank
job that died without closing its record, or on an uncaught exception, fences its
job on the peers at once, and its local peers still alive PEER_DEATH_GRACE later are
ended too (`orphaned`): those alive when it died, never a relaunch started since.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from watchdog import procstat
from watchdog.daemon.act import told
from watchdog.daemon.act.exo import delay_here
from watchdog.daemon.act.incidents import death_culprit, new_id
from watchdog.daemon.act.ladder import EVIDENCE_SLACK
from watchdog.daemon.act.peers import Peers
from watchdog.daemon.config import Live, PeerSettings, Settings, live
from watchdog.daemon.lifecycle import Key, Rank
from watchdog.daemon.table import Death, RankTable
from watchdog.net import fence
from watchdog.status import Culprit, Fence, FenceAnswer

log = logging.getLogger(__name__)

# A rank of a job died (crash, signal, uncaught exception): its local peers still alive
# this long after are ended too. A ring rank exits on its own within milliseconds of
# "connection to a peer was lost"; mlx_lm.server's rank 0 does not (only its generation
# thread dies: the server stays up, deaf), nor does a rank whose wait never noticed.
# Those are then frozen and ended in the one teardown order. Not at once: a death is not
# our signal, and the ranks of a job ended by Ctrl-C or by a crash exit on their own; ended
# by us they would read as a job the watchdog tore down (and `launch --restart` would
# relaunch a Ctrl-C).
PEER_DEATH_GRACE = 5.0


@dataclass(frozen=True)
class Orphaned:
    """A job one of whose ranks died: when its live local ranks are ended, why, the
    dead rank as culprit, and those ranks (alive when it died)."""

    due_at: float  # monotonic seconds
    reason: str
    culprit: Culprit
    peers: frozenset[Key]


@dataclass(frozen=True)
class RanksToEnd:
    """A job to end on a fence (a peer's, or a local death's): the ranks it names."""

    uid: int
    job: str
    keys: frozenset[Key]
    fence: Fence
    incident: str = ""  # the id its answer gave (a peer's fence): its incident's


class Fences:
    """Jobs known dead: the peers' fences taken in (HTTP thread) and queued for the loop,
    this node's ranks' deaths fenced to the peers, and their orphans ended."""

    def __init__(self, settings: Settings | Live, host: str, peers: Peers, table: RankTable,
                 lock: threading.RLock, wake: threading.Event) -> None:
        self.live, self.host, self.peers, self.table = live(settings), host, peers, table
        self.lock, self.wake = lock, wake  # the rank table's lock; the loop's alarm
        # (uid, job) -> its orphans, for jobs one of whose ranks died.
        self.orphans: dict[tuple[int, str], Orphaned] = {}
        self._queue: list[RanksToEnd] = []  # incoming fences, for the loop's thread
        # (uid, job, term_in): fences for jobs whose ranks a response holds frozen
        # already: their SIGTERM brought forward (the origin's evidence was done early).
        self._hurry: list[tuple[int, str, float]] = []

    @property
    def settings(self) -> PeerSettings:
        """Read at use: a reload reaches the next fence."""
        return self.live.peering

    def request(self, headers: Any, body: bytes, sender: str = "") -> tuple[int, FenceAnswer]:
        """An incoming `POST /fence` from `sender` (its address; the HTTP thread):
        authenticate, pick our ranks of that job, and queue their end for the loop's
        thread. An unsigned challenge (`doctor`) is answered with the secret's proof,
        nothing done; every signed fence is one, whatever job it names."""
        if not self.settings.secret:
            return 403, FenceAnswer(error="fences are off (no secret configured)")
        try:
            challenge = fence.challenged(headers)
            if challenge is not None:
                log.debug("proved the fence secret to %s (`doctor`'s challenge)",
                          fence.sender_words(sender, body))
                return 200, FenceAnswer(proof=fence.proof(self.settings.secret, challenge))
            request = self.peers.verify(headers, body)
        except fence.FenceRejected as err:
            log.warning("refused a fence from %s: %s", fence.sender_words(sender, body),
                        fence.rejection_words(str(err)))
            return 401, FenceAnswer(error=str(err))
        job, uid = request.job, request.uid
        with self.lock:
            # Only the ranks of the job's owner (a fence names (uid, job)) that started
            # before the job was found dead: a later one is the job relaunched.
            named = self.table.job(uid, job)
            # On Linux its start to a tick: psutil's reads up to 1 s early (btime).
            ranks = [r for r in named if request.ends(
                procstat.wall_start(r.record.start_ticks) or r.record.start_time)]
            if len(ranks) < len(named):
                log.info("fence from %s: %s of job %s started after it was found dead (a "
                         "relaunch): left alone", request.origin,
                         told.ranks_words(r.record.rank for r in named if r not in ranks), job)
            if ranks:
                log.info("fence from %s: ending %s of job %s of uid %s (%s)", request.origin,
                         told.ranks_words(r.record.rank for r in ranks), job, uid,
                         request.reason)
            else:
                log.info("fence from %s: no rank of job %s of uid %s here to end (%s)",
                         request.origin, job, uid, request.reason)
            # Its incident's id, given in the answer: the origin's incident names it
            # (where the evidence of the job's ranks here is).
            incident = new_id(self.peers.wall()) if ranks else ""
            if ranks:
                self._queue.append(RanksToEnd(uid, job, frozenset(r.key for r in ranks), request,
                                              incident))
            else:  # held frozen by an earlier fence of the job, maybe: its SIGTERM now
                self._hurry.append((uid, job, self.term_in(request)))
            self.wake.set()  # the loop, maybe asleep for its interval, begins it
        return 202, FenceAnswer(job, uid, tuple(sorted(r.record.pid for r in ranks)),
                                incident=incident or None, host=self.host)

    def term_in(self, fenced: Fence) -> float:
        """Seconds a fenced job's ranks are held frozen before their SIGTERM: until the
        moment the origin named (the fence's `term_in`), at most this daemon's evidence
        time box, and for an exo job EXO_STAGGER more unless this node goes first
        (act/exo.py: the culprit's); at once for an older sender's fence, or a local
        death's."""
        held = fenced.term_in
        if fenced.local or not isinstance(held, (int, float)) or not held >= 0:
            return 0.0  # NaN too
        culprit = fenced.culprit.host if fenced.culprit is not None else None
        return min(float(held), self.settings.evidence_timeout + EVIDENCE_SLACK) \
            + delay_here(fenced.job, self.host, culprit, fenced.origin or "")

    def deaths(self, now: float) -> None:
        """The ranks the table found dead since it was last asked, each one's job fenced
        (`died`)."""
        for death in self.table.take_deaths():
            self.died(death, now)

    def died(self, death: Death, now: float) -> None:
        """A rank of a multi-rank job died: fence its job on the peers now, and end its
        local peers still alive after the grace."""
        rank = death.rank
        culprit = death_culprit(self.host, rank, death.how)
        fenced = self.peers.fenced_since(rank.record.uid, rank.record.job)
        if fenced is not None and rank.record.start_time <= fenced:
            # This node fenced its job already (a rank ending on the error the fence
            # caused): the peers know; a second fence would say it twice. (A fence taken
            # from a peer is answered by one of ours: our peers may not be its peers.)
            log.debug("rank %s of job %s %s after its job was fenced: not fenced again",
                      rank.record.rank, rank.record.job, death.how)
        else:
            self.peers.fence(rank.record.uid, rank.record.job,
                             f"rank {rank.record.rank} {death.how}", culprit)
        self.orphans.setdefault((rank.record.uid, rank.record.job), Orphaned(
            now + PEER_DEATH_GRACE,
            f"rank {rank.record.rank} (pid {rank.record.pid}) {rank.reason}: the job "
            "cannot finish without it", culprit, death.peers))

    def hurried(self) -> list[tuple[int, str, float]]:
        """Fences for jobs already under a response (the loop's thread): (uid, job,
        seconds from now their SIGTERM is due at the latest)."""
        hurried, self._hurry = self._hurry, []
        return hurried

    def queued(self) -> list[tuple[RanksToEnd, list[Rank]]]:
        """The peers' fences queued, to begin now (the loop's thread, under the table's
        lock); each with its ranks still there to end."""
        endings, self._queue = self._queue, []
        return self._alive(endings)

    def orphaned(self, now: float) -> list[tuple[RanksToEnd, list[Rank]]]:
        """The jobs whose dead rank's grace is out, with their ranks still alive (those
        that were alive when it died)."""
        endings = []
        for (uid, job), orphaned in list(self.orphans.items()):
            if now < orphaned.due_at:
                continue
            del self.orphans[(uid, job)]
            endings.append(RanksToEnd(uid, job, orphaned.peers, Fence(
                job=job, uid=uid, origin=self.host, reason=orphaned.reason,
                culprit=orphaned.culprit, local=True)))
        return self._alive(endings)

    def _alive(self, endings: list[RanksToEnd]) -> list[tuple[RanksToEnd, list[Rank]]]:
        taken = []
        for ending in endings:
            alive = [r for r in self.table.job(ending.uid, ending.job) if r.key in ending.keys]
            if alive:
                taken.append((ending, alive))
        return taken
