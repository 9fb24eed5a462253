"""The cluster view: every node's `/status`, grouped by job, with the culprit named.

On a cluster with one rank per Mac, each daemon sees one rank and cannot tell
a rank waiting on a frozen peer from the frozen peer itself. Lining up all
ranks of a job does: the waiting ranks sit in the same collective, and the
culprit is the one that is stopped, gone, elsewhere, or furthest behind. A job
is `healthy` only when nothing says otherwise: `hung`, `unknown` (a rank behind
an unreachable node while another waits) and `ended` (every rank gone, or the
watchdog ended some; each rank with what happened to it) are told apart.
`analyze` is pure; `gather` does the HTTP, concurrently, with a timeout each.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from watchdog import cause
from watchdog.record import MAX_WORLD_SIZE
from watchdog.states import ENDED, HUNG, WAITING_PHASES, State
from watchdog.status import RANK_FIELDS, NodeStatus, RankStatus
from watchdog.text import printable

__all__ = ["RANK_FIELDS", "Seen", "analyze", "fetch", "gather", "judge_job", "render_text"]

MAX_STATUS_BYTES = 16 << 20


def fetch(peer: str, timeout: float) -> dict[str, Any]:
    """One node's `/status`: {"peer", "ok", "status" (a NodeStatus) or "error"}."""
    try:
        with urllib.request.urlopen(f"http://{peer}/status", timeout=timeout) as response:
            answer = json.loads(response.read(MAX_STATUS_BYTES))
        if not isinstance(answer, dict) or not isinstance(answer.get("ranks"), list):
            raise ValueError("not an mlx-watchdog /status")
        status = NodeStatus.from_json(answer)
        return {"peer": peer, "ok": True, "status": status}
    except Exception as err:  # noqa: BLE001 - an unreachable node is a result
        return {"peer": peer, "ok": False, "error": str(getattr(err, "reason", err))}


@dataclass(frozen=True)
class Seen:
    """A rank as one node reported it: the rank, and the peer that answered."""

    node: str | None
    rank: RankStatus

    def to_json(self) -> dict[str, Any]:
        return {**self.rank.to_json(), "node": self.node}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Seen:
        """ValueError if the rank is malformed (status.RankStatus.from_json)."""
        node = data.get("node")
        return cls(node if isinstance(node, str) else None, RankStatus.from_json(dict(data)))


def _status(node: dict[str, Any]) -> NodeStatus:
    """A node's answer, read through the contract (a peer's JSON may come as such)."""
    status = node.get("status")
    if isinstance(status, NodeStatus):
        return status
    try:
        return NodeStatus.from_json(status)
    except ValueError:
        return NodeStatus()


def gather(peers: list[str] | tuple[str, ...], timeout: float) -> list[dict[str, Any]]:
    if not peers:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(peers))) as pool:
        return list(pool.map(lambda p: fetch(p, timeout), peers))


def _last(seen: Seen) -> int:
    last = seen.rank.last_collective
    return last.number if last is not None and last.number is not None else 0


def _where(rank: RankStatus | dict[str, Any]) -> str:
    if isinstance(rank, dict):  # a rank of a view (render_text): its JSON
        last = rank.get("last_collective") or {}
        return f"{last.get('op', '?')} #{last.get('number', 0)}" if last else "no collective yet"
    c = rank.last_collective
    return f"{c.op if c.op is not None else '?'} #{c.number if c.number is not None else 0}" \
        if c is not None else "no collective yet"


def _culprit(seen: Seen, reason: str) -> dict[str, Any]:
    r = seen.rank
    return {"host": r.host, "node": seen.node, "rank": r.rank, "pid": r.pid, "state": r.state,
            "reason": reason}


