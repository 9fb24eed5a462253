"""The Prometheus metrics: the collector on hand-built snapshots (the dict
`Daemon.publish` writes), parsed with `prometheus_client.parser`, as Prometheus would
read them. tests/ranks/net/test_metrics.py scrapes the real daemon.
"""

from __future__ import annotations

import platform
import sys

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ranks import samples, value
from watchdog.cause import CAUSES
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.daemon.publish import SCAN_BUCKETS
from watchdog.net.metrics import (
    COUNTER,
    GAUGE,
    JOB,
    RANK,
    Family,
    SnapshotCollector,
    counts,
    exposition,
    per_rank,
    scalar,
)
from watchdog.net.metrics import FAMILIES as TABLE
from watchdog.states import State
from watchdog.status import NodeStatus
from watchdog.text import printable

P = "mlx_watchdog_"

# Family name (as the parser names it: counters without `_total`) -> type.
# Design section 6, plus the daemon's own health (probe errors, last scan time).
FAMILIES = {
    P + "rank_state": "gauge",
    P + "rank_progress": "counter",
    P + "rank_collectives": "counter",
    P + "rank_steps": "counter",
    P + "rank_seconds_since_progress": "gauge",
    P + "rank_deadline_seconds": "gauge",
    P + "rank_busiest_thread_cpu_ratio": "gauge",
    P + "rank_wait_share": "gauge",
    P + "rank_pace_score": "gauge",
    P + "rank_pace_collectives_per_second": "gauge",
    P + "rank_pace_unjudged": "gauge",
    P + "job_slowdown_ratio": "gauge",
    P + "rank_traced": "gauge",
    P + "rank_attempt": "gauge",
    P + "stalls": "counter",
    P + "kills": "counter",
    P + "job_kills": "counter",
    P + "launch_events": "counter",
    P + "node_reboot_required": "gauge",
    P + "wired_memory_bytes": "gauge",
    P + "record_dir_full": "gauge",
    P + "invalid_records": "counter",
    P + "probe_errors": "counter",
    P + "loop_errors": "counter",
    P + "unwritten_records": "gauge",
    P + "state_write_failures": "counter",
    P + "scan_duration_seconds": "histogram",
    P + "last_scan_timestamp_seconds": "gauge",
    P + "build_info": "gauge",
    P + "mode": "gauge",
}
# Per-rank sample name -> the snapshot key it reports.
RANK_VALUES = {
    P + "rank_progress_total": "progress",
    P + "rank_collectives_total": "collectives",
    P + "rank_steps_total": "steps",
    P + "rank_seconds_since_progress": "seconds_since_progress",
    P + "rank_deadline_seconds": "deadline_seconds",
    P + "rank_busiest_thread_cpu_ratio": "busiest_thread_cpu",
    P + "rank_attempt": "attempt",
    P + "rank_wait_share": "wait_share",
    P + "rank_pace_score": "pace_score",
    P + "rank_pace_collectives_per_second": "pace",
}
RANK_FAMILIES = {name for name in FAMILIES if name.startswith(P + "rank_")}
# Labels a series may carry; pid and thread ids never (unbounded cardinality), but a
# traced rank's tracer (one series per rank a person traces, only while traced).
ALLOWED_LABELS = {"mlx_job", "uid", "rank", "state", "verdict", "cause", "signal", "le", "version",
                  "python", "event", "mode", "reason", "tracer_pid", "tracer"}


UID = 501  # the ranks' owner: in every rank series and per-job count


def rank(job: str, n: int, state: str, **values: object) -> dict:
    """One rank as `status --json` / the daemon snapshot shows it."""
    base = {"pid": 4000 + n, "host": "mac-01", "job": job, "uid": UID, "rank": n, "world_size": 4,
            "backend": "ring", "state": state, "phase": "wait", "progress": 100 + n,
            "collectives": 50 + n, "steps": 10 + n, "seconds_since_progress": 0.5 + n,
            "seconds_in_wait": 0.5 + n, "deadline_seconds": 30.0,
            "busiest_thread_cpu": 0.25 * n, "attempt": 1 + n, "current_op": "eval (all_sum #50)",
            "reason": "", "source": "daemon", "wait_share": 0.1 * n,
            "pace_score": 1.0 - 0.1 * n, "pace": 4.0,
            "pace_unjudged": "too_few_seconds" if n else None}
    base.update(values)
    return base


