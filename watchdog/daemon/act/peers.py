"""The other nodes, from this daemon's side: the cluster view of one job, and the
job fences sent to the peers and checked when they come in.

Only with `peers` configured (and, for fences, a shared `secret`); a job is
named by its owner's uid with its id, so no fence can reach another user's job.

The peers are asked ahead of need: while a rank of ours waits past half its
deadline (or half its wedge deadline: the loop judges a job wedged across nodes from
these answers, `recent`), their `/status` is fetched in the background every PREFETCH_EVERY
seconds, so a verdict finds which peers are unreachable already known and its
first signal does not wait out their timeout again (those that answer are asked
again at the verdict: their answer must be current, and it takes milliseconds).
With a secret, a peer's answer counts only signed with it (net/cluster.py): one that
is not reads as unreachable.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from watchdog.daemon.act import told
from watchdog.daemon.config import Live, PeerSettings, Settings, live
from watchdog.daemon.judge import cluster as judge
from watchdog.net import cluster, fence
from watchdog.status import Culprit, Fence, FenceSent, NodeAnswer, NodeStatus, PeerView

log = logging.getLogger(__name__)

PREFETCH_EVERY = 2.0  # seconds between background asks while a rank of ours waits long
FRESH = 3.0  # seconds a background answer stands in for asking at a verdict
FENCED_KEPT = 600.0  # seconds a job fenced is remembered (its ranks' deaths not fenced again)


class Peers:
    """This node's peers: the fences it sends and accepts (signed, kept on disk across a
    restart), and their `/status` answers, asked in the background."""
    def __init__(self, settings: Settings | Live, host: str, executor: Executor,
                 started: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.live, self.host, self.executor = live(settings), host, executor
        self.started = started  # a fence signed before we started is refused
        # Kept on disk: a restart must not forget the fences it accepted (fence.py).
        self.nonces = fence.NonceCache(path=os.path.join(self.settings.state_dir,
                                                         fence.NONCES))
        self.clock, self.wall = clock, wall
        self._lock = threading.Lock()
        self._asked: tuple[float, list[NodeAnswer]] | None = None  # (when, answers)
        self._asking: Future[None] | None = None  # a background ask under way
        self._fenced: dict[tuple[int, str], float] = {}  # (uid, job) -> fenced since

    @property
    def settings(self) -> PeerSettings:
        """Read at use: a reload reaches the next ask."""
        return self.live.peering

    def prefetch(self, every: float = PREFETCH_EVERY) -> None:
        """Ask every peer in the background, unless an answer `every` seconds recent is
        there or one is on its way (a rank waiting long: every 2 s; a job judged across
        nodes, judge/across.py: every 10 s)."""
        if not self.settings.peers:
            return
        began = self.clock()
        with self._lock:
            if self._asking is not None or (
                    self._asked and began - self._asked[0] < every):
                return

            def ask() -> None:
                try:
                    nodes = cluster.gather(self.settings.peers, self.settings.peer_timeout,
                                           self.settings.secret)
                    with self._lock:
                        self._asked = (began, nodes)  # as old as the question, not the answer
                finally:
                    with self._lock:
                        self._asking = None

            try:
                self._asking = self.executor.submit(ask)
            except RuntimeError:  # the executor is shut down: the daemon is stopping
                self._asking = None

    def recent(self, within: float) -> list[NodeAnswer] | None:
        """The latest background ask's answers, one per peer, when it was asked within
        `within` seconds; else None. Never asks and never waits: the scan reads it."""
        with self._lock:
            asked = self._asked
        if asked is None or self.clock() - asked[0] > within:
            return None
        return [n for n in asked[1] if n.peer in self.settings.peers]

    def _remote(self) -> list[NodeAnswer]:
        """Every peer's answer. A peer that answered is asked again now (it answers in
        milliseconds, and what it says must be current: a rank that started computing
        a moment ago); one that did not answer a recent background ask is not waited
        on again (an unreachable peer holds nothing anyway)."""
        asking = self._asking
        if asking is not None:  # under way: its answer comes sooner than a new one's
            try:
                asking.result(timeout=self.settings.peer_timeout + 1.0)
            except Exception:  # noqa: BLE001, S110 - then ask anew below
                pass
        asked, peers = self._asked, self.settings.peers
        down: list[NodeAnswer] = []
        if asked is not None and self.clock() - asked[0] <= FRESH:
            down = [n for n in asked[1] if not n.ok and n.peer in peers]
        ask = [p for p in peers if p not in {n.peer for n in down}]
        return down + (cluster.gather(ask, self.settings.peer_timeout, self.settings.secret)
                       if ask else [])

    def view(self, uid: int, job: str, local: NodeStatus) -> PeerView | None:
        """This job of this owner across every node (the peers' answers within
        peer_timeout, or a recent background one; `local` our own snapshot), or None."""
        nodes = self._remote()
        nodes.append(NodeAnswer(judge.LOCAL, True, local))
        for view in judge.analyze(nodes, only=(uid, job)).jobs:  # that job alone
            if view.job == job and view.uid == uid:
                return judge.peer_view(view, [n.peer for n in nodes if not n.ok])
        return None

    def fence(self, uid: int, job: str, reason: str, culprit: Culprit | None,
              term_in: float | None = None, since: float | None = None,
              again: bool = False, incident: str | None = None
              ) -> Future[list[FenceSent]] | None:
        """Tell the peers to end their ranks of `job` owned by `uid` (only with a secret):
        frozen at once, SIGTERMed `term_in` seconds from now (None: at once), those that
        started before `since` (wall time the job was found dead; default now); `again`:
        the same fence sent again, logged once; `incident`: ours of the job (where its
        evidence here is), named to the peers. The fences' answers to come, or None when
        none is sent."""
        secret, peers = self.settings.secret, self.settings.peers
        if not secret or not peers:
            return None
        log.debug("fencing job %s of uid %s on %s: %s", job, uid, ", ".join(peers), reason)
        # Found dead now, whenever a busy pool sends it: a relaunch of the job that
        # starts on a peer before the fence reaches it is not the dead job.
        now = self.wall()
        since = now if since is None else since
        term_at = None if term_in is None else now + term_in
        self.note_fenced(uid, job, since)

        future: Future[list[FenceSent]] = Future()

        def send() -> None:
            try:
                answers = fence.send(peers, secret, job, self.host, reason, culprit,
                                     self.settings.peer_timeout, uid, since, term_at,
                                     incident)
            except Exception as err:  # noqa: BLE001 - a thread's error is lost otherwise
                log.error("fencing job %s of uid %s failed: %s", job, uid, err)
                future.set_exception(err)
                return
            level, line = told.fence_line(job, uid, reason, answers)
            # A fence again (its SIGTERM brought forward) is the same fence to a person:
            # logged once, unless a peer missed it.
            log.log(logging.DEBUG if again and level <= logging.INFO else level, "%s", line)
            future.set_result(answers)

        # Each fence on a thread of its own, each peer's exchange within peer_timeout:
        # never behind a view, another fence or a slow peer. Not a daemon thread: a
        # fence under way at the daemon's stop still reaches its peers (by its bound).
        threading.Thread(target=send, name=f"fence-{job}", daemon=False).start()
        return future

    def note_fenced(self, uid: int, job: str, since: float) -> None:
        """A fence of this job sent (its ranks started before `since`, wall time): a
        rank of it that dies after is no news to the peers."""
        with self._lock:
            for key, when in list(self._fenced.items()):
                if since - when > FENCED_KEPT:
                    del self._fenced[key]
            self._fenced[(uid, job)] = max(since, self._fenced.get((uid, job), since))

    def fenced_since(self, uid: int, job: str) -> float | None:
        """When this node last fenced this job (wall time), or None."""
        with self._lock:
            return self._fenced.get((uid, job))

    def verify(self, headers: Any, body: bytes) -> Fence:
        """An incoming fence, authenticated; raises fence.FenceRejected."""
        assert self.settings.secret
        return fence.verify(self.settings.secret, headers, body, self.nonces,
                            not_before=self.started)
