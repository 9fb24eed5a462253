"""The other nodes, from this daemon's side: the cluster view of one job, and the
job fences sent to the peers and checked when they come in.

Only with `peers` configured (and, for fences, a shared `secret`); a job is
named by its owner's uid with its id, so no fence can reach another user's job.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Executor, Future
from typing import Any

from watchdog.daemon.config import Settings
from watchdog.net import cluster, fence

log = logging.getLogger(__name__)


class Peers:
    def __init__(self, settings: Settings, host: str, executor: Executor,
                 started: float) -> None:
        self.settings, self.host, self.executor = settings, host, executor
        self.started = started  # a fence signed before we started is refused
        # Kept on disk: a restart must not forget the fences it accepted (fence.py).
        self.nonces = fence.NonceCache(path=os.path.join(settings.state_dir, fence.NONCES))

    def view(self, uid: int, job: str, local: dict[str, Any]) -> dict[str, Any] | None:
        """This job of this owner across every node (peers asked within peer_timeout,
        `local` our own snapshot), or None."""
        nodes = cluster.gather(self.settings.peers, self.settings.peer_timeout)
        nodes.append({"peer": "local", "ok": True, "status": local})
        for view in cluster.analyze(nodes)["jobs"]:
            if view["job"] == job and view.get("uid") == uid:
                computing = [{"rank": r.get("rank"), "host": r.get("host"), "pid": r.get("pid")}
                             for r in view["ranks"]
                             if r.get("node") != "local" and r.get("computing") is True
                             and r.get("state") not in ("stopped", "exited", "killed")]
                return {"culprit": view["culprit"], "evidence": view["evidence"],
                        "unreachable": [n["peer"] for n in nodes if not n["ok"]],
                        "computing": computing}
        return None

    def fence(self, uid: int, job: str, reason: str, culprit: dict[str, Any] | None) -> None:
        """Tell the peers to end their ranks of `job` owned by `uid` (only with a secret)."""
        secret, peers = self.settings.secret, self.settings.peers
        if not secret or not peers:
            return
        log.info("fencing job %s of uid %s on %s: %s", job, uid, ", ".join(peers), reason)

        def sent(future: Future[list[dict[str, Any]]]) -> None:
            for answer in future.result():
                log.info("fence of job %s to %s: %s", job, answer["peer"],
                         answer.get("answer") if answer["ok"] else answer.get("error"))

        self.executor.submit(fence.send, peers, secret, job, self.host, reason, culprit,
                             self.settings.peer_timeout, uid).add_done_callback(sent)

    def verify(self, headers: Any, body: bytes) -> dict[str, Any]:
        """An incoming fence, authenticated; raises fence.FenceRejected."""
        assert self.settings.secret
        return fence.verify(self.settings.secret, headers, body, self.nonces,
                            not_before=self.started)
