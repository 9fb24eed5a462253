"""The daemon-to-everyone contract: what a rank, a node, an incident, a fence, the
cluster view and a launcher's event look like.

Data only, like `states.py`: dataclasses with one `to_json()` and one `from_json()`
each, both derived from the fields by the codec below (`encode`, `decode`),
importing nothing from the daemon. The daemon builds them
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

import dataclasses
import enum
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

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


# -- the codec: each class's JSON derived from its fields ----------------------------------
#
# A field is written once, as a dataclass field; its JSON key is its name, in field
# order. `to_json` encodes by value (a nested contract type by its own `to_json`, a
# tuple as a list, an enum as its value); `from_json` decodes by the field's type:
# a scalar of the wrong type reads as the field's default, a list keeps its items
# of the right type (text items are stringified; an object its type refuses is
# left out), a nested type reads through its own `from_json`. What a class cannot do
# without is checked by its `from_json` before the codec runs. A field's `metadata` may say:
#   WIRE_SKIP: never a key of its own;   OMIT: "none" (no key while None or ABSENT) or
#   "absent" (no key while ABSENT; null is a value);   READ: a function of the whole
#   object giving the field's value.

WIRE_SKIP, OMIT, READ = "wire_skip", "omit", "read"
_DROP = object()  # an item of the wrong type: left out of its list


def _item(tp: Any) -> Callable[[Any], Any]:
    """How one item of a list (or value of a mapping) is read: _DROP if unfit."""
    if tp is str:
        return str
    if tp is Any:
        return lambda v: v
    origin = get_origin(tp)
    if origin in (tuple, list, dict) or dataclasses.is_dataclass(tp):
        kind = dict if origin is dict or dataclasses.is_dataclass(tp) else list
        read = _decoder(tp)

        def item(v: Any) -> Any:
            try:
                return read(v) if isinstance(v, kind) else _DROP
            except ValueError:  # refused by its type (a rank without its job...)
                return _DROP
        return item
    read = _decoder(tp)
    if origin in (Union, UnionType):  # an optional item (str | None) stays null
        return read
    return lambda v: _DROP if (got := read(v)) is None else got


def _decoder(tp: Any) -> Callable[[Any], Any]:
    """How a value of type `tp` is read from JSON: None if unfit."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        members = tuple(a for a in args if a is not type(None) and get_origin(a) is not Literal)
        if len(members) == 1:
            return _decoder(members[0])
        return lambda v: _typed(v, members, None)  # str | bool: either, as it is
    if tp is bool:
        return lambda v: v if isinstance(v, bool) else None
    if tp in (int, float, str):
        return {int: _int, float: _num, str: _str}[tp]
    if tp is Any:
        return lambda v: v
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = {member.value: member for member in tp}
        return lambda v: values.get(v) if isinstance(v, (str, int)) else None
    if dataclasses.is_dataclass(tp):
        return lambda v: tp.from_json(v)  # type: ignore[union-attr]  # looked up when read
    if origin in (tuple, list):
        item, kind = _item(args[0]), origin
        return lambda v: kind(x for x in map(item, v) if x is not _DROP) \
            if isinstance(v, list) else None
    if origin is dict:
        if args[1] is Any:
            return lambda v: v if isinstance(v, dict) else None
        value = _item(args[1])
        return lambda v: {str(k): x for k, x in ((k, value(x)) for k, x in v.items())
                          if x is not _DROP} if isinstance(v, dict) else None
    raise TypeError(f"no JSON codec for {tp!r}")


def _same(value: Any) -> Any:
    return value


_Plan = tuple[tuple[str, Callable[[Any], Any], Callable[[], Any], Any, Any], ...]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    """Per wire field of `cls`: (name, decoder, its default's maker, omit, read)."""
    if cls in _PLANS:
        return _PLANS[cls]
    hints = get_type_hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        if f.metadata.get(WIRE_SKIP) and f.metadata.get(READ) is None:
            continue  # never on the wire, nor read from it
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory  # called per object: never one shared dict
        else:
            default = functools.partial(_same, None if f.default is dataclasses.MISSING
                                        else f.default)
        plan.append((f.name, _decoder(hints[f.name]), default,
                     "skip" if f.metadata.get(WIRE_SKIP) else f.metadata.get(OMIT),
                     f.metadata.get(READ)))
    _PLANS[cls] = tuple(plan)
    return _PLANS[cls]


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _encode(value: Any) -> Any:
    if type(value) in _SCALARS:  # most fields: taken as they are, first
        return value
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return value.value
    return value