def snapshot(**over: object) -> dict:
    buckets = [0] * (len(SCAN_BUCKETS) + 1)
    buckets[0], buckets[3], buckets[-1] = 5, 2, 1  # one scan slower than the last bound
    snap = {
        "host": "mac-01", "daemon_pid": 99, "version": "9.9.9", "mode": "enforce",
        "interval": 1.0, "time": 1_700_000_123.5, "started": 1_700_000_000.0,
        "wired_bytes": 123 << 20, "wired_baseline_bytes": 100 << 20,
        "reboot_required": False, "reboot": None,
        "ranks": [rank("train", 0, "running"), rank("train", 1, "stalled"),
                  rank("train", 2, "stopped"), rank("serve", 0, "idle")],
        "invalid_records": {},
        "counters": {"stalls": {"stalled": 2, "blocked": 1},
                     "stall_causes": {"stalled:peer_stopped": 1}, "kills": {"SIGTERM": 3,
                                                                       "SIGKILL": 1},
                     "job_kills": {"501:train": 3, "501:serve": 0}, "invalid_records": 7,
                     "probe_errors": 4, "loop_errors": 0, "scan_buckets": buckets,
                     "scan_sum": 42.5, "scan_count": sum(buckets)},
        "scan_bucket_bounds": list(SCAN_BUCKETS),
        "launches": {"restart": 2, "refused": 1, "gave_up": 0},
        "stragglers": [{"job": "train", "uid": 501, "rank": 0, "host": "mac-01", "pid": 4000,
                        "score": 0.5, "slowdown": 1.9, "others_wait": 0.47, "why": "",
                        "summary": "rank 0 on mac-01 is the straggler: ..."}],
    }
    snap.update(over)
    return snap


def node(snap: dict | NodeStatus) -> NodeStatus:
    """A hand-built snapshot read through the contract, as a peer's /status is."""
    return snap if isinstance(snap, NodeStatus) else NodeStatus.from_json(snap)


