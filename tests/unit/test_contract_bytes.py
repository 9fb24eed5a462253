"""The contract's bytes stay as they are (issue 40): a rich, fixed node (ranks in every
state, a straggler, a hold, a data link down, incidents with their peers' verdict and
native dumps, fences, the reboot flag, launcher events) rendered the ways readers get
it, compared with golden files in tests/unit/data/golden written by the code before
status.py was split:

- `/metrics` (the collector's families; the build's Python version masked),
- `/status` as the HTTP endpoint renders it, and `status.json` as the daemon writes it,
- `status --json` and `status`, `incidents --json` and `incidents`, read back by the CLI,
- the cluster view of this node and a peer (`cluster status --json` and its text),
- every other contract type's JSON (a fence, its answers, the pointer, ...).

A change that moves or renames code must leave every byte of these. A change that adds
a field changes them on purpose: regenerate with `MLXWD_GOLDEN_WRITE=1 pytest
tests/unit/test_contract_bytes.py` and check that the diff is only the new keys.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from watchdog.cli.commands import cli
from watchdog.cli.look.cluster import render_text
from watchdog.daemon.judge import cluster as judge
from watchdog.daemon.store import journal, launchlog
from watchdog.net.http import _Server
from watchdog.net.metrics import SnapshotCollector
from watchdog.status import (
    ABSENT,
    ComputingRank,
    Culprit,
    DaemonPointer,
    Expect,
    Fence,
    FenceAnswer,
    FenceSent,
    FlightEntry,
    HoldingRank,
    HotFrame,
    HotThread,
    Incident,
    IncidentRank,
    JobCulprit,
    LastCollective,
    LaunchEvent,
    NativeHot,
    NodeAnswer,
    NodeStatus,
    PathFrame,
    PeerView,
    RankStatus,
    RebootFlag,
    RebootReason,
    SignalSent,
    Straggler,
    Unwritten,
    WiredCheck,
)

GOLDEN = Path(__file__).parent / "data" / "golden"
PROMETHEUS_CLIENT = "0.26.0"  # the version that rendered metrics*.txt
WRITE = os.environ.get("MLXWD_GOLDEN_WRITE") == "1"
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _rank(job: str, n: int | None, state: str, **over: object) -> RankStatus:
    """One rank as the daemon shows it; `over` sets what makes it itself."""
    base: dict[str, object] = dict(
        pid=4000 + (n or 0), host="node-a", job=job, uid=501, rank=n, world_size=6,
        attempt=1, backend="ring", state=state, phase="wait", progress=120 + (n or 0),
        collectives=60, steps=12, seconds_since_progress=0.25, seconds_in_wait=0.125,
        deadline_seconds=30.0, busiest_thread_cpu=0.5, computing=False,
        current_op="eval (all_sum #60)", last_collective=LastCollective(60, "all_sum", 4096),
        expect=None, reason="", source="daemon", holding=None, data_link=None, cause=None,
        frames=None, wait_share=0.25, pace=4.5, pace_score=1.0, run_queue=0.01,
        pace_why="", active_share=1.0)
    base.update(over)
    return RankStatus(**base)  # type: ignore[arg-type]


RANKS = (
    _rank("train", 0, "stalled", seconds_since_progress=41.5, seconds_in_wait=41.25,
          busiest_thread_cpu=0.987, reason="in eval for 41.2s, past the 30.0s deadline",
          data_link="down 10.0.0.2:5001 (connect refused)", cause="data_link_down",
          frames="busy thread 4001 spins in SocketThread::worker -> recv"),
    _rank("train", 1, "stopped", pid=4011, busiest_thread_cpu=0.0, current_op="step",
          phase="compute", reason="stopped (SIGSTOP or traced)", wait_share=None, pace=None,
          pace_score=None, run_queue=None, active_share=None),
    _rank("train", 2, "running", computing=True, phase="compute", current_op="compute",
          last_collective=None, busiest_thread_cpu=1.0, pace_score=0.5, wait_share=0.0,
          pace_why="run queue 45% (CPU contention)"),
    _rank("train", 3, "suspect", seconds_in_wait=17.0, seconds_since_progress=17.5,
          holding="saving a checkpoint (1.2 GB in 40 s)",
          expect=Expect(120.0, "checkpoint"), reason="in eval for 17.0s, half the deadline"),
    _rank("serve", 0, "idle", uid=502, world_size=2, backend="jaccl", phase="idle",
          current_op="idle", attempt=None, last_collective=None, wait_share=None,
          pace=None, pace_score=None, run_queue=None, pace_why=None, active_share=0.0),
    _rank("serve", 1, "blocked", uid=502, world_size=2, backend="jaccl", pid=4021,
          busiest_thread_cpu=0.0, seconds_in_wait=95.0, deadline_seconds=90.0,
          reason="in all_sum for 95.0s, past the 90.0s deadline, nothing spinning",
          cause="peer_dead"),
    _rank("old", 0, "killed", uid=0, world_size=4, attempt=3, backend="mpi", steps=None,
          reason="ended by the watchdog (incident 20260101T000010-aaaaaa)"),
    _rank("old", 1, "unkillable", uid=0, world_size=4, attempt=3, backend="mpi",
          reason="still present 10.0s after SIGKILL"),
    _rank("old", 2, "exited", uid=0, world_size=4, attempt=3, backend="mpi",
          seconds_since_progress=None, seconds_in_wait=None, deadline_seconds=None,
          busiest_thread_cpu=None, computing=None),
    _rank("odd", None, "abandoned", uid=None, world_size=1, backend="jaccl",
          host="node-a\x1b[31m", reason="record closed while the process lives",
          current_op="all_gather\nforged"),
    _rank("train", 5, "running", source="sampled", pid=4005, host="node-a",
          wait_share=0.75, pace_score=1.25),
)
STRAGGLER = Straggler(job="train", uid=501, rank=2, host="node-a", pid=4002, score=0.5,
                      slowdown=1.9, others_wait=0.47, why="run queue 45% (CPU contention)",
                      summary="rank 2 on node-a (pid 4002) is the straggler: run queue 45%")


def _counters() -> object:
    """The published counters (read through the node's own reader: the type's name is
    no part of the bytes)."""
    return NodeStatus.from_json({"counters": {
        "stalls": {"stalled": 2, "blocked": 1, "fenced": 1, "peer_died": 0},
        "stall_causes": {"stalled:data_link_down": 1, "stalled:unknown": 1,
                         "blocked:peer_dead": 1, "fenced:peer_stopped": 1},
        "kills": {"SIGTERM": 5, "SIGKILL": 1},
        "job_kills": {"0:old": 3, "501:train": 0, ":legacy": 2, "legacy-no-uid": 1},
        "invalid_records": 7, "probe_errors": 4, "loop_errors": 1,
        "scan_buckets": [90, 40, 12, 6, 3, 1, 0, 0, 0, 0, 0, 0, 0, 1],
        "scan_sum": 12.375, "scan_count": 153}}).counters


NODE = NodeStatus(
    host="node-a", daemon_pid=999, version="9.9.9", mode="enforce", interval=1.0,
    time=T0 + 100.5, scan_monotonic=5000.25, dir="/var/run/mlx-watchdog",
    state_dir="/var/lib/mlx-watchdog", started=T0, wired_bytes=3 << 30,
    wired_baseline_bytes=1 << 30, reboot_required=True,
    reboot=RebootFlag(reason="wired memory leaked: 2.0 GiB over the baseline",
                      reasons=(RebootReason(incident="20260101T000010-aaaaaa",
                                            reason="wired memory leaked: 2.0 GiB over the "
                                                   "baseline", time=T0 + 12.0,
                                            wired_after=3 << 30, wired_baseline=1 << 30),
                               RebootReason(reason="rank 1 (pid 4011) unkillable",
                                            time=T0 + 20.0))),
    ranks=RANKS, invalid_records={"/var/run/mlx-watchdog/junk.rec": "bad magic",
                                  "/var/run/mlx-watchdog/9.rec": "size 12, expected 24576"},
    invalid_files=2, counters=_counters(),  # type: ignore[arg-type]
    launches={"restart": 2, "refused": 1, "gave_up": 0},
    unwritten=Unwritten(("a leak",), ("20260101T000020-bbbbbb", None), 3),
    scan_bucket_bounds=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0, 10.0),
    record_dir_full="no room left in /var/run/mlx-watchdog: uid 501 holds 900 MB",
    stragglers=(STRAGGLER,), scanned=True)

PEER = NodeStatus(
    host="node-b", daemon_pid=1999, version="9.9.9", mode="observe", interval=1.0,
    time=T0 + 100.0, scan_monotonic=7000.0, dir="/var/run/mlx-watchdog",
    state_dir="/var/lib/mlx-watchdog", started=T0, wired_bytes=None,
    wired_baseline_bytes=None, reboot_required=False, reboot=None,
    ranks=(_rank("train", 4, "stalled", host="node-b", pid=5004,
                 seconds_in_wait=40.0, reason="in eval for 40.0s, past the 30.0s deadline"),
           _rank("serve", 1, "running", host="node-b", uid=503, world_size=2, pid=5001)),
    scanned=True)

JOB_CULPRIT = JobCulprit(host="node-a", node="node-a:9753", rank=1, pid=4011,
                         state="stopped", reason="stopped at all_sum #60 while its peers wait")
PEER_VIEW = PeerView(culprit=JOB_CULPRIT, evidence="rank 1 stopped", cause="peer_stopped",
                     summary="rank 1 on node-a (pid 4011) is stopped", unreachable=("node-c:9753",),
                     computing=(ComputingRank(rank=2, host="node-a", pid=4002),),
                     holding=(HoldingRank(rank=3, host="node-a", pid=4003,
                                          what="saving a checkpoint", collectives=60),))
CULPRIT = Culprit("node-a", 1, 4011, "stopped", "stopped while its peers wait",
                  "peer_stopped", "rank 1 on node-a (pid 4011) is stopped at all_sum #60")
FOUND = Incident(
    id="20260101T000010-aaaaaa", time=T0 + 10.0, host="node-a", job="train", attempt=1,
    uid=501, verdict="stalled", mode="enforce", kill_scope="job",
    reason="in eval for 41.2s, past the 30.0s deadline", cause="peer_stopped",
    summary="rank 1 on node-a (pid 4011) is stopped at all_sum #60",
    ranks=(IncidentRank(4000, 0, "stalled", "wait", "eval", 41.25, 0.987, 1, 120, 60,
                        "busy thread 4001 spins in SocketThread::worker -> recv"),
           IncidentRank(4011, 1, "stopped", "compute", None, None, 0.0, 1, 121, 60)),
    pids=(4000, 4011), seconds_without_progress=41.5, busiest_thread_cpu=0.987,
    flight_recorder_tail={"0": (FlightEntry(59, "all_sum", "float32", 4096),
                                FlightEntry(60, "all_sum", "bfloat16", 8192)),
                          "1": (FlightEntry(59, "all_sum", "float32", 4096),)},
    culprit=CULPRIT)
ENDED = dataclasses.replace(
    FOUND, signals=(SignalSent(4000, 0, "SIGSTOP", T0 + 10.5, "sent"),
                    SignalSent(4000, 0, "SIGTERM", T0 + 13.0, "sent"),
                    SignalSent(4011, 1, "SIGKILL", T0 + 18.0, "gone")),
    wired_before=3 << 30, wired_baseline=1 << 30, cluster=PEER_VIEW, action="ended",
    evidence=("/var/lib/mlx-watchdog/evidence/x/rank0-pid4000-python.txt",
              "/var/lib/mlx-watchdog/evidence/x/rank0-pid4000-native.txt"),
    evidence_error=None, ladder="begun", freeze="2 ranks frozen",
    outcome={"4000": "terminated", "4011": "killed"},
    native_hot=(NativeHot(0, 4000, threads=(HotThread(
        "Thread_7880", 240, (HotFrame("recv", "libsystem_kernel.dylib", 200),
                             HotFrame("poll", "libsystem_kernel.dylib", 40)),
        (PathFrame("thread_start", 240), PathFrame("SocketThread::worker", 238))),)),
                NativeHot(1, 4011, error="sample: no call graph")),
    wired_after=3 << 30, wired_check="leaked", reboot_required="wired memory leaked",
    closed_at=T0 + 20.0)
FENCED = Incident(
    id="20260101T000030-cccccc", time=T0 + 30.0, host="node-a", job="serve", attempt=None,
    uid=502, verdict="fenced", mode="enforce", kill_scope="job",
    reason="fenced by node-b: peer_dead", cause="peer_dead", summary=None,
    ranks=(IncidentRank(4021, 1, "blocked", "wait", "all_sum", 95.0, 0.0),), pids=(4021,),
    culprit=None, signals=(), wired_before=None, wired_baseline=None, cluster=None,
    action="observed", evidence=(), evidence_error="no evidence for a fence",
    completed_at_start=T0 + 31.0)
EVENTS = (
    LaunchEvent(event="launch", argv=("mlx.launch", "--hosts", "a,b", "train.py"), attempt=1,
                host="node-a", job="train", time=T0 + 1.0, uid=501),
    LaunchEvent(event="ended", attempt=1, ending="watchdog", exit_code=3, host="node-a",
                incident="20260101T000010-aaaaaa", job="train", launcher_code=-9,
                progressed=True, reason="the watchdog ended it", steps=12, time=T0 + 21.0,
                uid=501, waits=120),
    LaunchEvent(event="restart", attempt=2, backoff=5.0, job="train", restarts_left=1,
                time=T0 + 22.0, uid=501, reason="ended by the watchdog after progress"),
    LaunchEvent(event="refused", job="train", reason="node flagged for reboot",
                time=T0 + 27.0, uid=501),
    LaunchEvent(event="gave_up", job="train", reason="no restarts left", time=T0 + 40.0,
                uid=501, attempt=None),
)
FENCE = Fence(job="train", uid=501, origin="node-b:9753", reason="stalled: peer_stopped",
              culprit=CULPRIT, nonce="ab" * 16, time=T0 + 11.0, since=T0 + 10.0,
              term_in=2.5)


def _others() -> dict[str, object]:
    """Every other contract type's JSON, named."""
    return {
        "fence": FENCE.to_json(),
        "fence_older": dataclasses.replace(FENCE, term_in=None, since=None, culprit=None,
                                           origin=None).to_json(),
        "fence_answer": FenceAnswer(job="train", uid=501, ending=(4000, 4011)).to_json(),
        "fence_refused": FenceAnswer(error="bad signature").to_json(),
        "fence_sent": [str(FenceSent("node-b:9753", FenceAnswer(job="train", uid=501,
                                                                 ending=()))),
                       str(FenceSent("node-c:9753", error="timed out"))],
        "pointer": DaemonPointer(daemon_pid=999, state_dir="/var/lib/mlx-watchdog",
                                 listen="127.0.0.1:9753").to_json(),
        "wired_check": WiredCheck(wired_baseline=1 << 30, wired_after=None,
                                  wired_check="probe failed").to_json(),
        "wired_check_bare": WiredCheck(wired_check="no baseline").to_json(),
        "peers_not_asked": PeerView(error="no peers answered").to_json(),
        "peers": PEER_VIEW.to_json(),
        "reboot_unreadable": RebootFlag(reason="unreadable: bad JSON",
                                        path="/var/lib/mlx-watchdog/reboot-required").to_json(),
        "reboot_unwritten": RebootFlag(reason="a leak", unwritten=True).to_json(),
        "node_short": NodeStatus(host="node-a", version="9.9.9", started=T0).to_json(),
        "node_answer": NodeAnswer("node-c:9753", False, error="timed out").to_json(),
        "incident_found": FOUND.to_json(),
        "incident_absent_is_no_key": [k for k, v in vars(FOUND).items() if v is ABSENT],
    }