_ENCODE_PLANS: dict[type, tuple[tuple[str, Any], ...]] = {}


def encode(obj: Any) -> dict[str, Any]:
    """A contract object's JSON: every wire field, in field order."""
    cls = type(obj)
    plan = _ENCODE_PLANS.get(cls)
    if plan is None:
        plan = _ENCODE_PLANS[cls] = tuple((name, omit) for name, _, _, omit, _ in _plan(cls)
                                          if omit != "skip")
    out: dict[str, Any] = {}
    for name, omit in plan:
        value = getattr(obj, name)
        if type(value) in _SCALARS:
            if value is not None or omit != "none":
                out[name] = value
        elif value is not ABSENT:
            out[name] = _encode(value)
    return out


def decode(cls: type[T], data: Any) -> T:
    """A contract object read from untrusted JSON (not an object: every field defaults).
    A missing key of an OMIT="absent" field reads as ABSENT; a value of the wrong type
    as the field's default (a falsy one too, when the default is not None)."""
    data = _obj(data)
    values: dict[str, Any] = {}
    for name, read, default, omit, whole in _plan(cls):
        if whole is not None:
            values[name] = whole(data)
        elif omit == "absent":  # null is a value: no key, not written yet
            values[name] = read(data[name]) if name in data else ABSENT
        else:
            value, fallback = read(data.get(name)), default()
            values[name] = value if fallback is None else value or fallback
    return cls(**values)


class Encodable:
    """A contract type whose JSON the codec writes from its fields alone."""

    def to_json(self) -> dict[str, Any]:
        return encode(self)


class Decodable(Encodable):
    """One the codec reads back too (a type that refuses some input, or reads a
    non-object as None, has a `from_json` of its own)."""

    @classmethod
    def from_json(cls: type[D], data: Any) -> D:
        return decode(cls, data)


D = TypeVar("D", bound=Decodable)


def _on_wire(omit: str | None = None, read: Callable[[Any], Any] | None = None,
             skip: bool = False) -> dict[str, Any]:
    return {OMIT: omit, READ: read, WIRE_SKIP: skip}


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
class LastCollective(Encodable):
    """The last collective a rank issued, as /status shows it: its number, op and bytes
    (record.Collective is a flight recorder's entry)."""

    number: int | None = None
    op: str | None = None
    bytes: int | None = None


    @classmethod
    def from_json(cls, data: Any) -> LastCollective | None:
        return decode(cls, data) if isinstance(data, dict) and data else None


@dataclass(frozen=True)
class Expect(Encodable):
    """A window the rank announced (`hb.expect`): a wait that long is no stall."""

    seconds: float = 0.0
    reason: str = ""


    @classmethod
    def from_json(cls, data: Any) -> Expect | None:
        return decode(cls, data) if isinstance(data, dict) and data else None


@dataclass(frozen=True, kw_only=True)
class RankStatus(Encodable):
    """One rank as users see it: an object of `status --json` and `/status` "ranks".

    Built by the daemon (and the CLI sampling with no daemon) with every field;
    a peer's rank may lack or null the optional ones."""

    pid: int | None = None
    host: str | None = None
    job: str
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
    last_collective: LastCollective | None = None
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
    # What its busy threads ran at the latest native stack sample, taken only while a
    # rank of its job waits past its deadline (judge/frames.py); None: not sampled.
    frames: str | None = None
    # The same sample's kind, for a machine ("waiting", "computing", "unknown"); while its
    # sockets are tracked (probes/stacksampler.py), the seconds their queues stood still
    # and the bytes received and not read: what a peer needs to judge a job wedged across
    # nodes (judge/wedge.py). No key while unknown (an old peer's rank lacks them too).
    frames_kind: str | None = field(default=None, metadata=_on_wire(omit="none"))
    quiet_seconds: float | None = field(default=None, metadata=_on_wire(omit="none"))
    unread_bytes: int | None = field(default=None, metadata=_on_wire(omit="none"))
    # Over the last minute of its work (daemon/judge/stragglers.py): the share of its
    # time spent waiting on its peers, its collectives per second, its score against
    # the job's other ranks (1: the job's pace, lower: slower), the share of the time
    # its busiest thread waited in a run queue for a core; None until known.
    wait_share: float | None = None
    pace: float | None = None
    pace_score: float | None = None
    run_queue: float | None = None
    pace_why: str | None = None  # what the node tells of its pace, one line ("": nothing)
    # Share of its intervals at its usual pace in which it was working, waiting or stopped
    # (not sleeping by design, as a server's rank 0 reading requests): the cluster names
    # a straggler only when most of them were.
    active_share: float | None = None


    @classmethod
    def from_json(cls, data: Any) -> RankStatus:
        """A rank another process published; ValueError if a field the cluster view
        lines up has the wrong type (RANK_FIELDS), the others read as None then."""
        if not isinstance(data, dict) or not _fits(data, RANK_FIELDS) \
                or not _fits(data.get("last_collective") or {}, COLLECTIVE_FIELDS):
            raise ValueError("not a rank of an mlx-watchdog /status")
        return decode(cls, data)


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