def parse(snap: dict | NodeStatus) -> dict:
    text = exposition(lambda: node(snap)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


# -- the collector, unit-tested ---------------------------------------------------------


def test_every_family_is_exported_with_its_type():
    families = parse(snapshot())
    assert {name: f.type for name, f in families.items()
            if not name.startswith("process_")} == FAMILIES
    text = exposition(lambda: node(snapshot())).decode()
    for name, kind in FAMILIES.items():
        exposed = name + "_total" if kind == "counter" else name
        assert f"# TYPE {exposed} {kind}" in text, exposed
        assert f"# HELP {exposed} " in text, exposed


def test_rank_series_carry_job_owner_and_rank_only():
    families = parse(snapshot())
    for family in families.values():
        for s in family.samples:
            assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
            assert not {"pid", "tid", "thread", "thread_id", "host"} & set(s.labels)
    for name in RANK_FAMILIES:
        for s in families[name].samples:
            want = ({"mlx_job", "uid", "rank", "state"} if name == P + "rank_state"
                    else {"mlx_job", "uid", "rank", "reason"} if name == P + "rank_pace_unjudged"
                    else {"mlx_job", "uid", "rank", "tracer_pid", "tracer"}
                    if name == P + "rank_traced"
                    else {"mlx_job", "uid", "rank"})
            assert set(s.labels) == want, (s.name, s.labels)


def test_a_traced_rank_is_exported_with_its_tracer_and_no_other_is():
    """Issue 55: a rank a person's debugger holds shows state `traced` and its tracer."""
    snap = snapshot(ranks=[rank("train", 0, "running"),
                           rank("train", 1, "traced", tracer_pid=777, tracer="gdb")])
    families = parse(snap)
    traced = samples(families, P + "rank_traced")
    assert traced == {(("mlx_job", "train"), ("rank", "1"), ("tracer", "gdb"),
                       ("tracer_pid", "777"), ("uid", str(UID))): 1.0}
    assert value(families, P + "rank_state", mlx_job="train", uid=str(UID), rank="1",
                 state="traced") == 1


def test_rank_values_come_from_the_snapshot():
    snap = snapshot()
    families = parse(snap)
    for r in snap["ranks"]:
        labels = {"mlx_job": r["job"], "uid": str(UID), "rank": str(r["rank"])}
        for sample_name, key in RANK_VALUES.items():
            assert value(families, sample_name, **labels) == pytest.approx(r[key]), sample_name
        states = samples(families, P + "rank_state", **labels)
        # One series per state, exactly one of them 1: the rank's current state.
        assert {dict(k)["state"] for k in states} == {s.value for s in State}
        assert [dict(k)["state"] for k, v in states.items() if v == 1] == [r["state"]]
        assert sum(states.values()) == 1


def test_a_named_straggler_is_its_jobs_slowdown_labelled_with_its_rank():
    families = parse(snapshot())
    assert samples(families, P + "job_slowdown_ratio") == {
        (("mlx_job", "train"), ("rank", "0"), ("uid", "501")): 1.9}
    assert samples(parse(snapshot(stragglers=[])), P + "job_slowdown_ratio") == {}


def test_node_and_daemon_families():
    families = parse(snapshot())
    # By verdict and cause, every pair from 0; a hang counted without a cause (a
    # daemon before causes) is `unknown`.
    assert sum(samples(families, P + "stalls_total", verdict="stalled").values()) == 2
    assert value(families, P + "stalls_total", verdict="stalled", cause="peer_stopped") == 1
    assert value(families, P + "stalls_total", verdict="stalled", cause="unknown") == 1
    assert value(families, P + "stalls_total", verdict="blocked", cause="unknown") == 1
    assert value(families, P + "stalls_total", verdict="blocked", cause="mismatch") == 0
    assert {dict(k)["cause"] for k in samples(families, P + "stalls_total")} == set(CAUSES)
    assert value(families, P + "kills_total", signal="SIGTERM") == 3
    assert value(families, P + "kills_total", signal="SIGKILL") == 1
    assert value(families, P + "job_kills_total", mlx_job="train", uid="501") == 3
    assert value(families, P + "job_kills_total", mlx_job="serve", uid="501") == 0
    assert value(families, P + "node_reboot_required") == 0
    assert value(families, P + "wired_memory_bytes") == 123 << 20
    assert value(families, P + "invalid_records_total") == 7
    assert value(families, P + "probe_errors_total") == 4
    assert value(families, P + "last_scan_timestamp_seconds") == 1_700_000_123.5
    assert value(families, P + "build_info", version="9.9.9",
                 python=platform.python_version()) == 1
    flagged = parse(snapshot(reboot_required=True, reboot={"reason": "leak"}))
    assert value(flagged, P + "node_reboot_required") == 1


def test_a_rank_absent_from_the_snapshot_has_no_series():
    snap = snapshot()
    snap["ranks"] = [r for r in snap["ranks"] if not (r["job"] == "train" and r["rank"] == 1)]
    families = parse(snap)
    for name in RANK_FAMILIES:
        for s in families[name].samples:
            assert (s.labels["mlx_job"], s.labels["rank"]) != ("train", "1"), s
    assert value(families, P + "rank_progress_total", mlx_job="train", uid="501", rank="0") == 100


def test_series_follow_each_scrape_nothing_is_cached_or_registered_globally():
    snaps = [snapshot(), snapshot(ranks=[])]
    collector = SnapshotCollector(lambda: node(snaps[0]))
    assert any(m.samples for m in collector.collect() if m.name == P + "rank_state")
    snaps.pop(0)  # the daemon published a new snapshot: the ranks are gone
    assert all(not m.samples for m in collector.collect() if m.name.startswith(P + "rank_"))
    # Importing the module registered nothing in the default registry.
    assert b"mlx_watchdog" not in generate_latest(REGISTRY)


def test_a_value_the_snapshot_lacks_is_left_out_not_zeroed():
    # A sampled rank with no verdict yet: no deadline or CPU to report.
    snap = snapshot(ranks=[rank("train", 0, "running", seconds_since_progress=None,
                                deadline_seconds=None, busiest_thread_cpu=None)],
                    wired_bytes=None)
    families = parse(snap)
    for name in (P + "rank_seconds_since_progress", P + "rank_deadline_seconds",
                 P + "rank_busiest_thread_cpu_ratio"):
        assert families[name].samples == [], name
    assert value(families, P + "rank_progress_total", mlx_job="train", uid="501", rank="0") == 100
    assert P + "wired_memory_bytes" not in families


def test_scan_histogram_is_cumulative_and_inf_equals_count():
    snap = snapshot()
    families = parse(snap)
    buckets = [(s.labels["le"], s.value) for s in families[P + "scan_duration_seconds"].samples
               if s.name.endswith("_bucket")]
    bounds = [float(le) for le, _ in buckets]
    assert bounds == [*SCAN_BUCKETS, float("inf")]
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "buckets must be cumulative"
    raw = snap["counters"]["scan_buckets"]
    assert counts == [sum(raw[: i + 1]) for i in range(len(raw))]
    count = value(families, P + "scan_duration_seconds_count")
    assert counts[-1] == count == snap["counters"]["scan_count"]
    assert value(families, P + "scan_duration_seconds_sum") == 42.5


def test_empty_snapshot_before_the_first_scan_still_renders():
    families = parse({})
    assert all(not families[name].samples for name in RANK_FAMILIES)
    assert value(families, P + "node_reboot_required") == 0
    # Until the first scan, the start time stands for the last scan, so a
    # daemon that never completes one still ages into MLXWatchdogNotScanning.
    families = parse({"started": 1_700_000_000.0})
    assert value(families, P + "last_scan_timestamp_seconds") == 1_700_000_000.0


def test_a_daemon_that_has_not_scanned_yet_exports_its_start_time(tmp_path):
    """The real Daemon object, never scanned: /metrics must still carry
    last_scan_timestamp_seconds (= its start), or a daemon stuck in its first
    scan never trips the "not scanning" alert (the series is simply absent)."""
    daemon = Daemon(Settings(dir=str(tmp_path / "rec"), state_dir=str(tmp_path / "state")))
    try:
        families = parse(daemon.snapshot)
        assert value(families, P + "last_scan_timestamp_seconds") == pytest.approx(
            daemon.started), "no last_scan_timestamp before the first scan"
    finally:
        daemon.executor.shutdown(wait=False)


@pytest.mark.parametrize("job", ['a"b', "back\\slash", "new\nline", "ünï", "{x=\"y\"}",
                                 "rev\u202eersed\u200b"])
def test_label_values_from_records_are_escaped(job):
    # The job name comes from the ranks' environment: any text reads back as `status`
    # shows it (printable: control and format characters escaped, issue 48 defect 7).
    families = parse(snapshot(ranks=[rank(job, 0, "running")], counters={
        **snapshot()["counters"], "job_kills": {f"501:{job}": 2}}))
    shown = printable(job)
    assert shown.isprintable()
    assert value(families, P + "rank_progress_total", mlx_job=shown, uid="501", rank="0") == 100
    assert value(families, P + "job_kills_total", mlx_job=shown, uid="501") == 2


def test_a_relaunch_within_retention_gives_one_series_per_rank():
    # Same hostfile, same job id: the ended rank and its successor share labels.
    families = parse(snapshot(ranks=[rank("train", 0, "killed", pid=1),
                                     rank("train", 0, "running", pid=2)]))
    states = [s for s in families[P + "rank_state"].samples if s.value == 1]
    assert [(s.labels["rank"], s.labels["state"]) for s in states] == [("0", "running")]


# -- issue 28: Prometheus conventions ---------------------------------------------------


def test_the_mode_is_a_metric_one_series_per_mode():
    for mode, other in (("enforce", "observe"), ("observe", "enforce")):
        families = parse(snapshot(mode=mode))
        assert value(families, P + "mode", mode=mode) == 1
        assert value(families, P + "mode", mode=other) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process_* reads /proc")
def test_the_standard_process_metrics_are_exported():
    families = parse(snapshot())
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
                 "process_max_fds", "process_start_time_seconds"):
        assert name in families and families[name].samples, name
    assert families["process_open_fds"].samples[0].value > 0


