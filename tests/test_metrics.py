"""The Prometheus metrics: the collector on hand-built snapshots, then the real
daemon's /metrics against real MLX ring ranks (healthy, frozen, killed, expired).

Scrapes are parsed with `prometheus_client.parser`, as Prometheus would read
them. The unit half builds snapshots by hand (the dict `Daemon.publish`
writes); the real half runs `python -m watchdog.cli run` and a ring job.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from ranks import DaemonProc, RingJob, samples, scrape, value, wait_for

from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.daemon.publish import SCAN_BUCKETS
from watchdog.net.metrics import SnapshotCollector, render
from watchdog.states import State
from watchdog.status import NodeStatus

P = "mlx_watchdog_"

# Family name (as the parser names it: counters without `_total`) -> type.
# Design section 6, plus issue 4 item 1 (probe errors, last scan time).
FAMILIES = {
    P + "rank_state": "gauge",
    P + "rank_progress": "counter",
    P + "rank_collectives": "counter",
    P + "rank_steps": "counter",
    P + "rank_seconds_since_progress": "gauge",
    P + "rank_deadline_seconds": "gauge",
    P + "rank_busiest_thread_cpu_ratio": "gauge",
    P + "rank_attempt": "gauge",
    P + "stalls": "counter",
    P + "kills": "counter",
    P + "job_kills": "counter",
    P + "launch_events": "counter",
    P + "node_reboot_required": "gauge",
    P + "wired_memory_bytes": "gauge",
    P + "invalid_records": "counter",
    P + "probe_errors": "counter",
    P + "loop_errors": "counter",
    P + "unwritten_records": "gauge",
    P + "state_write_failures": "counter",
    P + "scan_duration_seconds": "histogram",
    P + "last_scan_timestamp_seconds": "gauge",
    P + "build_info": "gauge",
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
}
RANK_FAMILIES = {name for name in FAMILIES if name.startswith(P + "rank_")}
# Labels a series may carry; pid and thread ids never (unbounded cardinality).
ALLOWED_LABELS = {"job", "rank", "state", "verdict", "signal", "le", "version", "event"}


def rank(job: str, n: int, state: str, **values: object) -> dict:
    """One rank as `status --json` / the daemon snapshot shows it."""
    base = {"pid": 4000 + n, "host": "mac-01", "job": job, "rank": n, "world_size": 4,
            "backend": "ring", "state": state, "phase": "wait", "progress": 100 + n,
            "collectives": 50 + n, "steps": 10 + n, "seconds_since_progress": 0.5 + n,
            "seconds_in_wait": 0.5 + n, "deadline_seconds": 30.0,
            "busiest_thread_cpu": 0.25 * n, "attempt": 1 + n, "current_op": "eval (all_sum #50)",
            "reason": "", "source": "daemon"}
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
        "counters": {"stalls": {"stalled": 2, "blocked": 1}, "kills": {"SIGTERM": 3,
                                                                       "SIGKILL": 1},
                     "job_kills": {"train": 3, "serve": 0}, "invalid_records": 7,
                     "probe_errors": 4, "loop_errors": 0, "scan_buckets": buckets,
                     "scan_sum": 42.5, "scan_count": sum(buckets)},
        "scan_bucket_bounds": list(SCAN_BUCKETS),
        "launches": {"restart": 2, "refused": 1, "gave_up": 0},
    }
    snap.update(over)
    return snap


def node(snap: dict | NodeStatus) -> NodeStatus:
    """A hand-built snapshot read through the contract, as a peer's /status is."""
    return snap if isinstance(snap, NodeStatus) else NodeStatus.from_json(snap)