@dataclass(frozen=True, kw_only=True)
class Straggler(Encodable):
    """The rank that holds a job back (daemon/judge/stragglers.py): reported, never
    ended. `slowdown`: how much faster the job would run if it kept the others' pace;
    `others_wait`: the share of each step the others wait for it; `why`: what the
    node tells of the reason, one line ("" when nothing stands out)."""

    job: str
    uid: int | None = None
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    score: float | None = None
    slowdown: float | None = None
    others_wait: float | None = None
    why: str = ""
    summary: str = ""

    @classmethod
    def from_json(cls, data: Any) -> Straggler | None:
        return decode(cls, data) if isinstance(data, dict) and data.get("job") else None


# -- a node ------------------------------------------------------------------------------

# The bounds of the scan-duration histogram (seconds), published as scan_bucket_bounds.
SCAN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def job_key(uid: int | None, job: str) -> str:
    """A per-job count's key: "<uid>:<job>" (a job is its owner's uid with its id:
    any user may name any job id, so a count keyed by the id alone is anyone's)."""
    return f"{'' if uid is None else uid}:{job}"


def split_job_key(key: str) -> tuple[str, str]:
    """(uid, job) of a `job_key`; a key of an older daemon (the job alone) has no uid."""
    uid, sep, job = key.partition(":")
    return (uid, job) if sep and (uid.isdigit() or not uid) else ("", key)

@dataclass(kw_only=True)
class Counters(Decodable):
    """The daemon's counters: counted by its loop, published (`counters` in /status) as
    a copy (`values`). Read back, a missing count is none at all; the daemon starts
    from `zeroed`, every verdict and signal at 0, so each has its series from the
    start."""

    stalls: dict[str, int] = field(default_factory=dict)  # verdict -> hangs acted on
    stall_causes: dict[str, int] = field(default_factory=dict)  # "verdict:cause" -> count
    kills: dict[str, int] = field(default_factory=dict)  # signal -> sent to end a rank
    job_kills: dict[str, int] = field(default_factory=dict)  # job_key(uid, job) -> ranks
    invalid_records: int = 0
    probe_errors: int = 0
    loop_errors: int = 0
    scan_buckets: list[int] = field(default_factory=list)  # per bound, then +Inf
    scan_sum: float = 0.0
    scan_count: int = 0

    @classmethod
    def zeroed(cls) -> Counters:
        """The counters a daemon starts with."""
        return cls(stalls={"stalled": 0, "blocked": 0}, kills={"SIGTERM": 0, "SIGKILL": 0},
                   scan_buckets=[0] * (len(SCAN_BUCKETS) + 1))

    def stall(self, verdict: str, cause: str | None) -> None:
        """A hang acted on, counted by its verdict and cause."""
        self.stalls[verdict] += 1
        key = f"{verdict}:{cause or 'unknown'}"
        self.stall_causes[key] = self.stall_causes.get(key, 0) + 1

    def observe_scan(self, seconds: float) -> None:
        """One scan's duration, into the histogram (SCAN_BUCKETS)."""
        self.scan_sum += seconds
        self.scan_count += 1
        for i, bound in enumerate(SCAN_BUCKETS):
            if seconds <= bound:
                self.scan_buckets[i] += 1
                break
        else:
            self.scan_buckets[-1] += 1

    def values(self) -> Counters:
        """The counters as they stand: a copy the loop's counting does not change."""
        return Counters(stalls=dict(self.stalls), stall_causes=dict(self.stall_causes),
                        kills=dict(self.kills), job_kills=dict(self.job_kills),
                        invalid_records=self.invalid_records, probe_errors=self.probe_errors,
                        loop_errors=self.loop_errors, scan_buckets=list(self.scan_buckets),
                        scan_sum=self.scan_sum, scan_count=self.scan_count)