def test_the_old_job_label_is_kept_one_release_behind_a_setting():
    text = exposition(lambda: node(snapshot()), job_label="job").decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert value(families, P + "rank_progress_total", job="train", uid="501", rank="0") == 100
    assert value(families, P + "job_kills_total", job="train", uid="501") == 3
    assert "mlx_job=" not in text
    # The default, and what a scrape config needs no honor_labels for: no `job` label.
    assert 'job="' not in exposition(lambda: node(snapshot())).decode().replace('mlx_job="', "")


# -- issue 31: the table of families --------------------------------------------------------


def test_a_new_metric_is_one_row_of_the_table():
    """The collector exports what `FAMILIES` lists, in its order; a row added (here a
    per-rank field, a count and a scalar) is exported with no other edit."""
    rows = (Family("rank_world_size", "Ranks in the job", GAUGE, RANK, per_rank("world_size")),
            Family("kills_by_job", "Kills, by job", COUNTER, (JOB,),
                   counts(lambda snap: snap.counters.job_kills)),
            Family("ranks_watched", "Ranks watched", GAUGE, (),
                   scalar(lambda snap: float(len(snap.ranks)))))
    collector = SnapshotCollector(lambda: node(snapshot()), families=(*TABLE, *rows))
    names = [m.name for m in collector.collect()]
    assert names[:-3] == [m.name for m in SnapshotCollector(lambda: node(snapshot())).collect()]
    assert names[-3:] == [P + "rank_world_size", P + "kills_by_job", P + "ranks_watched"]
    families = {m.name: m for m in collector.collect()}
    assert {tuple(s.labels.items()): s.value for s in families[P + "rank_world_size"].samples
            } == {(("mlx_job", r["job"]), ("uid", str(UID)), ("rank", str(r["rank"]))): 4.0
                  for r in snapshot()["ranks"]}
    assert {s.labels["mlx_job"]: s.value for s in families[P + "kills_by_job"].samples} == {
        "501:train": 3, "501:serve": 0}
    assert [s.value for s in families[P + "ranks_watched"].samples] == [4.0]


