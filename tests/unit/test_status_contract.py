"""The daemon-to-everyone contract (watchdog/status/): a rank's status, a node's, an
incident and a fence. Each is built by the daemon's own code here, turned into JSON
and read back: the JSON keeps today's shape (docs/metrics.md, `status --json`,
`/status`, incidents.jsonl), reads back equal, and a peer's malformed answer is
refused as the cluster view refused it before."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO
from tests.support.users import publish
from watchdog import record
from watchdog.daemon.act.incidents import new_incident
from watchdog.daemon.config import Settings
from watchdog.daemon.counters import Counters
from watchdog.daemon.judge import cluster
from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.lifecycle import Rank
from watchdog.daemon.publish import snapshot
from watchdog.net import fence
from watchdog.states import State
from watchdog.status import (
    ABSENT,
    Culprit,
    Expect,
    Fence,
    Incident,
    LastCollective,
    NodeAnswer,
    NodeStatus,
    RankStatus,
    SignalSent,
    Unwritten,
)

OPT_INT, OPT_NUM, OPT_STR = (int, type(None)), (int, float, type(None)), (str, type(None))
# Every key of a rank of /status and `status --json`, in order, with its JSON types.
RANK_SHAPE = {
    "pid": (int,), "host": (str,), "job": (str,), "uid": (int,), "rank": (int,),
    "world_size": (int,), "attempt": OPT_INT, "backend": (str,), "state": (str,),
    "phase": (str,), "progress": (int,), "collectives": (int,), "steps": (int,),
    "seconds_since_progress": OPT_NUM, "seconds_in_wait": OPT_NUM,
    "deadline_seconds": OPT_NUM, "busiest_thread_cpu": OPT_NUM,
    "computing": (bool, type(None)), "current_op": (str,),
    "last_collective": (dict, type(None)), "expect": (dict, type(None)), "reason": (str,),
    "source": (str,), "holding": OPT_STR, "data_link": OPT_STR, "cause": OPT_STR,
    "frames": OPT_STR,
    "wait_share": OPT_NUM, "pace": OPT_NUM, "pace_score": OPT_NUM, "run_queue": OPT_NUM,
    "pace_why": OPT_STR, "active_share": OPT_NUM,
}
# Every key of /status (and status.json), in order, with its JSON types.
NODE_SHAPE = {
    "host": (str,), "daemon_pid": (int,), "version": (str,), "mode": (str,),
    "interval": (int, float), "time": OPT_NUM, "scan_monotonic": (int, float), "dir": (str,),
    "state_dir": (str,), "started": (int, float), "platform": (str,), "wired_bytes": OPT_INT,
    "wired_baseline_bytes": OPT_INT, "reboot_required": (bool,),
    "reboot": (dict, type(None)), "ranks": (list,), "invalid_records": (dict,),
    "invalid_files": (int,), "counters": (dict,), "launches": (dict,), "unwritten": (dict,),
    "scan_bucket_bounds": (list,), "record_dir_full": OPT_STR, "stragglers": (list,),
}
COUNTER_KEYS = ["stalls", "stall_causes", "kills", "job_kills", "invalid_records", "probe_errors",
                "loop_errors", "scan_buckets", "scan_sum", "scan_count"]
INCIDENT_FOUND = ["id", "time", "host", "job", "attempt", "uid", "verdict", "mode",
                  "kill_scope", "reason", "cause", "summary", "ranks", "pids",
                  "seconds_without_progress", "busiest_thread_cpu", "flight_recorder_tail",
                  "culprit"]


def _shape(item: dict, shape: dict) -> None:
    assert list(item) == list(shape)
    for key, types in shape.items():
        assert isinstance(item[key], types), (key, item[key])


@pytest.fixture
def hung_rank(tmp_path) -> Rank:
    """A real record of this process, hung in a wait, with the detector's verdict."""
    path = publish(tmp_path, os.getpid(), os.getuid(), "job-1", hung=True, world_size=2)
    verdict = Verdict(State.STALLED, deadline=0.5, seconds_in_wait=12.34567,
                      seconds_since_progress=12.5, busiest_cpu=0.987654, act=True,
                      reason="in eval for 12.3s, past the 0.5s deadline", computing=False)
    return Rank(str(path), record.read_path(str(path)), state=State.STALLED, verdict=verdict,
                attempt=2)