@dataclass(frozen=True)
class Unwritten(Decodable):
    """What a failed write left in memory (pending.Backlog): shown until it is on disk."""

    reboot_flags_unwritten: tuple[str, ...] = ()  # their reasons
    incidents_unwritten: tuple[str | None, ...] = ()  # their ids
    write_failures: int = 0


_FIGURE = _on_wire(omit="absent")  # a reboot flag's figure: no key when not given


@dataclass(frozen=True, kw_only=True)
class RebootReason(Decodable):
    """One reason the node was flagged for reboot, with its figures: the enforcer's,
    held until written (pending.Backlog), then a line of the flag's "reasons". Fields
    in the file's (sorted) key order."""

    incident: str | None | Absent = field(default=ABSENT, metadata=_FIGURE)
    reason: str | None | Absent = field(default=ABSENT, metadata=_FIGURE)
    time: float | None | Absent = field(default=ABSENT, metadata=_FIGURE)  # wall seconds
    wired_after: int | None | Absent = field(default=ABSENT, metadata=_FIGURE)
    wired_baseline: int | None | Absent = field(default=ABSENT, metadata=_FIGURE)


@dataclass(frozen=True, kw_only=True)
class RebootFlag(Encodable):
    """The node's reboot flag (`<state-dir>/reboot-required`, journal.reboot_flag), as
    /status "reboot" and `node status --json` show it: its first reason and every
    reason; or, unreadable, a reason saying so and its path; or, not yet on disk
    (a full disk), its reason held in memory (`unwritten`)."""

    reason: str | None | Absent = field(default=ABSENT, metadata=_FIGURE)
    path: str | None | Absent = field(default=ABSENT, metadata=_FIGURE)
    reasons: tuple[RebootReason, ...] | None | Absent = field(default=ABSENT,
                                                                metadata=_FIGURE)
    unwritten: bool | None | Absent = field(default=ABSENT, metadata=_FIGURE)

    @property
    def why(self) -> str | None:
        """The flag's (first) reason; None when it names none."""
        return None if self.reason is ABSENT else self.reason


    @classmethod
    def from_json(cls, data: Any) -> RebootFlag | None:
        return decode(cls, data) if isinstance(data, dict) else None


_SHORT = ("host", "version", "started", "time", "ranks")  # a node before its first scan


@dataclass(frozen=True, kw_only=True)
class NodeStatus:
    """The node as the daemon publishes it after each scan: `/status`, `status.json`,
    and what `/metrics` is built from.

    Before its first scan a daemon publishes only host, version, start time and no
    ranks (`scanned` False): that short form is what `to_json` gives then."""

    host: str | None = None
    daemon_pid: int | None = None
    version: str | None = None
    mode: str | None = None
    interval: float | None = None
    time: float | None = None  # wall time of the last scan; None before the first
    scan_monotonic: float | None = None
    dir: str | None = None
    state_dir: str | None = None
    started: float | None = None
    wired_bytes: int | None = None
    wired_baseline_bytes: int | None = None
    reboot_required: bool | None = None
    reboot: RebootFlag | None = None  # the reboot flag (journal.reboot_flag)
    # A peer's answer whose ranks are malformed keeps the others (valid_ranks).
    ranks: tuple[RankStatus, ...] = field(default=(), metadata=_on_wire(
        read=lambda data: valid_ranks(data.get("ranks"))))
    invalid_records: dict[str, str] = field(default_factory=dict)  # path -> why
    invalid_files: int = 0
    counters: Counters = field(default_factory=Counters)
    launches: dict[str, int] = field(default_factory=dict)  # launcher event -> count
    unwritten: Unwritten = field(default_factory=Unwritten)
    scan_bucket_bounds: tuple[float, ...] = ()
    # Why the record directory is full and nothing in it can be freed (new ranks cannot
    # publish: unwatched), with the uids holding the space where found; None: room.
    record_dir_full: str | None = None
    stragglers: tuple[Straggler, ...] = ()  # the jobs here held back by one rank
    # The full form: every field above was published (never a key of its own).
    scanned: bool = field(default=False, metadata=_on_wire(
        skip=True, read=lambda data: "scan_monotonic" in data))

    def to_json(self) -> dict[str, Any]:
        full = encode(self)
        return full if self.scanned else {name: full[name] for name in _SHORT}

    @classmethod
    def from_json(cls, data: Any) -> NodeStatus:
        """A node's status as another process wrote it (a peer's /status, status.json);
        ValueError unless it is an object. Malformed ranks are dropped, fields of the
        wrong type read as their default (a peer's answer without a list of ranks is
        refused before: cluster.fetch)."""
        if not isinstance(data, dict):
            raise ValueError("not an mlx-watchdog /status")
        return decode(cls, data)


