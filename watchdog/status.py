"""The daemon-to-everyone contract: what a rank, a node, an incident and a fence look like.

Data only, like `states.py`: frozen dataclasses with one `to_json()` and one
`from_json()` each, importing nothing from the daemon. The daemon builds them
(`daemon/view.py`, `daemon/publish.py`, `daemon/act/incidents.py`, the enforcer);
the HTTP endpoint, the metrics, the cluster view, the CLI and the demo read
them as attributes. `to_json()` gives the JSON the docs describe
(docs/metrics.md, `status --json`, `/status`, incidents.jsonl), key for key.

`from_json()` reads what another process wrote (a peer's `/status`, our own
`status.json`, incidents.jsonl, a write-ahead entry, a fence's body): it is
untrusted or may be older. A value of the wrong type becomes its default;
only what a reader cannot do without is refused (`ValueError`): a rank
whose lined-up fields have the wrong type (the cluster view drops that rank,
never the view), an incident without an id, a fence without job, uid or nonce.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

T = TypeVar("T")


class _Absent(enum.Enum):
    """A key not written yet (an incident's step to come), told from a null value."""

    ABSENT = 0

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Literal[_Absent.ABSENT] = _Absent.ABSENT
Absent = Literal[_Absent.ABSENT]


def _typed(value: Any, types: type | tuple[type, ...], default: T) -> Any:
    """`value` if it has one of `types` (a bool is no int here), else `default`."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        return default
    return value if isinstance(value, types) else default


def _int(value: Any) -> int | None:
    return _typed(value, int, None)  # type: ignore[no-any-return]


def _num(value: Any) -> float | None:
    return _typed(value, (int, float), None)  # type: ignore[no-any-return]


def _str(value: Any) -> str | None:
    return _typed(value, str, None)  # type: ignore[no-any-return]


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# -- a rank ------------------------------------------------------------------------------

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


def _fits(item: Mapping[str, Any], fields: dict[str, tuple[type, ...]]) -> bool:
    for name, types in fields.items():
        value = item.get(name)
        # bool is an int to isinstance: only "computing" may be one.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return False
    return True


@dataclass(frozen=True)
class Collective:
    """The last collective a rank issued: its number, op and bytes."""

    number: int | None
    op: str | None
    bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "op": self.op, "bytes": self.bytes}

    @classmethod
    def from_json(cls, data: Any) -> Collective | None:
        data = _obj(data)
        return cls(_int(data.get("number")), _str(data.get("op")),
                   _int(data.get("bytes"))) if data else None


@dataclass(frozen=True)
class Expect:
    """A window the rank announced (`hb.expect`): a wait that long is no stall."""

    seconds: float
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Any) -> Expect | None:
        data = _obj(data)
        if not data:
            return None
        return cls(_num(data.get("seconds")) or 0.0, _str(data.get("reason")) or "")


@dataclass(frozen=True)
class RankStatus:
    """One rank as users see it: an object of `status --json` and `/status` "ranks".

    Built by the daemon (and the CLI sampling with no daemon) with every field;
    a peer's rank may lack or null the optional ones."""

    job: str
    pid: int | None = None
    host: str | None = None
    uid: int | None = None
    rank: int | None = None
    world_size: int | None = None
    attempt: int | None = None  # which launch of the job (`mlx-watchdog launch`)
    backend: str | None = None
    state: str | None = None  # a State's value
    phase: str | None = None  # a Phase's label
    progress: int | None = None  # completed waits
    collectives: int | None = None
    steps: int | None = None
    seconds_since_progress: float | None = None
    seconds_in_wait: float | None = None
    deadline_seconds: float | None = None
    busiest_thread_cpu: float | None = None
    computing: bool | None = None
    current_op: str | None = None
    last_collective: Collective | None = None
    expect: Expect | None = None
    reason: str | None = None
    source: str | None = None  # "daemon" or "sampled"
    # In a wait of its own that holds the ranks waiting for it (a checkpoint being
    # written): what it does, as `held: rank R is ...` tells it; None otherwise.
    holding: str | None = None
    # The probe of its peers' data path while it waits long ("up", "down <address>
    # (<how>)", "not probed: <why>"), and the cause of the incident acting on it.
    data_link: str | None = None
    cause: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid, "host": self.host, "job": self.job, "uid": self.uid,
            "rank": self.rank, "world_size": self.world_size, "attempt": self.attempt,
            "backend": self.backend, "state": self.state, "phase": self.phase,
            "progress": self.progress, "collectives": self.collectives, "steps": self.steps,
            "seconds_since_progress": self.seconds_since_progress,
            "seconds_in_wait": self.seconds_in_wait,
            "deadline_seconds": self.deadline_seconds,
            "busiest_thread_cpu": self.busiest_thread_cpu,
            "computing": self.computing, "current_op": self.current_op,
            "last_collective": self.last_collective.to_json() if self.last_collective else None,
            "expect": self.expect.to_json() if self.expect else None,
            "reason": self.reason, "source": self.source, "holding": self.holding,
            "data_link": self.data_link, "cause": self.cause,
        }

    @classmethod
    def from_json(cls, data: Any) -> RankStatus:
        """A rank another process published; ValueError if a field the cluster view
        lines up has the wrong type (RANK_FIELDS), the others read as None then."""
        if not isinstance(data, dict) or not _fits(data, RANK_FIELDS) \
                or not _fits(data.get("last_collective") or {}, COLLECTIVE_FIELDS):
            raise ValueError("not a rank of an mlx-watchdog /status")
        return cls(
            job=data["job"], pid=data.get("pid"), host=data.get("host"), uid=data.get("uid"),
            rank=data.get("rank"), world_size=data.get("world_size"),
            attempt=_int(data.get("attempt")), backend=_str(data.get("backend")),
            state=data.get("state"), phase=data.get("phase"), progress=data.get("progress"),
            collectives=data.get("collectives"), steps=_int(data.get("steps")),
            seconds_since_progress=_num(data.get("seconds_since_progress")),
            seconds_in_wait=_num(data.get("seconds_in_wait")),
            deadline_seconds=_num(data.get("deadline_seconds")),
            busiest_thread_cpu=_num(data.get("busiest_thread_cpu")),
            computing=data.get("computing"), current_op=_str(data.get("current_op")),
            last_collective=Collective.from_json(data.get("last_collective")),
            expect=Expect.from_json(data.get("expect")), reason=data.get("reason"),
            source=_str(data.get("source")), holding=_str(data.get("holding")),
            data_link=_str(data.get("data_link")), cause=_str(data.get("cause")))