def _node(tmp_path, ranks: list[Rank]) -> NodeStatus:
    counters = Counters.zeroed()
    counters.observe_scan(0.003)
    counters.kills["SIGTERM"] += 1
    settings = Settings(dir=str(tmp_path), state_dir=str(tmp_path / "state"))
    return snapshot(host="node-a", settings=settings, ranks=ranks, counters=counters,
                    scanned=(1.7e9, 123.5), started=1.7e9 - 60, wired=(3 << 30, 1 << 30),
                    invalid={"/x/bad.rec": "bad magic"}, invalid_count=1,
                    launches={"restart": 1},
                    backlog=Unwritten(("a leak",), ("20260101T000000-abcdef",), 2))


# -- the shapes of today -----------------------------------------------------------------


def test_a_built_snapshot_gives_the_json_of_status_key_for_key(tmp_path, hung_rank):
    snap = _node(tmp_path, [hung_rank]).to_json()
    _shape(snap, NODE_SHAPE)
    (rank,) = snap["ranks"]
    _shape(rank, RANK_SHAPE)
    assert rank["expect"] == {"seconds": 0.5, "reason": ""}
    assert rank["seconds_in_wait"] == 12.346 and rank["busiest_thread_cpu"] == 0.988
    assert (rank["state"], rank["phase"], rank["attempt"]) == ("stalled", "wait", 2)
    assert list(snap["counters"]) == COUNTER_KEYS
    assert snap["counters"]["kills"] == {"SIGTERM": 1, "SIGKILL": 0}
    assert snap["unwritten"] == {"reboot_flags_unwritten": ["a leak"],
                                 "incidents_unwritten": ["20260101T000000-abcdef"],
                                 "write_failures": 2}
    # The flag could not be written: the node says so from memory.
    assert snap["reboot_required"] is True
    assert snap["reboot"] == {"reason": "a leak", "unwritten": True}
    json.dumps(snap)  # plain JSON, no default= needed


def test_before_its_first_scan_a_daemon_publishes_the_short_form():
    early = NodeStatus(host="node-a", version="1.0", started=5.0)
    assert early.to_json() == {"host": "node-a", "version": "1.0", "started": 5.0,
                               "time": None, "ranks": []}
    assert NodeStatus.from_json(early.to_json()) == early


# -- round trips -------------------------------------------------------------------------


def test_every_part_reads_back_equal(tmp_path, hung_rank):
    node = _node(tmp_path, [hung_rank])
    assert NodeStatus.from_json(json.loads(json.dumps(node.to_json()))) == node
    full = dataclasses.replace(node.ranks[0], last_collective=LastCollective(7, "all_sum"),
                               expect=Expect(30.0, "checkpoint"), computing=True)
    assert RankStatus.from_json(full.to_json()) == full
    culprit = Culprit("node-b", 1, 4242, "stopped", "stopped while its peers wait")
    peer_fence = Fence(job="job-1", uid=501, origin="node-b", reason="stalled: x",
                       culprit=culprit, nonce="ab" * 16, time=1.7e9)
    assert Fence.from_json(json.loads(json.dumps(peer_fence.to_json()))) == peer_fence