@dataclass(frozen=True, kw_only=True)
class DaemonPointer(Encodable):
    """The record directory's pointer to the daemon that watches it (journal.POINTER):
    where `status`, `watch` and `inspect` find its verdicts."""

    daemon_pid: int | None = None
    state_dir: str
    listen: str | None = None


    @classmethod
    def from_json(cls, data: Any) -> DaemonPointer:
        """ValueError unless it names a state directory."""
        if not isinstance(data, dict) or not isinstance(data.get("state_dir"), str):
            raise ValueError("not a daemon's pointer")
        return decode(cls, data)


# -- the cluster view --------------------------------------------------------------------


@dataclass(frozen=True)
class NodeAnswer(Encodable):
    """One node's answer to `GET /status` (net/cluster.fetch): its status, or why not."""

    peer: str
    ok: bool
    status: NodeStatus | None = None  # when ok
    error: str | None = None  # when not


    @classmethod
    def from_json(cls, data: Any) -> NodeAnswer:
        """An answer as JSON ({"peer", "ok", "status" or "error"}); a status that is no
        object reads as an empty one (the node answered nothing of use)."""
        data = _obj(data)
        ok, status = data.get("ok") is True, data.get("status")
        return cls(str(data.get("peer")), ok,
                   (NodeStatus.from_json(status) if isinstance(status, dict) else NodeStatus())
                   if ok else None, _str(data.get("error")))


@dataclass(frozen=True)
class ReportedRank:
    """A rank as one node reported it: the rank, and the peer that answered. Its JSON
    is the rank's with the node added (a rank of `cluster status --json`)."""

    node: str | None
    rank: RankStatus

    def to_json(self) -> dict[str, Any]:
        return {**self.rank.to_json(), "node": self.node}

    @classmethod
    def from_json(cls, data: Any) -> ReportedRank:
        """ValueError if the rank is malformed (RankStatus.from_json)."""
        node = data.get("node") if isinstance(data, dict) else None
        return cls(node if isinstance(node, str) else None, RankStatus.from_json(data))


class JobState(enum.Enum):
    """What the cluster view says of a job (docs/cluster.md)."""

    HEALTHY = "healthy"
    HUNG = "hung"
    UNKNOWN = "unknown"  # a rank behind an unreachable node while another waits or ended
    ENDED = "ended"  # every rank gone, or the watchdog ended some


@dataclass(frozen=True)
class JobCulprit(Encodable):
    """The rank that holds a job up as the cluster view names it (with the node that
    reported it; `Culprit` is what an incident and a fence carry)."""

    host: str | None = None
    node: str | None = None
    rank: int | None = None
    pid: int | None = None
    state: str | None = None
    reason: str | None = None


    @classmethod
    def from_json(cls, data: Any) -> JobCulprit | None:
        return decode(cls, data) if isinstance(data, dict) and data else None


@dataclass(frozen=True, kw_only=True)
class JobView(Decodable):
    """One job (an owner's uid and a job id) across every reachable node, judged
    (daemon/judge/cluster.judge_job): a job of `cluster status --json`."""

    job: str
    uid: int | None = None
    world_size: int = 0
    state: JobState = JobState.HEALTHY
    ranks: tuple[ReportedRank, ...] = ()
    missing_ranks: tuple[int, ...] = ()  # no reachable node reports them
    culprit: JobCulprit | None = None
    evidence: str = ""
    cause: str | None = None  # watchdog/cause.py's vocabulary, when hung or unknown
    summary: str = ""
    straggler: Straggler | None = None  # a healthy job held back by one rank