# -- issue 37: another user's rank never stands for the owner's -------------------------


def test_another_users_rank_naming_the_job_never_replaces_the_owners_series():
    """Job ids are world-readable and MLX_WATCHDOG_JOB/ATTEMPT anyone's to set: an
    attacker's running rank 0 of "train" at attempt 9 beside the victim's hung rank 0
    at attempt 1. Both are shown, each under its owner; the victim's stays blocked
    (MLXRankHung fires on it), and the kills are counted per owner."""
    snap = snapshot(ranks=[rank("train", 0, "blocked", attempt=1),
                           rank("train", 0, "running", attempt=9, uid=65534, pid=1)],
                    counters={**snapshot()["counters"],
                              "job_kills": {"501:train": 0, "65534:train": 4}})
    families = parse(snap)
    victim = {"mlx_job": "train", "uid": "501", "rank": "0"}
    other = {"mlx_job": "train", "uid": "65534", "rank": "0"}
    assert value(families, P + "rank_state", **victim, state="blocked") == 1
    assert value(families, P + "rank_state", **other, state="running") == 1
    assert value(families, P + "rank_attempt", **victim) == 1
    assert value(families, P + "job_kills_total", mlx_job="train", uid="501") == 0
    assert value(families, P + "job_kills_total", mlx_job="train", uid="65534") == 4
