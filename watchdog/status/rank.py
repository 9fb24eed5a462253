"""A rank as users see it (`status --json`, `/status` "ranks"), and the straggler that
holds a job back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watchdog.status.codec import Encodable, _on_wire, decode

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
    # Whether `quiet_seconds` was read from each socket's byte counters (exact), not the
    # queues alone (issue 58: the lower wedge floor needs every rank's exact).
    quiet_exact: bool | None = field(default=None, metadata=_on_wire(omit="none"))
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
    # While it is not judged against its job's ranks, why: in words ("not judged: idle
    # between steps 80% of the time") and as a code for a metric label ("sleeps",
    # "user_space_wait", "too_few_seconds", ...). No key while judged or unknown.
    pace_note: str | None = field(default=None, metadata=_on_wire(omit="none"))
    pace_unjudged: str | None = field(default=None, metadata=_on_wire(omit="none"))
    # While it is traced by anything but the daemon's own stack sampler (state `traced`):
    # the tracer's pid and name (a debugger, a profiler). After the detach, the seconds
    # since its job was last seen traced, while its job is judged afresh from the detach
    # (its deadline not yet passed since). No key otherwise.
    tracer_pid: int | None = field(default=None, metadata=_on_wire(omit="none"))
    tracer: str | None = field(default=None, metadata=_on_wire(omit="none"))
    since_traced: float | None = field(default=None, metadata=_on_wire(omit="none"))
    # At bring-up (mx.distributed.init): the ranks of its job not seen yet (on this node,
    # or the peers' answers), which it waits for; no key otherwise or while unknown.
    awaiting: tuple[int, ...] | None = field(default=None, metadata=_on_wire(omit="none"))
    # Its GPU time flat while another process's advances on a busy GPU (macOS): what its
    # work waits behind ("pid 812 (python3.12)'s GPU work, GPU 99% resident at 9100 mW").
    waits_behind: str | None = field(default=None, metadata=_on_wire(omit="none"))


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