def valid_ranks(data: Any) -> tuple[RankStatus, ...]:
    """The ranks of a list whose every lined-up field has its type; a malformed one is
    dropped, never the others."""
    out = []
    for item in data if isinstance(data, list) else []:
        try:
            out.append(RankStatus.from_json(item))
        except ValueError:
            continue
    return tuple(out)


# -- a node ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CounterValues:
    """The daemon's counters as published (`counters` in /status)."""

    stalls: dict[str, int] = field(default_factory=dict)  # verdict -> hangs acted on
    kills: dict[str, int] = field(default_factory=dict)  # signal -> sent to end a rank
    job_kills: dict[str, int] = field(default_factory=dict)
    invalid_records: int = 0
    probe_errors: int = 0
    loop_errors: int = 0
    scan_buckets: tuple[int, ...] = ()  # per bound of scan_bucket_bounds, then +Inf
    scan_sum: float = 0.0
    scan_count: int = 0
    stall_causes: dict[str, int] = field(default_factory=dict)  # "verdict:cause" -> count

    def to_json(self) -> dict[str, Any]:
        return {"stalls": dict(self.stalls), "stall_causes": dict(self.stall_causes),
                "kills": dict(self.kills),
                "job_kills": dict(self.job_kills), "invalid_records": self.invalid_records,
                "probe_errors": self.probe_errors, "loop_errors": self.loop_errors,
                "scan_buckets": list(self.scan_buckets), "scan_sum": self.scan_sum,
                "scan_count": self.scan_count}

    @classmethod
    def from_json(cls, data: Any) -> CounterValues:
        data = _obj(data)

        def counts(value: Any) -> dict[str, int]:
            return {str(k): v for k, v in _obj(value).items() if _int(v) is not None}

        buckets = data.get("scan_buckets")
        return cls(counts(data.get("stalls")), counts(data.get("kills")),
                   counts(data.get("job_kills")), _int(data.get("invalid_records")) or 0,
                   _int(data.get("probe_errors")) or 0, _int(data.get("loop_errors")) or 0,
                   tuple(b for b in buckets if _int(b) is not None)
                   if isinstance(buckets, list) else (),
                   _num(data.get("scan_sum")) or 0.0, _int(data.get("scan_count")) or 0,
                   counts(data.get("stall_causes")))