@dataclass(frozen=True)
class ClusterNode(Decodable):
    """A node as the cluster view lists it: whether it answered, and its reboot flag."""

    peer: str
    ok: bool
    error: str | None
    host: str | None
    reboot_required: bool | None


@dataclass(frozen=True)
class ClusterView(Decodable):
    """Every node asked, and every job their ranks belong to (`cluster status --json`)."""

    nodes: tuple[ClusterNode, ...] = ()
    jobs: tuple[JobView, ...] = ()


@dataclass(frozen=True)
class ComputingRank(Decodable):
    """A rank on a peer that computes: its job is slow, not hung."""

    rank: int | None = None
    host: str | None = None
    pid: int | None = None


@dataclass(frozen=True)
class HoldingRank(Decodable):
    """A rank on a peer in a wait of its own (a checkpoint) that ours may wait for."""

    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    what: str | None = None  # RankStatus.holding
    collectives: int | None = None


@dataclass(frozen=True, kw_only=True)
class PeerView:
    """The peers' verdict on a job of ours (act/peers.Peers.view), journaled as an
    incident's "cluster": who holds the job up and why, which peers did not answer,
    and the ranks there that hold it (computing, or in a wait of their own). When
    the peers could not be asked, only `error` (its JSON has no other key)."""

    culprit: JobCulprit | None = None
    evidence: str = ""
    cause: str | None = None
    summary: str | None = None
    unreachable: tuple[str, ...] = ()
    computing: tuple[ComputingRank, ...] = ()
    holding: tuple[HoldingRank, ...] = ()
    error: str | None = field(default=None, metadata=_on_wire(omit="none"))

    def to_json(self) -> dict[str, Any]:
        return {"error": self.error} if self.error is not None else encode(self)

    @classmethod
    def from_json(cls, data: Any) -> PeerView | None:
        return decode(cls, data) if isinstance(data, dict) else None


# -- a fence -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Culprit(Encodable):
    """The rank that holds a job up, as an incident (and a fence) names it."""

    host: str | None = None
    rank: int | None = None
    pid: int | None = None
    state: str | None = None
    reason: str | None = None
    # The job's cause (watchdog/cause.py) and its one line: a fence carries them.
    cause: str | None = None
    summary: str | None = None


    @classmethod
    def from_json(cls, data: Any) -> Culprit | None:
        return decode(cls, data) if isinstance(data, dict) and data else None


def _text_or_null(name: str) -> Callable[[dict[str, Any]], str | None]:
    """A field read as text whatever it was sent as (its words are only shown)."""
    return lambda data: None if data.get(name) is None else str(data[name])


@dataclass(frozen=True)
class Fence:
    """"End your ranks of job J of owner U": a peer's signed request (net/fence.py), or
    this daemon's own when a local rank of the job died (`local`, never on the wire)."""

    job: str
    uid: int
    origin: str | None = field(metadata=_on_wire(read=_text_or_null("origin")))  # who fenced
    reason: str | None = field(metadata=_on_wire(read=_text_or_null("reason")))
    culprit: Culprit | None
    nonce: str = ""
    time: float | None = None
    # When the origin found the job dead (its wall clock): a rank started after it is
    # a relaunch of the job under its name, never one of the dead job's ranks.
    since: float | None = None
    # Seconds after the signing the origin sends its own ranks SIGTERM: the receiver
    # freezes its ranks of the job at once and ends them then, so no rank of the job
    # runs on after its peers' end. None (an older sender): at once.
    term_in: float | None = field(default=None, metadata=_on_wire(omit="none"))
    local: bool = field(default=False, metadata=_on_wire(skip=True))

    def to_json(self) -> dict[str, Any]:
        """The body a fence request carries (signed as sent)."""
        return encode(self)

    @classmethod
    def from_json(cls, data: Any) -> Fence:
        """A fence's body; ValueError unless it names a job, its owner and a nonce."""
        if not isinstance(data, dict) or not isinstance(data.get("job"), str) \
                or not isinstance(data.get("nonce"), str) or not data["job"] \
                or type(data.get("uid")) is not int or not 0 <= data["uid"] < 2**32:
            raise ValueError("body lacks job, uid or nonce")
        return decode(cls, data)

    def ends(self, start_time: float) -> bool:
        """Whether a local rank started at `start_time` (wall seconds) may be one of the
        dead job's: it started before the origin found the job dead. A fence from a
        sender that names no `since` is as old as its signature."""
        cutoff = self.since if self.since is not None else self.time
        return cutoff is None or start_time < cutoff


