"""The codec of the contract (watchdog/status/codec.py): each type's JSON derived from its
fields. Every type round-trips, and its keys are the ones the code wrote before the
codec, in the same order (written down from that code)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from watchdog import status
from watchdog.status import (
    ABSENT,
    ClusterNode,
    ComputingRank,
    CounterValues,
    Culprit,
    DaemonPointer,
    Expect,
    Fence,
    FlightEntry,
    HoldingRank,
    HotFrame,
    HotThread,
    Incident,
    IncidentRank,
    JobCulprit,
    JobState,
    JobView,
    LastCollective,
    LaunchEvent,
    NativeHot,
    NodeStatus,
    PathFrame,
    PeerView,
    RankStatus,
    RebootFlag,
    RebootReason,
    ReportedRank,
    SignalSent,
    Straggler,
    Unwritten,
    WiredCheck,
)

RANK = ["pid", "host", "job", "uid", "rank", "world_size", "attempt", "backend", "state",
        "phase", "progress", "collectives", "steps", "seconds_since_progress",
        "seconds_in_wait", "deadline_seconds", "busiest_thread_cpu", "computing",
        "current_op", "last_collective", "expect", "reason", "source", "holding",
        "data_link", "cause", "frames", "wait_share", "pace", "pace_score", "run_queue",
        "pace_why", "active_share"]
NODE_SHORT = ["host", "version", "started", "time", "ranks"]
NODE = ["host", "daemon_pid", "version", "mode", "interval", "time", "scan_monotonic", "dir",
        "state_dir", "started", "platform", "wired_bytes", "wired_baseline_bytes",
        "reboot_required", "reboot", "ranks", "invalid_records", "invalid_files", "counters",
        "launches", "unwritten", "scan_bucket_bounds", "record_dir_full", "stragglers"]
COUNTERS = ["stalls", "stall_causes", "kills", "job_kills", "invalid_records", "probe_errors",
            "loop_errors", "scan_buckets", "scan_sum", "scan_count"]
UNWRITTEN = ["reboot_flags_unwritten", "incidents_unwritten", "write_failures"]
CULPRIT = ["host", "rank", "pid", "state", "reason", "cause", "summary"]
FENCE = ["job", "uid", "origin", "reason", "culprit", "nonce", "time", "since"]
INCIDENT_RANK = ["pid", "rank", "state", "phase", "op", "seconds_in_wait",
                 "busiest_thread_cpu", "attempt", "progress", "collectives", "frames"]
FLIGHT_ENTRY = ["number", "op", "dtype", "bytes"]
SIGNAL = ["pid", "rank", "signal", "time", "result"]
LAST_COLLECTIVE = ["number", "op", "bytes"]
EXPECT = ["seconds", "reason"]
INCIDENT_FOUND = ["id", "time", "host", "job", "attempt", "uid", "verdict", "mode",
                  "kill_scope", "reason", "cause", "summary", "ranks", "pids",
                  "seconds_without_progress", "busiest_thread_cpu", "flight_recorder_tail",
                  "culprit"]
INCIDENT_FULL = INCIDENT_FOUND + [
    "signals", "wired_before", "wired_baseline", "cluster", "action", "evidence",
    "evidence_error", "ladder", "outcome", "native_hot", "wired_after", "wired_check",
    "reboot_required", "completed_at_start", "closed_at"]

CULPRIT_VALUE = Culprit("node-b", 1, 4242, "stopped", "frozen", "peer_stopped", "rank 1 ...")
RANK_VALUE = RankStatus(
    pid=7, host="h", job="j", uid=501, rank=0, world_size=2, attempt=3, backend="ring",
    state="stalled", phase="wait", progress=9, collectives=12, steps=4,
    seconds_since_progress=3.5, seconds_in_wait=3.25, deadline_seconds=2.0,
    busiest_thread_cpu=0.99, computing=False, current_op="eval (all_sum #12)",
    last_collective=LastCollective(12, "all_sum", 4096), expect=Expect(30.0, "checkpoint"),
    reason="in eval", source="daemon", holding=None, data_link="up", cause="peer_stopped",
    wait_share=0.4, pace=12.5, pace_score=1.0, run_queue=0.02)
STRAGGLER_VALUE = Straggler(job="j", uid=501, rank=1, host="h", pid=8, score=0.5,
                            slowdown=1.9, others_wait=0.47, why="run queue 45% (CPU contention)",
                            summary="rank 1 on h is the straggler: ...")
COUNTERS_VALUE = CounterValues(stalls={"stalled": 1, "blocked": 0}, stall_causes={"stalled:x": 1},
                          kills={"SIGTERM": 2}, job_kills={"j": 1}, invalid_records=3,
                          probe_errors=4, loop_errors=5, scan_buckets=(1, 0, 2),
                          scan_sum=0.25, scan_count=3)
NODE_VALUE = NodeStatus(
    host="h", daemon_pid=11, version="1.0", mode="enforce", interval=0.5, time=1.7e9,
    scan_monotonic=123.5, dir="/r", state_dir="/s", started=1.6e9, wired_bytes=10,
    wired_baseline_bytes=8, reboot_required=True,
    reboot=RebootFlag(reason="leak", reasons=(RebootReason(reason="leak", time=1.0,
                                                           incident="i", wired_after=None),)),
    ranks=(RANK_VALUE,), invalid_records={"/r/x.rec": "garbage"}, invalid_files=1,
    counters=COUNTERS_VALUE, launches={"relaunched": 2},
    unwritten=Unwritten(("a leak",), ("id-1", None), 2), scan_bucket_bounds=(0.1, 1.0),
    stragglers=(STRAGGLER_VALUE,), scanned=True)
FENCE_VALUE = Fence(job="j", uid=501, origin="node-a", reason="stalled", culprit=CULPRIT_VALUE,
                    nonce="n1", time=1.7e9, since=1.7e9 - 1)
INCIDENT_FOUND_VALUE = Incident(
    id="20260101T000000-abcdef", time=1.7e9, host="h", job="j", attempt=1, uid=501,
    verdict="stalled", mode="enforce", kill_scope="job", reason="r", cause="peer_stopped",
    summary="s", ranks=(IncidentRank(7, 0, "stalled", "wait", "eval", 3.0, 0.9, 1, 9, 12),),
    pids=(7,), seconds_without_progress=3.0, busiest_thread_cpu=0.9,
    flight_recorder_tail={"0": (FlightEntry(12, "all_sum", "float32", 4096),)},
    culprit=CULPRIT_VALUE)
INCIDENT_FULL_VALUE = dataclasses.replace(
    INCIDENT_FOUND_VALUE, signals=(SignalSent(7, 0, "SIGTERM", 1.7e9, "sent"),),
    wired_before=None, wired_baseline=5, cluster=PeerView(error="timed out"), action="ended",
    evidence=("/s/evidence/x.txt",), evidence_error="no py-spy", ladder="begun",
    outcome={"7": "killed"},
    native_hot=(NativeHot(0, 7, threads=(HotThread("Thread_1", 9, (HotFrame("f", "l", 8),),
                                                   (PathFrame("g", 9),)),)),
                NativeHot(1, 8, error="no call graph")), wired_after=6,
    wired_check="settled", reboot_required=False, completed_at_start=1.7e9 + 5,
    closed_at=1.7e9 + 9)

# The cluster view and the peers' verdict, as `cluster status --json` and an incident's
# "cluster" gave them before they were typed (net/cluster.py, act/peers.py).
JOB_CULPRIT = ["host", "node", "rank", "pid", "state", "reason"]
JOB_VIEW = ["job", "uid", "world_size", "state", "ranks", "missing_ranks", "culprit",
            "evidence", "cause", "summary", "straggler"]
STRAGGLER = ["job", "uid", "rank", "host", "pid", "score", "slowdown", "others_wait", "why",
             "summary"]
CLUSTER_NODE = ["peer", "ok", "error", "host", "reboot_required"]
PEER_VIEW = ["culprit", "evidence", "cause", "summary", "unreachable", "computing", "holding"]
COMPUTING = ["rank", "host", "pid"]
HOLDING = ["rank", "host", "pid", "what", "collectives"]
# The reboot flag and a launcher's event: the files' sorted keys.
REBOOT_FLAG = ["reason", "reasons"]
REBOOT_REASON = ["incident", "reason", "time", "wired_after", "wired_baseline"]
LAUNCH_ENDED = ["attempt", "ending", "event", "exit_code", "host", "incident", "job",
                "launcher_code", "progressed", "reason", "steps", "time", "uid", "waits"]

JOB_CULPRIT_VALUE = JobCulprit(host="h1", node="b:1", rank=1, pid=7, state="stopped",
                               reason="stopped at all_sum #3 while its peers wait")
JOB_VIEW_VALUE = JobView(job="j", uid=501, world_size=2, state=JobState.HUNG,
                         ranks=(ReportedRank("a:1", RANK_VALUE),), missing_ranks=(1,),
                         culprit=JOB_CULPRIT_VALUE, evidence="e", cause="peer_stopped",
                         summary="s", straggler=STRAGGLER_VALUE)
PEER_VIEW_VALUE = PeerView(culprit=JOB_CULPRIT_VALUE, evidence="e", cause="peer_stopped",
                           summary="s", unreachable=("c:1",),
                           computing=(ComputingRank(rank=1, host="h1", pid=7),),
                           holding=(HoldingRank(rank=1, host="h1", pid=7, what="saving",
                                                collectives=3),))
LAUNCH_ENDED_VALUE = LaunchEvent(attempt=1, ending="watchdog", event="ended", exit_code=3,
                                 host="h", incident=None, job="j", launcher_code=-9,
                                 progressed=True, reason="r", steps=4, time=1.7e9, uid=501,
                                 waits=10)

VALUES = [
    (RANK_VALUE, RANK), (NodeStatus(host="h", version="1", started=1.0), NODE_SHORT),
    (NODE_VALUE, NODE), (COUNTERS_VALUE, COUNTERS), (Unwritten(("x",), ("y",), 1), UNWRITTEN),
    (CULPRIT_VALUE, CULPRIT), (FENCE_VALUE, FENCE),
    (IncidentRank(7, 0, "stalled"), INCIDENT_RANK), (FlightEntry(1, "send", "int8", 1),
                                                     FLIGHT_ENTRY),
    (SignalSent(7, 0, "SIGKILL", 1.0, "gone"), SIGNAL),
    (LastCollective(3, "all_sum", 8), LAST_COLLECTIVE), (Expect(9.5, "save"), EXPECT),
    (INCIDENT_FOUND_VALUE, INCIDENT_FOUND), (INCIDENT_FULL_VALUE, INCIDENT_FULL),
    (JOB_CULPRIT_VALUE, JOB_CULPRIT), (PEER_VIEW_VALUE, PEER_VIEW),
    (ComputingRank(rank=1, host="h", pid=2), COMPUTING),
    (HoldingRank(rank=1, host="h", pid=2, what="saving", collectives=3), HOLDING),
    (RebootFlag(reason="x", reasons=(RebootReason(reason="x"),)), REBOOT_FLAG),
    (RebootReason(incident="i", reason="x", time=1.0, wired_after=2, wired_baseline=1),
     REBOOT_REASON),
    (LAUNCH_ENDED_VALUE, LAUNCH_ENDED), (STRAGGLER_VALUE, STRAGGLER),
    (DaemonPointer(daemon_pid=7, state_dir="/s", listen="127.0.0.1:9753"),
     ["daemon_pid", "state_dir", "listen"]),
]
# Written, never read back as such (the view is judged from the nodes' answers).
WRITTEN_ONLY = [(JOB_VIEW_VALUE, JOB_VIEW),
                (ClusterNode(peer="a:1", ok=False, error="timed out", host=None,
                             reboot_required=None), CLUSTER_NODE),
                # the enforcer's settle, as its dict was keyed
                (WiredCheck(wired_baseline=1, wired_after=None, wired_check="probe failed"),
                 ["wired_baseline", "wired_after", "wired_check"]),
                (WiredCheck(wired_check="no baseline"), ["wired_check"])]


@pytest.mark.parametrize("value, keys", VALUES + WRITTEN_ONLY,
                         ids=[f"{type(v).__name__}-{len(k)}" for v, k in VALUES + WRITTEN_ONLY])
def test_keys_are_todays(value, keys):
    assert list(value.to_json()) == keys


@pytest.mark.parametrize("value, keys", VALUES, ids=[f"{type(v).__name__}-{len(k)}"
                                                      for v, k in VALUES])
def test_every_type_round_trips_through_json_text(value, keys):
    text = json.dumps(value.to_json())
    back = type(value).from_json(json.loads(text))
    assert back == value
    assert json.dumps(back.to_json()) == text


def test_a_response_field_not_written_yet_has_no_key_and_null_is_a_value():
    assert "wired_after" not in INCIDENT_FOUND_VALUE.to_json()
    back = Incident.from_json(INCIDENT_FOUND_VALUE.to_json())
    assert back.wired_after is ABSENT and back.signals is None
    nulled = Incident.from_json({**INCIDENT_FOUND_VALUE.to_json(), "wired_after": None})
    assert nulled.wired_after is None and nulled.to_json()["wired_after"] is None


def test_wrong_types_read_as_defaults_and_lists_keep_their_good_items():
    node = NodeStatus.from_json({
        "host": ["h"], "interval": True, "scan_monotonic": 1, "invalid_files": "3",
        "scan_bucket_bounds": [0.1, "x", True, 2], "launches": {"a": 1, "b": "2"},
        "invalid_records": {"p": 5}, "unwritten": {"incidents_unwritten": ["i", 3],
                                                   "reboot_flags_unwritten": [1]},
        "counters": {"scan_buckets": [1, None, 2], "scan_sum": 0}})
    assert node.host is None and node.interval is None and node.invalid_files == 0
    assert node.scanned and node.scan_bucket_bounds == (0.1, 2)
    assert node.launches == {"a": 1} and node.invalid_records == {"p": "5"}
    assert node.unwritten.incidents_unwritten == ("i", None)
    assert node.unwritten.reboot_flags_unwritten == ("1",)
    assert node.counters.scan_buckets == (1, 2) and node.counters.stalls == {}
    assert node.counters.scan_sum == 0.0 and isinstance(node.counters.scan_sum, float)
    assert Expect.from_json({}) is None and Culprit.from_json([]) is None
    assert LastCollective.from_json({"number": "3"}) == LastCollective(None, None, None)
    fence = Fence.from_json({"job": "j", "uid": 1, "nonce": "n", "origin": 5, "reason": None})
    assert (fence.origin, fence.reason, fence.local) == ("5", None, False)


@pytest.mark.parametrize("cls, data", [
    (RankStatus, {"job": None}), (RankStatus, {"job": "j", "pid": "1"}),
    (RankStatus, {"job": "j", "last_collective": {"op": 3}}), (NodeStatus, []),
    (Incident, {"id": 3}), (Fence, {"job": "j", "uid": True, "nonce": "n"}),
    (Fence, {"job": "", "uid": 1, "nonce": "n"}),
])
def test_what_a_reader_cannot_do_without_is_refused(cls, data):
    with pytest.raises(ValueError):
        cls.from_json(data)


def test_the_peers_verdict_when_they_could_not_be_asked_is_its_error_alone():
    view = PeerView(error="timed out")
    assert view.to_json() == {"error": "timed out"}
    assert PeerView.from_json(view.to_json()) == view
    assert Incident.from_json({"id": "i", "cluster": "junk"}).cluster is None


def test_a_job_view_carries_its_state_as_the_word_and_its_ranks_with_their_node():
    shown = JOB_VIEW_VALUE.to_json()
    assert shown["state"] == "hung" and shown["missing_ranks"] == [1]
    assert shown["ranks"] == [{**RANK_VALUE.to_json(), "node": "a:1"}]
    assert ReportedRank.from_json(shown["ranks"][0]) == ReportedRank("a:1", RANK_VALUE)


def test_an_event_carries_only_its_own_facts():
    line = {"event": "restart", "job": "j", "attempt": 2, "backoff": 1.5, "time": 3.0}
    event = LaunchEvent.from_json(line)
    assert event.to_json() == line and event.ending is status.ABSENT
    with pytest.raises(ValueError):
        LaunchEvent.from_json({"job": "j"})


def test_native_stacks_keep_their_keys_and_drop_what_is_no_thread():
    hot = NativeHot.from_json({"rank": 0, "pid": 1, "threads": [
        {"thread": "T", "samples": 3, "top": [{"frame": "f", "lib": "l", "samples": 3}],
         "path": [{"frame": "f", "samples": 3}]}, {"top": "x"}, None]})
    assert [t.thread for t in hot.threads] == ["T"]
    assert list(hot.to_json()) == ["rank", "pid", "threads"]
    assert list(hot.to_json()["threads"][0]) == ["thread", "samples", "top", "path"]
    assert list(hot.threads[0].top[0].to_json()) == ["frame", "lib", "samples"]
    assert list(NativeHot(0, 1, error="e").to_json()) == ["rank", "pid", "error"]


def test_a_decoded_default_is_never_shared_between_objects():
    a, b = CounterValues.from_json({}), CounterValues.from_json({})
    a.stalls["stalled"] = 1
    assert b.stalls == {} and status.CounterValues().stalls == {}


def test_a_fence_answer_is_todays_json_either_way():
    from watchdog.status import FenceAnswer

    ending = FenceAnswer("j", 501, (7, 9))
    assert ending.to_json() == {"job": "j", "uid": 501, "ending": [7, 9]}
    assert list(ending.to_json()) == ["job", "uid", "ending"]
    assert FenceAnswer(error="replayed nonce").to_json() == {"error": "replayed nonce"}
    assert FenceAnswer.from_json(json.loads(json.dumps(ending.to_json()))) == ending
    assert FenceAnswer.from_json("junk") == FenceAnswer()
