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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from watchdog.record import MAX_WORLD_SIZE
from watchdog.states import ENDED, HUNG, WAITING_PHASES, State
from watchdog.text import printable

MAX_STATUS_BYTES = 16 << 20


def fetch(peer: str, timeout: float) -> dict[str, Any]:
    """One node's `/status`: {"peer", "ok", "status" or "error"}."""
    try:
        with urllib.request.urlopen(f"http://{peer}/status", timeout=timeout) as response:
            status = json.loads(response.read(MAX_STATUS_BYTES))
        if not isinstance(status, dict) or not isinstance(status.get("ranks"), list):
            raise ValueError("not an mlx-watchdog /status")
        return {"peer": peer, "ok": True, "status": status}
    except Exception as err:  # noqa: BLE001 - an unreachable node is a result
        return {"peer": peer, "ok": False, "error": str(getattr(err, "reason", err))}


# What a rank of a peer's /status must hold to be lined up: field -> allowed types
# (None: the field may be missing or null). A peer's answer is untrusted input.
_INT, _STR, _OPT = (int,), (str,), (type(None),)
RANK_FIELDS: dict[str, tuple[type, ...]] = {
    "job": _STR, "host": _STR + _OPT, "pid": _INT + _OPT, "uid": _INT + _OPT,
    "rank": _INT + _OPT, "world_size": _INT + _OPT, "state": _STR + _OPT,
    "phase": _STR + _OPT, "reason": _STR + _OPT, "progress": _INT + _OPT,
    "collectives": _INT + _OPT, "computing": (bool,) + _OPT, "last_collective": (dict,) + _OPT,
}
COLLECTIVE_FIELDS: dict[str, tuple[type, ...]] = {"number": _INT + _OPT, "op": _STR + _OPT}


def _fits(item: dict[str, Any], fields: dict[str, tuple[type, ...]]) -> bool:
    for name, types in fields.items():
        value = item.get(name)
        # bool is an int to isinstance: only "computing" may be one.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return False
    return True


def valid_ranks(status: Any) -> list[dict[str, Any]]:
    """The ranks of one node's /status whose every field the view reads has its type;
    a malformed rank is dropped, never the view (nor the hold that relies on it)."""
    ranks = status.get("ranks") if isinstance(status, dict) else None
    if not isinstance(ranks, list):
        return []
    return [r for r in ranks if isinstance(r, dict) and _fits(r, RANK_FIELDS)
            and _fits(r.get("last_collective") or {}, COLLECTIVE_FIELDS)]


def _node_field(node: dict[str, Any], name: str, types: tuple[type, ...]) -> Any:
    status = node.get("status")
    value = status.get(name) if isinstance(status, dict) else None
    return value if isinstance(value, types) else None


def gather(peers: list[str] | tuple[str, ...], timeout: float) -> list[dict[str, Any]]:
    if not peers:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(peers))) as pool:
        return list(pool.map(lambda p: fetch(p, timeout), peers))


def _last(rank: dict[str, Any]) -> int:
    last = rank.get("last_collective") or {}
    number = last.get("number", 0) if isinstance(last, dict) else 0
    return number if isinstance(number, int) else 0


def _where(rank: dict[str, Any]) -> str:
    last = rank.get("last_collective") or {}
    return f"{last.get('op', '?')} #{last.get('number', 0)}" if last else "no collective yet"


def _culprit(rank: dict[str, Any], reason: str) -> dict[str, Any]:
    return {"host": rank.get("host"), "node": rank.get("node"), "rank": rank.get("rank"),
            "pid": rank.get("pid"), "state": rank.get("state"), "reason": reason}