@dataclass(frozen=True)
class FenceAnswer(Decodable):
    """A node's answer to a fence: the job and the pids of its ranks it is ending
    (202), or why it refused (only `error`)."""

    job: str | None = field(default=None, metadata=_on_wire(omit="none"))
    uid: int | None = field(default=None, metadata=_on_wire(omit="none"))
    ending: tuple[int, ...] | None = field(default=None, metadata=_on_wire(omit="none"))
    error: str | None = field(default=None, metadata=_on_wire(omit="none"))


@dataclass(frozen=True)
class FenceSent:
    """A fence sent to one peer: its answer, or why none came."""

    peer: str
    answer: FenceAnswer | None = None
    error: str | None = None

    def __str__(self) -> str:
        return str(self.answer.to_json()) if self.answer is not None else str(self.error)


# -- an incident -------------------------------------------------------------------------


@dataclass(frozen=True)
class IncidentRank(Decodable):
    """A rank an incident ends, as it was when the daemon decided."""

    pid: int | None = None
    rank: int | None = None
    state: str | None = None
    phase: str | None = None
    op: str | None = None
    seconds_in_wait: float | None = None
    busiest_thread_cpu: float | None = None
    attempt: int | None = None
    progress: int | None = None  # completed waits at the verdict (a replay compares)
    collectives: int | None = None
    # What its busy threads ran at the latest native stack sample ("busy thread 7880
    # spins in SocketThread::worker -> recv"), or why none was read; None: not sampled.
    frames: str | None = None


@dataclass(frozen=True)
class FlightEntry(Decodable):
    """One collective of a flight recorder's tail."""

    number: int | None = None
    op: str | None = None
    dtype: str | None = None
    bytes: int | None = None


@dataclass(frozen=True)
class SignalSent(Decodable):
    """One signal of the ladder, with what the signaller said."""

    pid: int | None = None
    rank: int | None = None
    signal: str | None = None  # its name: SIGCONT, SIGTERM, SIGKILL
    time: float | None = None  # wall time
    result: str | None = None  # signaller.SENT, GONE, NOT_OURS, ...


@dataclass(frozen=True)
class HotFrame(Decodable):
    """A frame where a thread's samples were taken (a leaf), summed by name."""

    frame: str = ""
    lib: str = ""
    samples: int = 0


@dataclass(frozen=True)
class PathFrame(Decodable):
    """A frame of a thread's heaviest path, with the samples under it."""

    frame: str = ""
    samples: int = 0


@dataclass(frozen=True)
class HotThread(Encodable):
    """One thread of a native dump (macOS `sample`, probes/samplegraph.py): its samples,
    its hottest leaves, its heaviest path from the root (the deepest frames)."""

    thread: str
    samples: int
    top: tuple[HotFrame, ...] = ()
    path: tuple[PathFrame, ...] = ()


    @classmethod
    def from_json(cls, data: Any) -> HotThread:
        """ValueError unless it names its thread and its sample count."""
        if not isinstance(data, dict) or not isinstance(data.get("thread"), str) \
                or _int(data.get("samples")) is None:
            raise ValueError("not a thread of a native dump")
        return decode(cls, data)


@dataclass(frozen=True)
class NativeHot(Decodable):
    """A rank's native dump, parsed (act/evidence.hot_frames): its threads, or what the
    sampler said instead of a call graph."""

    rank: int | None = None
    pid: int | None = None
    threads: tuple[HotThread, ...] | None = field(default=None, metadata=_on_wire(omit="none"))
    error: str | None = field(default=None, metadata=_on_wire(omit="none"))


@dataclass(frozen=True, kw_only=True)
class WiredCheck(Decodable):
    """What wired memory said after a kill, against the idle baseline (the enforcer's
    settle): "returned", "leaked", "probe failed", "skipped: ..." or "no baseline"
    (then without figures). Its fields go into the incident under these names."""

    wired_baseline: int | None | Absent = field(default=ABSENT, metadata=_on_wire(
        omit="absent"))
    wired_after: int | None | Absent = field(default=ABSENT, metadata=_on_wire(
        omit="absent"))
    wired_check: str


