"""The node as the daemon publishes it after each scan (`/status`, `status.json`, what
`/metrics` is built from): its ranks, its counters as they stood, the reboot flag,
what a failed write holds in memory; and the record directory's pointer to its daemon."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from watchdog.status.codec import ABSENT, Absent, Decodable, Encodable, _on_wire, decode, encode
from watchdog.status.rank import RankStatus, Straggler, valid_ranks


def job_key(uid: int | None, job: str) -> str:
    """A per-job count's key: "<uid>:<job>" (a job is its owner's uid with its id:
    any user may name any job id, so a count keyed by the id alone is anyone's)."""
    return f"{'' if uid is None else uid}:{job}"


def split_job_key(key: str) -> tuple[str, str]:
    """(uid, job) of a `job_key`; a key of an older daemon (the job alone) has no uid."""
    uid, sep, job = key.partition(":")
    return (uid, job) if sep and (uid.isdigit() or not uid) else ("", key)


def stall_key(verdict: str, cause: str | None) -> str:
    """A count of hangs by verdict and cause: its key, "<verdict>:<cause>" (a hang
    without a cause counts as "unknown")."""
    return f"{verdict}:{cause or 'unknown'}"


@dataclass(frozen=True, kw_only=True)
class CounterValues(Decodable):
    """The daemon's counters as published (`counters` in /status): a copy of what its
    loop counts (daemon/counters.py), taken with each snapshot. Read back, a missing
    count is none at all."""

    stalls: dict[str, int] = field(default_factory=dict)  # verdict -> hangs acted on
    stall_causes: dict[str, int] = field(default_factory=dict)  # stall_key -> count
    kills: dict[str, int] = field(default_factory=dict)  # signal -> sent to end a rank
    job_kills: dict[str, int] = field(default_factory=dict)  # job_key(uid, job) -> ranks
    invalid_records: int = 0
    probe_errors: int = 0
    loop_errors: int = 0
    scan_buckets: tuple[int, ...] = ()  # per bound of scan_bucket_bounds, then +Inf
    scan_sum: float = 0.0
    scan_count: int = 0


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
        """The flag read from JSON; None for anything but an object."""
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
    # The OS the daemon runs its path for: "macos", "linux", or "macos (simulated)"
    # (the test aid of docs/macos.md, never mistaken for a real Mac); None: an older daemon.
    platform: str | None = None
    wired_bytes: int | None = None
    wired_baseline_bytes: int | None = None
    reboot_required: bool | None = None
    reboot: RebootFlag | None = None  # the reboot flag (journal.reboot_flag)
    # A peer's answer whose ranks are malformed keeps the others (valid_ranks).
    ranks: tuple[RankStatus, ...] = field(default=(), metadata=_on_wire(
        read=lambda data: valid_ranks(data.get("ranks"))))
    invalid_records: dict[str, str] = field(default_factory=dict)  # path -> why
    invalid_files: int = 0
    counters: CounterValues = field(default_factory=CounterValues)
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
        """The snapshot's JSON: whole once the daemon has scanned, its head alone before."""
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