def test_an_incident_reads_back_equal_at_every_step_of_its_response(hung_rank):
    found = new_incident(wall=1.7e9, host="node-a", uid=os.getuid(), job="job-1",
                         mode="enforce", kill_scope="job", due=[hung_rank],
                         targets=[hung_rank], local=[hung_rank], fenced=None)
    assert list(found.to_json()) == INCIDENT_FOUND  # nothing of the response yet
    steps = [found]
    steps.append(dataclasses.replace(steps[-1], signals=(), wired_before=None,
                                     wired_baseline=1 << 30, cluster=None))
    steps.append(dataclasses.replace(steps[-1], action="ending"))
    steps.append(dataclasses.replace(steps[-1], evidence=("/e/rank0-python.txt",),
                                     action="ended", ladder="begun"))
    steps.append(dataclasses.replace(steps[-1], signals=(
        SignalSent(os.getpid(), 0, "SIGCONT", 1.7e9 + 1, "sent"),
        SignalSent(os.getpid(), 0, "SIGTERM", 1.7e9 + 1, "sent")),
        outcome={str(os.getpid()): "killed"}))
    steps.append(dataclasses.replace(steps[-1], wired_after=None, wired_check="probe failed",
                                     reboot_required=False, closed_at=1.7e9 + 2))
    for step in steps:
        line = json.loads(json.dumps(step.to_json(), sort_keys=True))
        assert Incident.from_json(line) == step
        assert Incident.from_json(line).to_json() == line  # the journaled JSON, unchanged
    last = steps[-1].to_json()
    # A null read back is a value written (the probe failed), not a step to come.
    assert last["wired_before"] is None and last["wired_after"] is None
    assert last["cluster"] is None and "evidence_error" not in last
    assert steps[0].wired_after is ABSENT and "wired_after" not in steps[1].to_json()


def test_an_older_or_partial_file_is_read_with_defaults():
    # status.json of an older daemon: no counters, no unwritten, a field of a wrong type.
    old = NodeStatus.from_json({"daemon_pid": 7, "interval": "1", "scan_monotonic": 3.0,
                                "ranks": [{"job": "j", "pid": 1}]})
    assert (old.daemon_pid, old.interval, old.counters.kills) == (7, None, {})
    assert old.ranks == (RankStatus(job="j", pid=1),)
    # An incident line of an earlier version, or one written before its response.
    inc = Incident.from_json({"id": "i1", "job": "j", "ranks": [{"pid": 3}]})
    assert (inc.ranks[0].pid, inc.signals, inc.outcome) == (3, None, None)
    with pytest.raises(ValueError):
        Incident.from_json({"job": "j"})  # no id: nothing to name it by


# -- untrusted peers ---------------------------------------------------------------------

GOOD = {"job": "j", "host": "b", "pid": 11, "uid": 501, "rank": 0, "world_size": 2,
        "state": "suspect", "phase": "wait", "reason": "", "progress": 3, "collectives": 4,
        "computing": False, "last_collective": {"number": 4, "op": "all_sum"}}
MALFORMED = [
    {**GOOD, "job": None}, {**GOOD, "pid": "11"}, {**GOOD, "pid": True},
    {**GOOD, "rank": 0.5}, {**GOOD, "world_size": [2]}, {**GOOD, "computing": "yes"},
    {**GOOD, "state": 3}, {**GOOD, "last_collective": {"number": "4"}},
    {**GOOD, "last_collective": [4]}, "not a rank",
]