def judge_job(job: str, ranks: Sequence[Seen | Mapping[str, Any]], unreachable: list[str],
              uid: int | None = None) -> dict[str, Any]:
    """Healthy or hung, and if hung, which rank holds the job up and why. A rank given
    as JSON is read through the contract (a malformed one raises ValueError)."""
    def order(seen: Seen) -> tuple[int, int]:
        return (seen.rank.rank if seen.rank.rank is not None else -1, seen.rank.pid or 0)

    seen = sorted((r if isinstance(r, Seen) else Seen.from_json(r) for r in ranks), key=order)
    # A peer's /status is untrusted: sizes are bounded before any range is built.
    sizes = [s.rank.world_size for s in seen]
    world = min(MAX_WORLD_SIZE, max([n for n in sizes if n is not None] + [len(seen)]))
    present = {s.rank.rank for s in seen}
    missing = [i for i in range(world) if i not in present]
    waiting = [s for s in seen if s.rank.phase in WAITING_PHASES and s.rank.state not in ENDED]
    hung = any(s.rank.state in HUNG for s in seen)
    troubled = [s for s in seen if s.rank.state in (ENDED | {State.STOPPED})]
    if waiting and troubled:
        hung = True
    stopped_live = [s for s in seen if s.rank.state == State.STOPPED]
    if stopped_live and any(s.rank.state in ENDED for s in seen):
        hung = True  # its peers are gone and a stopped rank of it is left behind
    # A rank behind an unreachable node cannot be seen: while another rank of the
    # job waits (on it, perhaps), the job is not known to be healthy.
    # Nor known to be over: a rank ended here says nothing of one behind a node
    # that does not answer, which may still hold the job's other ranks.
    unknown = not hung and bool(missing and unreachable) and bool(
        waiting or any(s.rank.state in ENDED for s in seen))
    # Every rank gone, or the watchdog ended some: the job is over, whatever waits.
    ended = not hung and not unknown and bool(seen) and (
        all(s.rank.state in ENDED for s in seen)
        or any(s.rank.state == State.KILLED for s in seen))
    state = "hung" if hung else "unknown" if unknown else "ended" if ended else "healthy"
    view: dict[str, Any] = {"job": job, "uid": uid, "world_size": world,
                            "state": state, "ranks": [s.to_json() for s in seen],
                            "missing_ranks": missing,
                            "culprit": None, "evidence": "", "cause": None, "summary": ""}
    if ended:
        view["evidence"] = "; ".join(
            f"rank {s.rank.rank} on {s.rank.host}: {s.rank.state}"
            + (f" ({s.rank.reason})" if s.rank.reason else "") for s in seen)
        return view
    if not hung and not unknown:
        return view
    finding = cause.decide([s.rank for s in seen], missing, unreachable)
    view["cause"], view["summary"] = finding.cause, finding.summary
    names = ",".join(str(s.rank.rank) for s in waiting)
    wait_note = (f"ranks {names} wait in {_where(waiting[0].rank)}" if waiting
                 else "no rank waits")
    stopped = [s for s in seen if s.rank.state == State.STOPPED]
    gone = [s for s in seen if s.rank.state in ENDED]
    outside = [s for s in seen
               if s.rank.phase not in WAITING_PHASES and s not in stopped + gone]
    if stopped:
        r = stopped[0]
        culprit = _culprit(r, f"stopped at {_where(r.rank)} while its peers wait")
        note = f"rank {r.rank.rank} is stopped at {_where(r.rank)}"
    elif gone and not unknown:
        r = gone[0]
        culprit = _culprit(r, f"{r.rank.state} at {_where(r.rank)}: "
                              f"{r.rank.reason or ''}".strip())
        note = f"rank {r.rank.rank} is gone ({r.rank.state}) at {_where(r.rank)}"
    elif missing:
        culprit = {"host": None, "node": None, "rank": missing[0], "pid": None,
                   "state": "unknown", "reason": "not reported by any reachable node"
                   + (f" (unreachable: {', '.join(unreachable)})" if unreachable else "")}
        note = f"rank {missing[0]} is not reported by any node"
    elif outside and waiting:
        r = outside[0]
        culprit = _culprit(r, f"outside a wait ({r.rank.phase}) at {_where(r.rank)} while "
                              "its peers wait")
        note = f"rank {r.rank.rank} is {r.rank.phase} at {_where(r.rank)}"
    else:
        r = min(seen, key=_last)
        culprit = _culprit(r, f"furthest behind, at {_where(r.rank)}")
        note = f"rank {r.rank.rank} is furthest behind at {_where(r.rank)}"
    if unknown and gone:  # what is known of the job: its ranks that ended here
        note += "; " + "; ".join(
            f"rank {s.rank.rank} on {s.rank.host}: {s.rank.state}"
            + (f" ({s.rank.reason})" if s.rank.reason else "") for s in gone)
    view["culprit"] = culprit
    view["evidence"] = f"{wait_note}; {note}"
    return view