def _check(name: str, got: str) -> None:
    path = GOLDEN / name
    if WRITE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
    want = path.read_text(encoding="utf-8")
    assert got == want, f"{name}: the bytes changed (see this test's docstring)"


def _metrics(snap: NodeStatus) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    python = f'python="{platform.python_version()}"'
    assert python in text
    return text.replace(python, 'python="X.Y.Z"')


def _families(text: str) -> list[tuple[object, ...]]:
    return [(f.name, f.type, f.documentation, f.unit, [tuple(s) for s in f.samples])
            for f in text_string_to_metric_families(text)]


@pytest.mark.parametrize("name, snap", [("metrics.txt", NODE), ("metrics-peer.txt", PEER)])
def test_metrics_bytes_stay(name, snap):
    got = _metrics(snap)
    if WRITE:
        _check(name, got)
    # The text is prometheus_client's rendering of our families: byte for byte with the
    # version that wrote the golden file, family for family and sample for sample with any.
    assert _families(got) == _families((GOLDEN / name).read_text(encoding="utf-8"))
    if WRITE or version("prometheus-client") == PROMETHEUS_CLIENT:
        _check(name, got)


def test_status_bytes_stay(tmp_path):
    server = _Server(("127.0.0.1", 0), lambda: NODE, lambda: True, None)
    try:
        _check("status.json", server.rendered("status").decode() + "\n")
    finally:
        server.server_close()
    journal.write_json_atomic(str(tmp_path / "status.json"), NODE.to_json())
    _check("status-file.json", (tmp_path / "status.json").read_text(encoding="utf-8"))
    # Read back by another process, the bytes are the same.
    again = NodeStatus.from_json(json.loads((tmp_path / "status.json").read_text()))
    assert again == NODE


