"""A health answer per job, for load balancers and supervisors (docs/metrics.md).

    GET /jobs/<job>/health[?uid=N]                 the job's ranks on this node
    GET /jobs/<job>/ranks/<rank>/health[?uid=N]    one of them

200 while every rank progresses or is idle (`hb.idle()`: a server waiting for
requests), 503 while one is suspect, hung, stopped, being ended by the watchdog, or
gone, 404 while this node holds no rank of it; the body is one small JSON object:
`{"job", "uid", "rank", "healthy", "state", "reason", "ranks": [...]}`, `state` one of
`running`, `idle`, `suspect`, `hung`, `stopped`, `ending`, `ended`, `unknown`.

Built once per snapshot (`Index.build`, on the daemon's loop), each answer computed
once for it (`MEMO` of them, `LISTED` ranks listed), so a request costs a dictionary
lookup: the endpoint is open to every local user, and no path may cost the daemon
much. A job id in a path is checked (at most
`MAX_JOB` characters, no control character) and only ever echoed JSON-encoded. Any
user may publish a record naming any job id: `?uid=` counts only that owner's ranks
(a load balancer in front of a shared machine should give it).

The newest of each rank is judged: a rank ended whose number a live rank of the job
holds again is an earlier launch (the job relaunched under its name), not this one.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from watchdog.states import ENDED, HUNG, State
from watchdog.status import RankStatus
from watchdog.text import printable

__all__ = ["MAX_JOB", "Index", "parse"]

MAX_JOB = 256  # characters of a job id in a path (the record holds far fewer)
MEMO = 256  # answers kept per snapshot
LISTED = 64  # ranks listed in an answer's body (the one that decides always is)
_PATH = re.compile(r"/jobs/([^/]+)(?:/ranks/(\d{1,6}))?/health")
_QUERY = re.compile(r"uid=(\d{1,10})")

# A rank's state -> the job's word for it and whether it holds the job healthy; the
# first of a job's ranks in this order speaks for it.
_ORDER = ("ending", "hung", "stopped", "suspect", "unknown", "ended", "running", "idle")


@dataclass(frozen=True)
class Asked:
    """What a health request asks: a job (and a rank of it), of an owner or any."""

    job: str
    rank: int | None = None
    uid: int | None = None


def parse(path: str) -> Asked | None | str:
    """The request's path (with its query) as a health question; None when it is no
    health path; a sentence when it is one, malformed (a 400)."""
    where, _, query = path.partition("?")
    found = _PATH.fullmatch(where)
    if found is None:
        return None
    try:
        job = unquote(found.group(1), errors="strict")
    except UnicodeDecodeError:
        return "a job id is UTF-8, percent-encoded"
    if len(job) > MAX_JOB or printable(job) != job:
        return f"a job id is at most {MAX_JOB} printable characters"
    uid = None
    if query:
        by_uid = _QUERY.fullmatch(query)
        if by_uid is None:
            return "the only query is uid=N (the job's owner)"
        uid = int(by_uid.group(1))
    return Asked(job, int(found.group(2)) if found.group(2) else None, uid)


def _word(r: RankStatus, ending: bool) -> str:
    if ending:
        return "ending"
    state = r.state or ""
    if state in HUNG:
        return "hung"
    if state in ENDED:
        return "ended"
    return {State.STOPPED.value: "stopped", State.SUSPECT.value: "suspect",
            State.RUNNING.value: "running", State.IDLE.value: "idle"}.get(state, "unknown")


def _why(word: str, r: RankStatus) -> str:
    said = printable(r.reason or "")[:300]
    what = {"ending": "is being ended by the watchdog", "hung": f"is {r.state}",
            "stopped": "is stopped (SIGSTOP, Ctrl-Z or a debugger): the job cannot progress",
            "suspect": "is suspect (in a wait past half its deadline)",
            "unknown": f"is {r.state or 'not judged yet'}",
            "ended": f"{r.state}" + ("" if r.state == State.KILLED.value else " (gone)"),
            "running": "progresses", "idle": "is idle (waiting for requests)"}[word]
    return f"rank {r.rank} (pid {r.pid}) {what}" + (f": {said}" if said and word not in (
        "running", "idle") else "")


class Index:
    """Each job's ranks on this node as last published, with whether a response of the
    watchdog has them; answers a health question in a lookup."""

    def __init__(self, jobs: dict[str, list[tuple[RankStatus, bool]]] | None = None) -> None:
        self.jobs = jobs or {}
        # Each question's answer, computed once for this snapshot (bounded: a question
        # past MEMO is answered anew, at the cost of one job's ranks).
        self._memo: dict[Asked, tuple[int, bytes]] = {}
        self._lock = threading.Lock()

    @classmethod
    def build(cls, ranks: Iterable[RankStatus], ending: Collection[int]) -> Index:
        """From a snapshot's ranks and the pids a response is ending (or judging)."""
        jobs: dict[str, list[tuple[RankStatus, bool]]] = {}
        for r in ranks:
            jobs.setdefault(r.job, []).append((r, r.pid in ending))
        return cls(jobs)

    def answer(self, asked: Asked) -> tuple[int, bytes]:
        """(HTTP status, JSON body) of a health question."""
        with self._lock:
            known = self._memo.get(asked)
        if known is not None:
            return known
        answer = self._answer(asked)
        with self._lock:
            if len(self._memo) < MEMO:
                self._memo[asked] = answer
        return answer

    def _answer(self, asked: Asked) -> tuple[int, bytes]:
        ranks = [(r, ending) for r, ending in self.jobs.get(asked.job, ())
                 if (asked.uid is None or r.uid == asked.uid)
                 and (asked.rank is None or r.rank == asked.rank)]
        # An ended rank whose number a live rank holds again: an earlier launch.
        live_numbers = {r.rank for r, _ in ranks if r.state not in ENDED}
        ranks = [(r, ending) for r, ending in ranks
                 if r.state not in ENDED or r.rank not in live_numbers]
        body: dict[str, object] = {"job": asked.job, "uid": asked.uid, "rank": asked.rank}
        if not ranks:
            what = "job" if asked.rank is None else f"rank {asked.rank} of the job"
            body.update(healthy=False, state="unknown",
                        reason=f"no {what} on this node (not started yet, or its records "
                               "are forgotten once ended)", ranks=[])
            return 404, _encode(body)
        words = [(_word(r, ending), r) for r, ending in ranks]
        word, first = min(words, key=lambda wr: (_ORDER.index(wr[0]), wr[1].rank or 0))
        healthy = word in ("running", "idle")
        body.update(healthy=healthy, state=word,
                    reason=("every rank progresses or is idle" if healthy
                            else _why(word, first)),
                    ranks=[{"rank": r.rank, "pid": r.pid, "uid": r.uid, "state": w}
                           for w, r in words[:LISTED]])
        return (200 if healthy else 503), _encode(body)


def _encode(body: dict[str, object]) -> bytes:
    return (json.dumps(body) + "\n").encode()  # ASCII: every character escaped