# What a response adds, in the order it adds them (files are written with sorted keys):
# a key not written yet is no key; "none": while None, "absent": while ABSENT (null is
# a value then).
_LATER, _LATER_OR_NULL = _on_wire(omit="none"), _on_wire(omit="absent")


@dataclass(frozen=True)
class Incident(Encodable):
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
    signals: tuple[SignalSent, ...] | None = field(default=None, metadata=_LATER)
    wired_before: int | None | Absent = field(default=ABSENT, metadata=_LATER_OR_NULL)
    wired_baseline: int | None | Absent = field(default=ABSENT, metadata=_LATER_OR_NULL)
    # the peers' verdict (peers.view)
    cluster: PeerView | None | Absent = field(default=ABSENT, metadata=_LATER_OR_NULL)
    action: str | None = field(default=None, metadata=_LATER)  # ending, ended, observed
    evidence: tuple[str, ...] | None = field(default=None, metadata=_LATER)  # files captured
    evidence_error: str | None = field(default=None, metadata=_LATER)
    # "begun": signals may have been sent to every target
    ladder: str | None = field(default=None, metadata=_LATER)
    # how the job's ranks were frozen before any SIGTERM: "N ranks frozen", or what
    # could not be (a rank in uninterruptible sleep, a peer that did not answer the fence)
    freeze: str | None = field(default=None, metadata=_LATER)
    outcome: dict[str, str] | None = field(default=None, metadata=_LATER)  # pid -> result
    # the native dumps, parsed
    native_hot: tuple[NativeHot, ...] | None = field(default=None, metadata=_LATER)
    wired_after: int | None | Absent = field(default=ABSENT, metadata=_LATER_OR_NULL)
    wired_check: str | None = field(default=None, metadata=_LATER)
    # the flag's reason, False once closed
    reboot_required: str | bool | None = field(default=None, metadata=_LATER)
    completed_at_start: float | None = field(default=None, metadata=_LATER)
    closed_at: float | None = field(default=None, metadata=_LATER)


    @classmethod
    def from_json(cls, data: Any) -> Incident:
        """An incident read back (incidents.jsonl, a write-ahead entry); ValueError
        without an id. An older or partial line reads with defaults."""
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise ValueError("no incident id")
        return decode(cls, data)


# -- the launcher's journal ----------------------------------------------------------------

_SAID = _on_wire(omit="absent")  # an event carries only its own facts


@dataclass(frozen=True, kw_only=True)
class LaunchEvent(Encodable):
    """One line of `launches.jsonl` (store/launchlog.py): what `mlx-watchdog launch`
    decided for an attempt of a job. Each event writes its own facts (docs/operations.md,
    "The journal"); a fact it does not carry is ABSENT, a null one None. Fields in
    the file's (sorted) key order."""

    argv: tuple[str, ...] | None | Absent = field(default=ABSENT, metadata=_SAID)  # launch
    attempt: int | None | Absent = field(default=ABSENT, metadata=_SAID)
    backoff: float | None | Absent = field(default=ABSENT, metadata=_SAID)  # restart
    ending: str | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    event: str  # launch, ended, restart, refused, gave_up
    exit_code: int | None | Absent = field(default=ABSENT, metadata=_SAID)
    host: str | None | Absent = field(default=ABSENT, metadata=_SAID)
    incident: str | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    job: str | None | Absent = field(default=ABSENT, metadata=_SAID)
    launcher_code: int | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    progressed: bool | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    reason: str | None | Absent = field(default=ABSENT, metadata=_SAID)
    restarts_left: int | None | Absent = field(default=ABSENT, metadata=_SAID)  # restart
    steps: int | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    time: float | None | Absent = field(default=ABSENT, metadata=_SAID)  # wall seconds
    uid: int | None | Absent = field(default=ABSENT, metadata=_SAID)
    waits: int | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended


    @classmethod
    def from_json(cls, data: Any) -> LaunchEvent:
        """ValueError unless it names its event."""
        if not isinstance(data, dict) or not isinstance(data.get("event"), str):
            raise ValueError("not a launch event")
        return decode(cls, data)