@pytest.mark.parametrize("bad", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_rank_of_a_peer_is_refused_and_the_others_kept(bad):
    with pytest.raises(ValueError):
        RankStatus.from_json(bad)
    node = NodeStatus.from_json({"host": ["h"], "ranks": [bad, GOOD]})
    assert [r.pid for r in node.ranks] == [11] and node.host is None
    view = cluster.analyze([NodeAnswer.from_json(
        {"peer": "p", "ok": True, "status": {"ranks": [bad, GOOD]}})]).to_json()
    assert [r["pid"] for r in view["jobs"][0]["ranks"]] == [11]


def test_a_peer_rank_with_junk_in_the_fields_it_does_not_line_up_reads_as_none():
    rank = RankStatus.from_json({**GOOD, "steps": "many", "seconds_in_wait": [1]})
    assert rank.steps is None and rank.seconds_in_wait is None and rank.pid == 11


@pytest.mark.parametrize("body", [
    {"uid": 1, "nonce": "n"}, {"job": "", "uid": 1, "nonce": "n"},
    {"job": "j", "uid": True, "nonce": "n"}, {"job": "j", "uid": 2**32, "nonce": "n"},
    {"job": "j", "uid": 1}, ["j", 1, "n"],
])
def test_a_fence_without_job_owner_or_nonce_is_refused(body):
    with pytest.raises(ValueError, match="job, uid or nonce"):
        Fence.from_json(body)
    secret = "correct horse battery staple"
    raw = json.dumps(body).encode()
    headers = {fence.TIMESTAMP: "1000.000", fence.SIGNATURE: fence.sign(secret, "1000.000", raw)}
    with pytest.raises(fence.FenceRejected, match="job, uid or nonce"):
        fence.verify(secret, headers, raw, fence.NonceCache(), now=1000.0)


def test_a_signed_fence_is_read_as_a_typed_request():
    secret = "correct horse battery staple"
    culprit = Culprit("node-b", 1, 42, "stopped", "frozen")
    body, headers = fence.make(secret, "j", "node-b", "stalled: x", culprit, now=1000.0, uid=7)
    got = fence.verify(secret, headers, body, fence.NonceCache(), now=1000.0)
    assert (got.job, got.uid, got.origin, got.culprit, got.local) == (
        "j", 7, "node-b", culprit, False)
    assert sorted(json.loads(body)) == ["culprit", "job", "nonce", "origin", "reason", "since",
                                        "time", "uid"]


def test_the_contract_imports_no_daemon_code():
    code = ("import sys, watchdog.status; "
            "print(sorted(m for m in sys.modules if m.startswith('watchdog.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    loaded = json.loads(out.replace("'", '"'))
    assert "watchdog.status.codec" in loaded, loaded
    assert all(name.startswith("watchdog.status.") or name == "watchdog.status"
               for name in loaded), loaded


# The contract's modules, each importing only those before it (docs/architecture.md).
CONTRACT_ORDER = ["codec", "rank", "node", "cluster", "fence", "incident", "launch"]


def test_the_contract_modules_import_only_those_before_them():
    package = REPO / "watchdog" / "status"
    assert sorted(p.stem for p in package.glob("*.py")) == sorted(
        [*CONTRACT_ORDER, "__init__"])
    for at, name in enumerate(CONTRACT_ORDER):
        tree = ast.parse((package / f"{name}.py").read_text(encoding="utf-8"))
        imported = {node.module for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("watchdog")}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                     for alias in node.names if alias.name.startswith("watchdog")}
        allowed = {f"watchdog.status.{before}" for before in CONTRACT_ORDER[:at]}
        assert imported <= allowed, (name, imported - allowed)


def _defined(tree: ast.Module) -> list[str]:
    """The names a module defines at its top level."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [e.id for target in node.targets
                      for e in (target.elts if isinstance(target, ast.Tuple) else [target])
                      if isinstance(e, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def test_every_public_name_of_the_contract_is_the_packages_and_every_type_frozen():
    import importlib

    import watchdog.status as contract

    for name in CONTRACT_ORDER:
        module = importlib.import_module(f"watchdog.status.{name}")
        tree = ast.parse((REPO / "watchdog" / "status" / f"{name}.py").read_text("utf-8"))
        for attr in _defined(tree):
            if attr.startswith("_") or attr in ("T", "D"):  # the codec's type variables
                continue
            value = getattr(module, attr)
            assert attr in contract.__all__ and getattr(contract, attr) is value, attr
            if dataclasses.is_dataclass(value):
                # Data only: what is counted as it happens is the daemon's (daemon/counters.py).
                assert value.__dataclass_params__.frozen, attr  # type: ignore[attr-defined]
    assert all(hasattr(contract, name) for name in contract.__all__)