@dataclass(frozen=True)
class Unwritten:
    """What a failed write left in memory (pending.Backlog): shown until it is on disk."""

    reboot_flags_unwritten: tuple[str, ...] = ()  # their reasons
    incidents_unwritten: tuple[str | None, ...] = ()  # their ids
    write_failures: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"reboot_flags_unwritten": list(self.reboot_flags_unwritten),
                "incidents_unwritten": list(self.incidents_unwritten),
                "write_failures": self.write_failures}

    @classmethod
    def from_json(cls, data: Any) -> Unwritten:
        data = _obj(data)
        flags, ids = data.get("reboot_flags_unwritten"), data.get("incidents_unwritten")
        return cls(tuple(str(f) for f in flags) if isinstance(flags, list) else (),
                   tuple(_str(i) for i in ids) if isinstance(ids, list) else (),
                   _int(data.get("write_failures")) or 0)


@dataclass(frozen=True)
class NodeStatus:
    """The node as the daemon publishes it after each scan: `/status`, `status.json`,
    and what `/metrics` is built from.

    Before its first scan a daemon publishes only host, version, start time and no
    ranks (`scanned` False): that short form is what `to_json` gives then."""

    host: str | None = None
    version: str | None = None
    started: float | None = None
    time: float | None = None  # wall time of the last scan; None before the first
    ranks: tuple[RankStatus, ...] = ()
    scanned: bool = False  # the full form: every field below was published
    daemon_pid: int | None = None
    mode: str | None = None
    interval: float | None = None
    scan_monotonic: float | None = None
    dir: str | None = None
    state_dir: str | None = None
    wired_bytes: int | None = None
    wired_baseline_bytes: int | None = None
    reboot_required: bool | None = None
    reboot: dict[str, Any] | None = None  # the reboot flag's contents (journal.reboot_flag)
    invalid_records: dict[str, str] = field(default_factory=dict)  # path -> why
    invalid_files: int = 0
    counters: CounterValues = field(default_factory=CounterValues)
    launches: dict[str, int] = field(default_factory=dict)  # launcher event -> count
    unwritten: Unwritten = field(default_factory=Unwritten)
    scan_bucket_bounds: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        if not self.scanned:
            return {"host": self.host, "version": self.version, "started": self.started,
                    "time": self.time, "ranks": [r.to_json() for r in self.ranks]}
        return {
            "host": self.host, "daemon_pid": self.daemon_pid, "version": self.version,
            "mode": self.mode, "interval": self.interval, "time": self.time,
            "scan_monotonic": self.scan_monotonic, "dir": self.dir,
            "state_dir": self.state_dir, "started": self.started,
            "wired_bytes": self.wired_bytes, "wired_baseline_bytes": self.wired_baseline_bytes,
            "reboot_required": self.reboot_required, "reboot": self.reboot,
            "ranks": [r.to_json() for r in self.ranks],
            "invalid_records": dict(self.invalid_records),
            "invalid_files": self.invalid_files, "counters": self.counters.to_json(),
            "launches": dict(self.launches), "unwritten": self.unwritten.to_json(),
            "scan_bucket_bounds": list(self.scan_bucket_bounds),
        }

    @classmethod
    def from_json(cls, data: Any) -> NodeStatus:
        """A node's status as another process wrote it (a peer's /status, status.json);
        ValueError unless it is an object. Malformed ranks are dropped, fields of the
        wrong type read as their default (a peer's answer without a list of ranks is
        refused before: cluster.fetch)."""
        if not isinstance(data, dict):
            raise ValueError("not an mlx-watchdog /status")
        bounds = data.get("scan_bucket_bounds")
        invalid = _obj(data.get("invalid_records"))
        reboot = data.get("reboot")
        return cls(
            host=_str(data.get("host")), version=_str(data.get("version")),
            started=_num(data.get("started")), time=_num(data.get("time")),
            ranks=valid_ranks(data.get("ranks")), scanned="scan_monotonic" in data,
            daemon_pid=_int(data.get("daemon_pid")), mode=_str(data.get("mode")),
            interval=_num(data.get("interval")), scan_monotonic=_num(data.get("scan_monotonic")),
            dir=_str(data.get("dir")), state_dir=_str(data.get("state_dir")),
            wired_bytes=_int(data.get("wired_bytes")),
            wired_baseline_bytes=_int(data.get("wired_baseline_bytes")),
            reboot_required=_typed(data.get("reboot_required"), bool, None),
            reboot=reboot if isinstance(reboot, dict) else None,
            invalid_records={str(k): str(v) for k, v in invalid.items()},
            invalid_files=_int(data.get("invalid_files")) or 0,
            counters=CounterValues.from_json(data.get("counters")),
            launches={str(k): v for k, v in _obj(data.get("launches")).items()
                      if _int(v) is not None},
            unwritten=Unwritten.from_json(data.get("unwritten")),
            scan_bucket_bounds=tuple(b for b in bounds if _num(b) is not None)
            if isinstance(bounds, list) else ())


