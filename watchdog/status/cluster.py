"""The cluster view (`cluster status --json`: every node's answer, each job judged) and
the peers' verdict on a job of ours (an incident's "cluster")."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from watchdog.status.codec import Decodable, Encodable, _obj, _on_wire, _str, decode, encode
from watchdog.status.node import NodeStatus
from watchdog.status.rank import RankStatus, Straggler


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
        """The rank's JSON with the node that reported it."""
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
    # A rank stopped while its peers wait, none of them past its deadline yet: a
    # Ctrl-Z or a debugger's pause, or the start of a hang (not a failing exit).
    SUSPECT = "suspect"
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
        """The culprit read from JSON; None for anything but a non-empty object."""
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
    # Ranks there a person traces (state `traced`), or whose tracer let go less than
    # their deadline ago: the job is held, however long, and judged afresh from the detach.
    traced: tuple[HoldingRank, ...] = field(default=(), metadata=_on_wire(omit="empty"))
    error: str | None = field(default=None, metadata=_on_wire(omit="none"))

    def to_json(self) -> dict[str, Any]:
        """The view's JSON, or only its error when the peers could not be asked."""
        return {"error": self.error} if self.error is not None else encode(self)

    @classmethod
    def from_json(cls, data: Any) -> PeerView | None:
        """The view read from JSON; None for anything but an object."""
        return decode(cls, data) if isinstance(data, dict) else None