def test_other_contract_bytes_stay():
    _check("contract.json", json.dumps(_others(), indent=1, sort_keys=False) + "\n")


@pytest.fixture
def node_dirs(tmp_path, monkeypatch):
    """A record directory watched by a fresh daemon (this process) that published NODE,
    a journal of incidents and the launcher's events, local time in UTC."""
    record_dir, state_dir = tmp_path / "rec", tmp_path / "state"
    record_dir.mkdir()
    state_dir.mkdir()
    live = dataclasses.replace(NODE, daemon_pid=os.getpid(), dir=str(record_dir),
                               state_dir=str(state_dir), scan_monotonic=time.monotonic())
    journal.write_json_atomic(str(state_dir / journal.STATUS), live.to_json())
    for incident in (ENDED, FENCED):
        journal.append_incident(str(state_dir), incident.to_json())
    for event in EVENTS:
        launchlog.append(str(state_dir), event)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("NO_COLOR", "1")
    time.tzset()
    yield record_dir, state_dir
    monkeypatch.undo()
    time.tzset()


def _cli(args: list[str], state_dir: Path) -> str:
    done = CliRunner().invoke(cli, args)
    assert done.exit_code in (0, 1), (done.output, done.exception)
    return done.output.replace(str(state_dir), "<state-dir>")


def test_cli_bytes_stay(node_dirs):
    record_dir, state_dir = node_dirs
    where = ["--dir", str(record_dir), "--state-dir", str(state_dir)]
    _check("cli-status.json", _cli(["status", "--json", *where], state_dir))
    _check("cli-status.txt", _cli(["status", *where], state_dir))
    _check("cli-incidents.json",
           _cli(["incidents", "--json", "--state-dir", str(state_dir)], state_dir))
    _check("cli-incidents.txt", _cli(["incidents", "--state-dir", str(state_dir)], state_dir))


def test_cluster_view_bytes_stay():
    view = judge.analyze([NodeAnswer("node-a:9753", True, NODE),
                          NodeAnswer("node-b:9753", True, PEER),
                          NodeAnswer("node-c:9753", False, error="timed out")])
    _check("cluster.json", json.dumps(view.to_json(), indent=1) + "\n")
    _check("cluster.txt", render_text(view) + "\n")
    (train,) = [job for job in view.jobs if job.job == "train"]
    _check("peer-view.json",
           json.dumps(judge.peer_view(train, ["node-c:9753"]).to_json(), indent=1) + "\n")