# -- a fence -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Culprit:
    """The rank that holds a job up, as an incident (and a fence) names it."""

    host: str | None
    rank: int | None
    pid: int | None
    state: str | None
    reason: str | None
    # The job's cause (watchdog/cause.py) and its one line: a fence carries them.
    cause: str | None = None
    summary: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "rank": self.rank, "pid": self.pid, "state": self.state,
                "reason": self.reason, "cause": self.cause, "summary": self.summary}

    @classmethod
    def from_json(cls, data: Any) -> Culprit | None:
        if not isinstance(data, dict) or not data:
            return None
        return cls(_str(data.get("host")), _int(data.get("rank")), _int(data.get("pid")),
                   _str(data.get("state")), _str(data.get("reason")), _str(data.get("cause")),
                   _str(data.get("summary")))


@dataclass(frozen=True)
class Fence:
    """"End your ranks of job J of owner U": a peer's signed request (net/fence.py), or
    this daemon's own when a local rank of the job died (`local`, never on the wire)."""

    job: str
    uid: int
    origin: str | None  # the node that fenced
    reason: str | None
    culprit: Culprit | None
    nonce: str = ""
    time: float | None = None
    # When the origin found the job dead (its wall clock): a rank started after it is
    # a relaunch of the job under its name, never one of the dead job's ranks.
    since: float | None = None
    local: bool = False

    def to_json(self) -> dict[str, Any]:
        """The body a fence request carries (signed as sent)."""
        return {"job": self.job, "uid": self.uid, "origin": self.origin,
                "reason": self.reason,
                "culprit": self.culprit.to_json() if self.culprit else None,
                "nonce": self.nonce, "time": self.time, "since": self.since}

    @classmethod
    def from_json(cls, data: Any) -> Fence:
        """A fence's body; ValueError unless it names a job, its owner and a nonce."""
        if not isinstance(data, dict) or not isinstance(data.get("job"), str) \
                or not isinstance(data.get("nonce"), str) or not data["job"] \
                or type(data.get("uid")) is not int or not 0 <= data["uid"] < 2**32:
            raise ValueError("body lacks job, uid or nonce")
        reason, origin = data.get("reason"), data.get("origin")
        return cls(job=data["job"], uid=data["uid"],
                   origin=None if origin is None else str(origin),
                   reason=None if reason is None else str(reason),
                   culprit=Culprit.from_json(data.get("culprit")), nonce=data["nonce"],
                   time=_num(data.get("time")), since=_num(data.get("since")))

    def ends(self, start_time: float) -> bool:
        """Whether a local rank started at `start_time` (wall seconds) may be one of the
        dead job's: it started before the origin found the job dead. A fence from a
        sender that names no `since` is as old as its signature."""
        cutoff = self.since if self.since is not None else self.time
        return cutoff is None or start_time < cutoff


# -- an incident -------------------------------------------------------------------------