def parse(snap: dict | NodeStatus) -> dict:
    text = render(lambda: node(snap)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


# -- the collector, unit-tested ---------------------------------------------------------


def test_every_family_is_exported_with_its_type():
    families = parse(snapshot())
    assert {name: f.type for name, f in families.items()} == FAMILIES
    text = render(lambda: node(snapshot())).decode()
    for name, kind in FAMILIES.items():
        exposed = name + "_total" if kind == "counter" else name
        assert f"# TYPE {exposed} {kind}" in text, exposed
        assert f"# HELP {exposed} " in text, exposed


def test_rank_series_carry_job_and_rank_only():
    families = parse(snapshot())
    for family in families.values():
        for s in family.samples:
            assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
            assert not {"pid", "tid", "thread", "thread_id", "host"} & set(s.labels)
    for name in RANK_FAMILIES:
        for s in families[name].samples:
            want = {"job", "rank", "state"} if name == P + "rank_state" else {"job", "rank"}
            assert set(s.labels) == want, (s.name, s.labels)


def test_rank_values_come_from_the_snapshot():
    snap = snapshot()
    families = parse(snap)
    for r in snap["ranks"]:
        labels = {"job": r["job"], "rank": str(r["rank"])}
        for sample_name, key in RANK_VALUES.items():
            assert value(families, sample_name, **labels) == pytest.approx(r[key]), sample_name
        states = samples(families, P + "rank_state", **labels)
        # One series per state, exactly one of them 1: the rank's current state.
        assert {dict(k)["state"] for k in states} == {s.value for s in State}
        assert [dict(k)["state"] for k, v in states.items() if v == 1] == [r["state"]]
        assert sum(states.values()) == 1


def test_node_and_daemon_families():
    families = parse(snapshot())
    assert value(families, P + "stalls_total", verdict="stalled") == 2
    assert value(families, P + "stalls_total", verdict="blocked") == 1
    assert value(families, P + "kills_total", signal="SIGTERM") == 3
    assert value(families, P + "kills_total", signal="SIGKILL") == 1
    assert value(families, P + "job_kills_total", job="train") == 3
    assert value(families, P + "job_kills_total", job="serve") == 0
    assert value(families, P + "node_reboot_required") == 0
    assert value(families, P + "wired_memory_bytes") == 123 << 20
    assert value(families, P + "invalid_records_total") == 7
    assert value(families, P + "probe_errors_total") == 4
    assert value(families, P + "last_scan_timestamp_seconds") == 1_700_000_123.5
    assert value(families, P + "build_info", version="9.9.9") == 1
    flagged = parse(snapshot(reboot_required=True, reboot={"reason": "leak"}))
    assert value(flagged, P + "node_reboot_required") == 1


def test_a_rank_absent_from_the_snapshot_has_no_series():
    snap = snapshot()
    snap["ranks"] = [r for r in snap["ranks"] if not (r["job"] == "train" and r["rank"] == 1)]
    families = parse(snap)
    for name in RANK_FAMILIES:
        for s in families[name].samples:
            assert (s.labels["job"], s.labels["rank"]) != ("train", "1"), s
    assert value(families, P + "rank_progress_total", job="train", rank="0") == 100


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
    assert value(families, P + "rank_progress_total", job="train", rank="0") == 100
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


@pytest.mark.parametrize("job", ['a"b', "back\\slash", "new\nline", "ünï", "{x=\"y\"}"])
def test_label_values_from_records_are_escaped(job):
    # The job name comes from the ranks' environment: any text must round-trip.
    families = parse(snapshot(ranks=[rank(job, 0, "running")], counters={
        **snapshot()["counters"], "job_kills": {job: 2}}))
    assert value(families, P + "rank_progress_total", job=job, rank="0") == 100
    assert value(families, P + "job_kills_total", job=job) == 2


# -- the real daemon against real ranks ----------------------------------------------


def rank_states(families: dict, job: str) -> dict[str, str]:
    """rank -> the state whose series is 1, for one job."""
    return {dict(k)["rank"]: dict(k)["state"]
            for k, v in samples(families, P + "rank_state", job=job).items() if v == 1}


def rank_series(families: dict, job: str) -> list:
    return [s for name in RANK_FAMILIES for s in families[name].samples
            if s.labels.get("job") == job]


def compress(history: list[str]) -> list[str]:
    out: list[str] = []
    for state in history:
        if not out or out[-1] != state:
            out.append(state)
    return out


@pytest.mark.ranks
def test_real_job_healthy_frozen_killed_then_expired(tmp_path, record_dir, state_dir):
    size = 2
    with DaemonProc(record_dir, state_dir, deadline=2, retention=2) as daemon, \
            RingJob(tmp_path, record_dir, size, "loop") as job:
        url = daemon.url()
        recs = job.wait_running()
        name = recs[0].job
        ranks = [str(r) for r in range(size)]

        # Healthy: every rank running, progress and collectives growing.
        def healthy(f: dict) -> bool:  # running, and past init (whose deadline is 600 s)
            return rank_states(f, name) == dict.fromkeys(ranks, "running") and all(
                value(f, P + "rank_deadline_seconds", job=name, rank=r) == 2 for r in ranks)

        first = wait_for(lambda: (f := scrape(url)) and healthy(f) and f, 15,
                         what="every rank running in /metrics")
        assert value(first, P + "kills_total", signal="SIGTERM") == 0
        assert value(first, P + "stalls_total", verdict="stalled") == 0
        assert value(first, P + "job_kills_total", job=name) == 0
        time.sleep(0.6)  # a couple of scans
        second = scrape(url)
        for r in ranks:
            for counter in (P + "rank_progress_total", P + "rank_collectives_total"):
                before = value(first, counter, job=name, rank=r)
                after = value(second, counter, job=name, rank=r)
                assert after > before > 0, (counter, r, before, after)

        # The reboot gauge follows the flag file on the next scan.
        flag = state_dir / "reboot-required"
        flag.write_text(json.dumps({"reason": "test flag"}))
        wait_for(lambda: value(scrape(url), P + "node_reboot_required") == 1, 5,
                 what="reboot gauge 1 after the flag appeared")
        flag.unlink()
        wait_for(lambda: value(scrape(url), P + "node_reboot_required") == 0, 5,
                 what="reboot gauge 0 after the flag went")

        # Freeze rank 1: it reads `stopped`; the survivor goes suspect, then stalled.
        job.signal(1, signal.SIGSTOP)
        history: dict[str, list[str]] = {r: [] for r in ranks}
        cpu_when_stalled: list[float] = []
        last: dict = {}
        end = time.monotonic() + 40
        while time.monotonic() < end:
            last = scrape(url)
            for r, state in rank_states(last, name).items():
                history[r].append(state)
                if state == "stalled":
                    cpu_when_stalled.append(value(
                        last, P + "rank_busiest_thread_cpu_ratio", job=name, rank=r))
            if (all(p.poll() is not None for p in job.procs)
                    and value(last, P + "kills_total", signal="SIGTERM")
                    and set(rank_states(last, name).values()) == {"killed"}):
                break
            time.sleep(0.1)
        seen = {r: compress(h) for r, h in history.items()}
        assert all(p.poll() is not None for p in job.procs), seen
        assert "stopped" in seen["1"] and not {"suspect", "stalled"} & set(seen["1"]), seen
        survivor = seen["0"]
        assert "suspect" in survivor and "stalled" in survivor, seen
        assert survivor.index("suspect") < survivor.index("stalled"), seen
        # A spinning thread is what "stalled" means (a loaded machine gives it less
        # than a core; the detector scales its threshold by the load).
        assert max(cpu_when_stalled) >= 0.1
        assert {h[-1] for h in seen.values()} == {"killed"}, seen

        # The kill moved the counters: one stall acted on, every rank ended by SIGTERM.
        ended = sum(p.returncode == -signal.SIGTERM for p in job.procs)
        assert ended == size
        assert value(last, P + "kills_total", signal="SIGTERM") == size
        assert value(last, P + "kills_total", signal="SIGKILL") == 0
        assert value(last, P + "stalls_total", verdict="stalled") == 1
        assert value(last, P + "stalls_total", verdict="blocked") == 0
        assert value(last, P + "job_kills_total", job=name) == ended

        # After `retention` (2 s) the killed ranks' series are gone; the counters stay.
        gone = wait_for(lambda: (f := scrape(url)) and not rank_series(f, name) and f, 10,
                        what="the killed ranks' series to disappear")
        assert value(gone, P + "job_kills_total", job=name) == ended
        assert value(gone, P + "kills_total", signal="SIGTERM") == size
        assert daemon.alive()


@pytest.mark.ranks
def test_observe_mode_counts_one_hang_once(tmp_path, record_dir, state_dir):
    """In observe mode a hang that lasts is one stall and one incident, not one
    per scan: the stalls counter counts hangs, and the journal must not grow
    by a line every interval for as long as the hang lasts."""
    with DaemonProc(record_dir, state_dir, "--mode", "observe", deadline=1.5) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        url = daemon.url()
        name = job.wait_running()[0].job
        job.signal(1, signal.SIGSTOP)
        wait_for(lambda: value(scrape(url), P + "stalls_total", verdict="stalled"), 30,
                 what="the hang to be observed")
        time.sleep(2.5)  # ten more scans of the same hang
        families = scrape(url)
        assert rank_states(families, name) == {"0": "stalled", "1": "stopped"}
        assert all(p.poll() is None for p in job.procs), "observe mode ended a rank"
        assert value(families, P + "kills_total", signal="SIGTERM") == 0
        assert value(families, P + "stalls_total", verdict="stalled") == 1
        assert len(daemon.incidents()) == 1


def test_a_relaunch_within_retention_gives_one_series_per_rank():
    # Same hostfile, same job id: the ended rank and its successor share labels.
    families = parse(snapshot(ranks=[rank("train", 0, "killed", pid=1),
                                     rank("train", 0, "running", pid=2)]))
    states = [s for s in families[P + "rank_state"].samples if s.value == 1]
    assert [(s.labels["rank"], s.labels["state"]) for s in states] == [("0", "running")]
