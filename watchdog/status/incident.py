"""An incident as it is journaled (incidents.jsonl, the write-ahead entry): what was
found, and what the response did, step by step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from watchdog.status.cluster import PeerView
from watchdog.status.codec import ABSENT, Absent, Decodable, Encodable, _int, _on_wire, decode
from watchdog.status.fence import Culprit


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
class Elsewhere(Decodable):
    """Another node's incident of the same job: where the evidence of its ranks there
    is (`mlx-watchdog incidents` on `host`, the folder `<state-dir>/evidence/<incident>/`
    there)."""

    host: str | None = None
    incident: str | None = None


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
    settle): "returned", "leaked", "held by live processes", "probe failed",
    "skipped: ..." or "no baseline"
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
    # The job's incidents on the other nodes of a fence, sent or taken (where the
    # evidence of its ranks there is): the origin's for a fenced node, each fenced
    # node's that answered with one for the origin.
    elsewhere: tuple[Elsewhere, ...] | None = field(default=None, metadata=_LATER)


    @classmethod
    def from_json(cls, data: Any) -> Incident:
        """An incident read back (incidents.jsonl, a write-ahead entry); ValueError
        without an id. An older or partial line reads with defaults."""
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise ValueError("no incident id")
        return decode(cls, data)