@dataclass(frozen=True)
class IncidentRank:
    """A rank an incident ends, as it was when the daemon decided."""

    pid: int | None
    rank: int | None
    state: str | None
    phase: str | None = None
    op: str | None = None
    seconds_in_wait: float | None = None
    busiest_thread_cpu: float | None = None
    attempt: int | None = None
    progress: int | None = None  # completed waits at the verdict (a replay compares)
    collectives: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "rank": self.rank, "state": self.state, "phase": self.phase,
                "op": self.op, "seconds_in_wait": self.seconds_in_wait,
                "busiest_thread_cpu": self.busiest_thread_cpu, "attempt": self.attempt,
                "progress": self.progress, "collectives": self.collectives}

    @classmethod
    def from_json(cls, data: Any) -> IncidentRank:
        data = _obj(data)
        return cls(_int(data.get("pid")), _int(data.get("rank")), _str(data.get("state")),
                   _str(data.get("phase")), _str(data.get("op")),
                   _num(data.get("seconds_in_wait")), _num(data.get("busiest_thread_cpu")),
                   _int(data.get("attempt")), _int(data.get("progress")),
                   _int(data.get("collectives")))


@dataclass(frozen=True)
class FlightEntry:
    """One collective of a flight recorder's tail."""

    number: int | None
    op: str | None
    dtype: str | None
    bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "op": self.op, "dtype": self.dtype, "bytes": self.bytes}

    @classmethod
    def from_json(cls, data: Any) -> FlightEntry:
        data = _obj(data)
        return cls(_int(data.get("number")), _str(data.get("op")), _str(data.get("dtype")),
                   _int(data.get("bytes")))


@dataclass(frozen=True)
class SignalSent:
    """One signal of the ladder, with what the signaller said."""

    pid: int | None
    rank: int | None
    signal: str | None  # its name: SIGCONT, SIGTERM, SIGKILL
    time: float | None  # wall time
    result: str | None  # signaller.SENT, GONE, NOT_OURS, ...

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "rank": self.rank, "signal": self.signal, "time": self.time,
                "result": self.result}

    @classmethod
    def from_json(cls, data: Any) -> SignalSent:
        data = _obj(data)
        return cls(_int(data.get("pid")), _int(data.get("rank")), _str(data.get("signal")),
                   _num(data.get("time")), _str(data.get("result")))


# The keys a response adds, in the order it adds them (for reading only: files are
# written with sorted keys). A None (or ABSENT) field is a key not written yet.
_RESPONSE = ("signals", "wired_before", "wired_baseline", "cluster", "action", "evidence",
             "evidence_error", "ladder", "outcome", "native_hot", "wired_after",
             "wired_check", "reboot_required", "completed_at_start", "closed_at")
_NULLABLE = ("wired_before", "wired_baseline", "cluster", "wired_after")  # null is a value


