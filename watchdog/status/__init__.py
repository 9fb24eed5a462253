"""The daemon-to-everyone contract: what a rank, a node, an incident, a fence, the
cluster view and a launcher's event look like.

Data only, like `states.py`: dataclasses with one `to_json()` and one `from_json()`
each, both derived from the fields by the codec (`codec.py`: `encode`, `decode`),
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

The types are grouped by what they describe, each module importing only those
before it: `codec.py` (the codec), `rank.py` (a rank, a straggler), `node.py` (the
node: its counters as published, the reboot flag, the pointer), `cluster.py` (the
cluster view, the peers' verdict), `fence.py`, `incident.py`, `launch.py` (the
launcher's journal). Every public name is imported from here.
"""

from __future__ import annotations

from watchdog.status.cluster import (
    ClusterNode,
    ClusterView,
    ComputingRank,
    HoldingRank,
    JobCulprit,
    JobState,
    JobView,
    NodeAnswer,
    PeerView,
    ReportedRank,
)
from watchdog.status.codec import (
    ABSENT,
    MAX_TEXT,
    OMIT,
    READ,
    WIRE_SKIP,
    Absent,
    Decodable,
    Encodable,
    decode,
    encode,
)
from watchdog.status.fence import Culprit, Fence, FenceAnswer, FenceSent
from watchdog.status.incident import (
    Elsewhere,
    FlightEntry,
    HotFrame,
    HotThread,
    Incident,
    IncidentRank,
    NativeHot,
    PathFrame,
    SignalSent,
    WiredCheck,
)
from watchdog.status.launch import LaunchEvent
from watchdog.status.node import (
    CounterValues,
    DaemonPointer,
    NodeStatus,
    RebootFlag,
    RebootReason,
    Unwritten,
    job_key,
    split_job_key,
    stall_key,
)
from watchdog.status.rank import (
    COLLECTIVE_FIELDS,
    RANK_FIELDS,
    Expect,
    LastCollective,
    RankStatus,
    Straggler,
    valid_ranks,
)

__all__ = [
    "ABSENT", "COLLECTIVE_FIELDS", "MAX_TEXT", "OMIT", "RANK_FIELDS", "READ", "WIRE_SKIP", "Absent",
    "ClusterNode", "ClusterView", "ComputingRank", "CounterValues", "Culprit",
    "DaemonPointer", "Decodable", "Elsewhere", "Encodable", "Expect", "Fence", "FenceAnswer",
    "FenceSent",
    "FlightEntry", "HoldingRank", "HotFrame", "HotThread", "Incident", "IncidentRank",
    "JobCulprit", "JobState", "JobView", "LastCollective", "LaunchEvent", "NativeHot",
    "NodeAnswer", "NodeStatus", "PathFrame", "PeerView", "RankStatus", "RebootFlag",
    "RebootReason", "ReportedRank", "SignalSent", "Straggler", "Unwritten", "WiredCheck",
    "decode", "encode", "job_key", "split_job_key", "stall_key", "valid_ranks",
]