def analyze(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Group every reachable node's ranks by job and judge each job."""
    # A job is (owner uid, job id): another user's ranks naming the same id
    # are another job, and never its culprit.
    jobs: dict[tuple[int, str], list[Seen]] = {}
    # A node whose earlier ask failed but which answered since (late) is reachable.
    answered = {n["peer"] for n in nodes if n["ok"]}
    unreachable = [n["peer"] for n in nodes if not n["ok"] and n["peer"] not in answered]
    seen: set[tuple[Any, Any]] = set()  # a node listed twice (or itself) counts once
    statuses = [_status(n) if n["ok"] else None for n in nodes]
    for node, status in zip(nodes, statuses, strict=True):
        if status is None:
            continue
        for rank in status.ranks:
            key = (rank.host, rank.pid)
            if key not in seen:
                seen.add(key)
                owner = rank.uid if rank.uid is not None else -1
                jobs.setdefault((owner, rank.job), []).append(Seen(node["peer"], rank))
    return {
        "nodes": [{"peer": n["peer"], "ok": n["ok"], "error": n.get("error"),
                   "host": status.host if status else None,
                   "reboot_required": status.reboot_required if status else None}
                  for n, status in zip(nodes, statuses, strict=True)],
        "jobs": [judge_job(job, ranks, unreachable, uid if uid >= 0 else None)
                 for (uid, job), ranks in sorted(jobs.items(), key=lambda kv: kv[0][::-1])],
    }


def render_text(view: dict[str, Any]) -> str:
    lines = []
    for node in view["nodes"]:
        state = (f"ok ({node['host']})" if node["ok"] else f"UNREACHABLE: {node['error']}")
        flag = "  REBOOT REQUIRED" if node.get("reboot_required") else ""
        lines.append(f"node {node['peer']}: {state}{flag}")
    for job in view["jobs"]:
        lines.append("")
        owner = f" of uid {job['uid']}" if job.get("uid") is not None else ""
        lines.append(f"job {job['job']}{owner} ({job['world_size']} ranks): "
                     f"{job['state'].upper()}")
        for r in job["ranks"]:
            lines.append(f"  rank {r.get('rank')}  {r.get('host')} pid {r.get('pid')}  "
                         f"{r.get('state')}  {r.get('phase')}  at {_where(r)}  "
                         f"progress {r.get('progress')}")
        for missing in job["missing_ranks"]:
            lines.append(f"  rank {missing}  (not reported)")
        if job["culprit"]:
            c = job["culprit"]
            lines.append(f"  culprit: rank {c['rank']} on {c['host'] or c['node'] or '?'}"
                         f" (pid {c['pid']}): {c['reason']}")
        if job.get("cause"):
            lines.append(f"  cause: {job['cause']}: {job.get('summary') or ''}")
        if job["evidence"]:
            lines.append(f"  evidence: {job['evidence']}")
    if not view["jobs"]:
        lines.append("no ranks on any reachable node")
    return "\n".join(printable(line) for line in lines)  # peers' strings are untrusted
