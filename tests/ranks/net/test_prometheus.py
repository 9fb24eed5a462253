"""A real Prometheus server scraping the real daemon through an injected hang.

Debian's `prometheus` package provides /usr/bin/prometheus; CI installs it
(`.ci/run`), so a missing binary is a failure, not a skip. The server runs on
127.0.0.1 with a free port and a temporary TSDB, scrapes the daemon every
second as the documented scrape job (`mlx-watchdog`, no `honor_labels`),
and loads docs/alerts.yml. A rank of a real ring job is frozen; through
Prometheus's HTTP API the test checks that the stall and the kill arrived.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.ranks import DaemonProc, RingJob, free_ports, wait_for

ROOT = REPO
RULES = ROOT / "docs" / "alerts.yml"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

pytestmark = pytest.mark.ranks


def api(base: str, path: str, **params: str) -> dict:
    url = f"{base}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as resp:
        answer = json.load(resp)
    assert answer["status"] == "success", answer
    return answer["data"]


def query(base: str, expr: str) -> list[dict]:
    """An instant query: [{"metric": {...}, "value": [t, "v"]}, ...]."""
    return api(base, "query", query=expr)["result"]


def ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/-/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def write_config(path: Path, target: str) -> None:
    # JSON is YAML: no YAML library needed to write it.
    path.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                   "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": "mlx-watchdog",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [target]}],
        }],
    }, indent=1))


def test_prometheus_sees_the_stall_and_the_kill(tmp_path, record_dir, state_dir):
    assert os.access(PROMETHEUS, os.X_OK), (
        f"{PROMETHEUS} missing: install Debian's prometheus package (.ci/run does)")
    began = time.monotonic()
    # confirm=8 keeps the survivors `stalled` for 8 scans (2 s) before the ladder
    # starts, so a 1 s scrape cannot miss the state.
    with DaemonProc(record_dir, state_dir, deadline=2, confirm=8) as daemon:
        target = urllib.parse.urlsplit(daemon.url()).netloc
        config = tmp_path / "prometheus.yml"
        write_config(config, target)
        port = free_ports(1)[0]
        base = f"http://127.0.0.1:{port}"
        log_path = tmp_path / "prometheus.log"
        with open(log_path, "wb") as log:
            prom = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}",
                 "--storage.tsdb.retention.time=1h", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)

        def prom_log() -> str:
            return log_path.read_text(errors="replace")[-3000:]

        try:
            def up() -> bool:
                if prom.poll() is not None:
                    raise AssertionError(f"prometheus exited:\n{prom_log()}")
                return ready(base)

            wait_for(up, 20, interval=0.2, what="prometheus to be ready")
            # The scrape job works, with the scrape job's name on `up`.
            wait_for(lambda: [r for r in query(base, 'up{job="mlx-watchdog"} == 1')], 15,
                     what="prometheus to scrape the daemon")
            # docs/alerts.yml loaded, every rule healthy (evaluated without error).
            groups = wait_for(lambda: (g := api(base, "rules")["groups"]) and all(
                r.get("health") == "ok" for grp in g for r in grp["rules"]) and g, 15,
                what="the alert rules to be evaluated")
            names = {r["name"] for grp in groups for r in grp["rules"]}
            assert {"MLXRankHung", "MLXNodeRebootRequired", "MLXWatchdogDown",
                    "MLXJobRepeatedKills"} <= names, names

            with RingJob(tmp_path, record_dir, 2, "loop") as job:
                name = job.wait_running()[0].job
                job.signal(1, signal.SIGSTOP)
                wait_for(lambda: all(p.poll() is not None for p in job.procs), 30,
                         what="the hung job to be ended")
                assert [p.returncode for p in job.procs] == [-signal.SIGTERM] * 2

            # The stall arrived: rank 0 (the survivor) was stalled, rank 1 stopped,
            # under the MLX job's own name (`mlx_job`), the scrape job's `job` untouched,
            # and the daemon as instance.
            stalled = wait_for(lambda: query(
                base, f'max_over_time(mlx_watchdog_rank_state{{state="stalled",mlx_job="{name}"}}'
                '[5m]) == 1'), 10, what="the stalled series in prometheus")
            assert [(r["metric"]["rank"], r["metric"]["instance"], r["metric"]["job"])
                    for r in stalled] == [("0", target, "mlx-watchdog")], stalled
            stopped = query(base, 'max_over_time(mlx_watchdog_rank_state{state="stopped",'
                                  f'mlx_job="{name}"}}[5m]) == 1')
            assert [r["metric"]["rank"] for r in stopped] == ["1"], stopped

            # The kill arrived: both ranks ended by SIGTERM, counted per job.
            kills = wait_for(lambda: query(
                base, 'mlx_watchdog_kills_total{signal="SIGTERM"} > 0'), 10,
                what="the kills counter in prometheus")
            assert len(kills) == 1 and float(kills[0]["value"][1]) == 2, kills
            assert kills[0]["metric"]["job"] == "mlx-watchdog"  # node series: the scrape job
            job_kills = wait_for(lambda: query(
                base, f'mlx_watchdog_job_kills_total{{mlx_job="{name}"}} == 2'), 10,
                what="the job's kills in prometheus")
            assert job_kills[0]["metric"]["instance"] == target
            stalls = query(base, 'sum(mlx_watchdog_stalls_total{verdict="stalled"})')
            assert [float(r["value"][1]) for r in stalls] == [1.0], stalls
        finally:
            prom.terminate()
            try:
                prom.wait(timeout=15)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        assert daemon.alive()
    took = time.monotonic() - began
    assert took < 60, f"took {took:.0f}s"