def judge_job(job: str, ranks: list[dict[str, Any]], unreachable: list[str],
              uid: int | None = None) -> dict[str, Any]:
    """Healthy or hung, and if hung, which rank holds the job up and why."""
    def order(rank: dict[str, Any]) -> tuple[int, int]:
        number, pid = rank.get("rank"), rank.get("pid")  # a peer may send anything
        return (number if type(number) is int else -1, pid if type(pid) is int else 0)

    ranks = sorted(ranks, key=order)
    # A peer's /status is untrusted: sizes are bounded before any range is built.
    sizes = [r.get("world_size") for r in ranks]
    world = min(MAX_WORLD_SIZE, max([s for s in sizes if type(s) is int] + [len(ranks)]))
    present = {r.get("rank") for r in ranks}
    missing = [i for i in range(world) if i not in present]
    waiting = [r for r in ranks if r.get("phase") in WAITING_PHASES and r.get("state") not in ENDED]
    hung = any(r.get("state") in HUNG for r in ranks)
    troubled = [r for r in ranks if r.get("state") in (ENDED | {State.STOPPED})]
    if waiting and troubled:
        hung = True
    stopped_live = [r for r in ranks if r.get("state") == State.STOPPED]
    if stopped_live and any(r.get("state") in ENDED for r in ranks):
        hung = True  # its peers are gone and a stopped rank of it is left behind
    # A rank behind an unreachable node cannot be seen: while another rank of the
    # job waits (on it, perhaps), the job is not known to be healthy.
    unknown = not hung and bool(waiting and missing and unreachable)
    # Every rank gone, or the watchdog ended some: the job is over, whatever waits.
    ended = not hung and not unknown and bool(ranks) and (
        all(r.get("state") in ENDED for r in ranks)
        or any(r.get("state") == State.KILLED for r in ranks))
    state = "hung" if hung else "unknown" if unknown else "ended" if ended else "healthy"
    view: dict[str, Any] = {"job": job, "uid": uid, "world_size": world,
                            "state": state, "ranks": ranks,
                            "missing_ranks": missing,
                            "culprit": None, "evidence": ""}
    if ended:
        view["evidence"] = "; ".join(
            f"rank {r.get('rank')} on {r.get('host')}: {r.get('state')}"
            + (f" ({r.get('reason')})" if r.get("reason") else "") for r in ranks)
        return view
    if not hung and not unknown:
        return view
    names = ",".join(str(r.get("rank")) for r in waiting)
    wait_note = f"ranks {names} wait in {_where(waiting[0])}" if waiting else "no rank waits"
    stopped = [r for r in ranks if r.get("state") == State.STOPPED]
    gone = [r for r in ranks if r.get("state") in ENDED]
    outside = [r for r in ranks if r.get("phase") not in WAITING_PHASES and r not in stopped + gone]
    if stopped:
        r = stopped[0]
        culprit = _culprit(r, f"stopped at {_where(r)} while its peers wait")
        note = f"rank {r.get('rank')} is stopped at {_where(r)}"
    elif gone:
        r = gone[0]
        culprit = _culprit(r, f"{r.get('state')} at {_where(r)}: {r.get('reason', '')}".strip())
        note = f"rank {r.get('rank')} is gone ({r.get('state')}) at {_where(r)}"
    elif missing:
        culprit = {"host": None, "node": None, "rank": missing[0], "pid": None,
                   "state": "unknown", "reason": "not reported by any reachable node"
                   + (f" (unreachable: {', '.join(unreachable)})" if unreachable else "")}
        note = f"rank {missing[0]} is not reported by any node"
    elif outside and waiting:
        r = outside[0]
        culprit = _culprit(r, f"outside a wait ({r.get('phase')}) at {_where(r)} while its "
                              "peers wait")
        note = f"rank {r.get('rank')} is {r.get('phase')} at {_where(r)}"
    else:
        r = min(ranks, key=_last)
        culprit = _culprit(r, f"furthest behind, at {_where(r)}")
        note = f"rank {r.get('rank')} is furthest behind at {_where(r)}"
    view["culprit"] = culprit
    view["evidence"] = f"{wait_note}; {note}"
    return view


def analyze(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Group every reachable node's ranks by job and judge each job."""
    # A job is (owner uid, job id): another user's ranks naming the same id
    # are another job, and never its culprit.
    jobs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    unreachable = [n["peer"] for n in nodes if not n["ok"]]
    seen: set[tuple[Any, Any]] = set()  # a node listed twice (or itself) counts once
    for node in nodes:
        if not node["ok"]:
            continue
        for rank in valid_ranks(node["status"]):
            key = (rank.get("host"), rank.get("pid"))
            if key not in seen:
                seen.add(key)
                uid = rank.get("uid")
                owner = uid if type(uid) is int else -1
                jobs.setdefault((owner, rank["job"]), []).append({**rank, "node": node["peer"]})
    return {
        "nodes": [{"peer": n["peer"], "ok": n["ok"], "error": n.get("error"),
                   "host": _node_field(n, "host", (str,)),
                   "reboot_required": _node_field(n, "reboot_required", (bool,))}
                  for n in nodes],
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
        if job["evidence"]:
            lines.append(f"  evidence: {job['evidence']}")
    if not view["jobs"]:
        lines.append("no ranks on any reachable node")
    return "\n".join(printable(line) for line in lines)  # peers' strings are untrusted