@dataclass(frozen=True)
class Incident:
    """An incident as it is journaled (incidents.jsonl, the write-ahead entry).

    What was found is set when the daemon decides to act (incidents.new_incident);
    the response's fields start unwritten and the enforcer advances the incident
    with `dataclasses.replace` at each step, journaling it before each signal."""

    # -- what was found
    id: str
    time: float = 0.0
    host: str | None = None
    job: str | None = None
    attempt: int | None = None
    uid: int | None = None
    verdict: str | None = None  # stalled, blocked, fenced, peer_died
    mode: str | None = None
    kill_scope: str | None = None
    reason: str | None = None
    cause: str | None = None  # watchdog/cause.py's vocabulary
    summary: str | None = None  # one line: who (rank, host, pid), where, why
    ranks: tuple[IncidentRank, ...] = ()
    pids: tuple[int, ...] = ()
    seconds_without_progress: float = 0.0
    busiest_thread_cpu: float = 0.0
    flight_recorder_tail: dict[str, tuple[FlightEntry, ...]] = field(default_factory=dict)
    culprit: Culprit | None = None
    # -- what the response did (None or ABSENT: not written yet)
    signals: tuple[SignalSent, ...] | None = None
    wired_before: int | None | Absent = ABSENT
    wired_baseline: int | None | Absent = ABSENT
    cluster: dict[str, Any] | None | Absent = ABSENT  # the peers' view (peers.view)
    action: str | None = None  # ending, ended, observed (...)
    evidence: tuple[str, ...] | None = None  # the files captured
    evidence_error: str | None = None
    ladder: str | None = None  # "begun": signals may have been sent to every target
    outcome: dict[str, str] | None = None  # pid -> signaller result
    native_hot: tuple[dict[str, Any], ...] | None = None  # samplegraph's parse
    wired_after: int | None | Absent = ABSENT
    wired_check: str | None = None
    reboot_required: str | bool | None = None  # the flag's reason, False once closed
    completed_at_start: float | None = None
    closed_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "time": self.time, "host": self.host, "job": self.job,
            "attempt": self.attempt, "uid": self.uid, "verdict": self.verdict,
            "mode": self.mode, "kill_scope": self.kill_scope, "reason": self.reason,
            "cause": self.cause, "summary": self.summary,
            "ranks": [r.to_json() for r in self.ranks], "pids": list(self.pids),
            "seconds_without_progress": self.seconds_without_progress,
            "busiest_thread_cpu": self.busiest_thread_cpu,
            "flight_recorder_tail": {rank: [c.to_json() for c in tail]
                                     for rank, tail in self.flight_recorder_tail.items()},
            "culprit": self.culprit.to_json() if self.culprit else None,
        }
        for name in _RESPONSE:
            value = getattr(self, name)
            if value is ABSENT or (value is None and name not in _NULLABLE):
                continue
            if name == "signals":
                value = [s.to_json() for s in value]
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, dict):
                value = dict(value)
            out[name] = value
        return out

    @classmethod
    def from_json(cls, data: Any) -> Incident:
        """An incident read back (incidents.jsonl, a write-ahead entry); ValueError
        without an id. An older or partial line reads with defaults."""
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise ValueError("no incident id")
        ranks, pids, tail = data.get("ranks"), data.get("pids"), data.get("flight_recorder_tail")
        signals, evidence, hot = data.get("signals"), data.get("evidence"), data.get("native_hot")
        outcome, reboot = data.get("outcome"), data.get("reboot_required")

        def nullable(name: str, types: type | tuple[type, ...]) -> Any:
            return _typed(data[name], types, None) if name in data else ABSENT

        return cls(
            id=data["id"], time=_num(data.get("time")) or 0.0, host=_str(data.get("host")),
            job=_str(data.get("job")), attempt=_int(data.get("attempt")),
            uid=_int(data.get("uid")), verdict=_str(data.get("verdict")),
            mode=_str(data.get("mode")), kill_scope=_str(data.get("kill_scope")),
            reason=_str(data.get("reason")), cause=_str(data.get("cause")),
            summary=_str(data.get("summary")),
            ranks=tuple(IncidentRank.from_json(r) for r in ranks if isinstance(r, dict))
            if isinstance(ranks, list) else (),
            pids=tuple(p for p in pids if _int(p) is not None) if isinstance(pids, list) else (),
            seconds_without_progress=_num(data.get("seconds_without_progress")) or 0.0,
            busiest_thread_cpu=_num(data.get("busiest_thread_cpu")) or 0.0,
            flight_recorder_tail={str(rank): tuple(FlightEntry.from_json(c) for c in entries
                                                   if isinstance(c, dict))
                                  for rank, entries in _obj(tail).items()
                                  if isinstance(entries, list)},
            culprit=Culprit.from_json(data.get("culprit")),
            signals=tuple(SignalSent.from_json(s) for s in signals if isinstance(s, dict))
            if isinstance(signals, list) else None,
            wired_before=nullable("wired_before", int),
            wired_baseline=nullable("wired_baseline", int),
            cluster=nullable("cluster", dict),
            action=_str(data.get("action")),
            evidence=tuple(str(p) for p in evidence) if isinstance(evidence, list) else None,
            evidence_error=_str(data.get("evidence_error")), ladder=_str(data.get("ladder")),
            outcome={str(k): str(v) for k, v in outcome.items()}
            if isinstance(outcome, dict) else None,
            native_hot=tuple(h for h in hot if isinstance(h, dict))
            if isinstance(hot, list) else None,
            wired_after=nullable("wired_after", int), wired_check=_str(data.get("wired_check")),
            reboot_required=reboot if isinstance(reboot, (str, bool)) else None,
            completed_at_start=_num(data.get("completed_at_start")),
            closed_at=_num(data.get("closed_at")))
