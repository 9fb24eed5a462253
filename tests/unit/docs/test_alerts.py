"""The Prometheus alerting rules in docs/alerts.yml.

promtool (Debian's `prometheus` package, installed by CI) validates the rules
and runs their unit tests in tests/support/alerts_test.yml. The rest checks, without a
YAML parser, that the rules only use metrics the daemon exports and that every
alert is complete and tested both ways.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO, SUPPORT

ROOT = REPO
RULES = ROOT / "docs" / "alerts.yml"
RULE_TESTS = SUPPORT / "alerts_test.yml"

# The metric families the daemon exports (design section 6). The names are
# fixed: the alert rules and the Grafana dashboard are written against them.
EXPORTED_METRICS: frozenset[str] = frozenset(
    {
        "mlx_watchdog_rank_state",
        "mlx_watchdog_rank_progress_total",
        "mlx_watchdog_rank_collectives_total",
        "mlx_watchdog_rank_steps_total",
        "mlx_watchdog_rank_seconds_since_progress",
        "mlx_watchdog_rank_deadline_seconds",
        "mlx_watchdog_rank_busiest_thread_cpu_ratio",
        "mlx_watchdog_stalls_total",
        "mlx_watchdog_kills_total",
        "mlx_watchdog_job_kills_total",
        "mlx_watchdog_launch_events_total",
        "mlx_watchdog_rank_attempt",
        "mlx_watchdog_rank_wait_share",
        "mlx_watchdog_rank_pace_score",
        "mlx_watchdog_job_slowdown_ratio",
        "mlx_watchdog_node_reboot_required",
        "mlx_watchdog_wired_memory_bytes",
        "mlx_watchdog_invalid_records_total",
        "mlx_watchdog_record_dir_full",
        "mlx_watchdog_probe_errors_total",
        "mlx_watchdog_loop_errors_total",
        "mlx_watchdog_scan_duration_seconds",
        "mlx_watchdog_last_scan_timestamp_seconds",
        "mlx_watchdog_build_info",
        "mlx_watchdog_mode",
    }
)
EXPORTED_HISTOGRAMS: frozenset[str] = frozenset({"mlx_watchdog_scan_duration_seconds"})

# Every series name a query may use: histograms are queried through their
# _bucket, _sum and _count series.
EXPORTED_SERIES: frozenset[str] = (EXPORTED_METRICS - EXPORTED_HISTOGRAMS) | frozenset(
    name + suffix for name in EXPORTED_HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")
)

METRIC_NAME = re.compile(r"\bmlx_watchdog_[a-z0-9_]+\b")


def metric_names_in(text: str) -> set[str]:
    """The mlx_watchdog_* names used in a PromQL expression (or any text)."""
    return set(METRIC_NAME.findall(text))


def promtool_path() -> str:
    """promtool, or a test failure saying how to install it (never a skip)."""
    path = shutil.which("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
    )
    if path is None:
        pytest.fail(
            "promtool not found: install Debian's `prometheus` package "
            "(apt-get install prometheus) to validate the alert rules and dashboard queries",
            pytrace=False,
        )
    return path


def run_promtool(*args: str) -> None:
    """Run promtool from the repository root and require exit status 0."""
    proc = subprocess.run(
        [promtool_path(), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (
        f"promtool {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    )


def _rules_without_comments() -> str:
    return "\n".join(
        line for line in RULES.read_text().splitlines() if not line.lstrip().startswith("#")
    )


def _rule_blocks() -> dict[str, str]:
    """Alert name -> the text of its rule, split at each `- alert:`."""
    parts = re.split(r"^\s*- alert:\s*", _rules_without_comments(), flags=re.M)[1:]
    blocks = {}
    for part in parts:
        name, _, body = part.partition("\n")
        blocks[name.strip()] = body
    return blocks


def test_promtool_check_rules():
    run_promtool("check", "rules", str(RULES.relative_to(ROOT)))


@pytest.mark.slow
def test_promtool_unit_tests():
    run_promtool("test", "rules", str(RULE_TESTS.relative_to(ROOT)))


def test_rules_use_only_exported_metrics():
    used = metric_names_in(_rules_without_comments())
    assert used, "no mlx_watchdog_* metric found in docs/alerts.yml"
    unknown = used - EXPORTED_SERIES
    assert not unknown, f"docs/alerts.yml uses metrics the daemon does not export: {unknown}"


def test_rules_scrape_job_and_label_assumption_documented():
    text = RULES.read_text()
    assert 'up{job="mlx-watchdog"}' in text
    # The MLX job is `mlx_job`: `job` stays the scrape job's, no honor_labels needed.
    # A rank is its job's, its owner's and its number: another user's rank naming
    # the job never stands for the owner's (issue 37).
    assert "on (instance, mlx_job, uid, rank)" in text and "$labels.mlx_job" in text
    assert "on (instance, mlx_job, rank)" not in text
    assert "honor_labels: true" not in text


def test_rule_tests_use_only_exported_metrics():
    used = metric_names_in(RULE_TESTS.read_text())
    unknown = used - EXPORTED_SERIES
    assert not unknown, (
        f"tests/support/alerts_test.yml feeds metrics the daemon does not export: {unknown}")


def test_every_alert_is_complete():
    blocks = _rule_blocks()
    assert len(blocks) >= 10
    for name, body in blocks.items():
        assert re.match(r"MLX[A-Za-z]+$", name), name
        assert re.search(r"^\s+for: \d+[smh]\s*$", body, re.M), f"{name}: no for:"
        assert re.search(r"^\s+severity: (critical|warning)\s*$", body, re.M), (
            f"{name}: severity must be critical or warning"
        )
        for key in ("summary", "description"):
            assert re.search(rf"^\s+{key}: \S", body, re.M), f"{name}: no {key}"
        assert re.search(r'runbook_url: "docs/operations\.md#[a-z0-9-]+"', body), (
            f"{name}: no runbook_url into docs/operations.md"
        )
        assert "{{ $labels.instance }}" in body or "absent(" in body, (
            f"{name}: the summary or description should name the instance"
        )


def test_expected_alerts_exist():
    blocks = _rule_blocks()
    for name in (
        "MLXRankHung",
        "MLXRankSuspect",
        "MLXRankUnkillable",
        "MLXNodeRebootRequired",
        "MLXJobRepeatedKills",
        "MLXLaunchGaveUp",
        "MLXWatchdogDown",
        "MLXWatchdogAbsent",
        "MLXWatchdogNotScanning",
        "MLXWatchdogScansSlow",
        "MLXWatchdogInvalidRecords",
    ):
        assert name in blocks, f"docs/alerts.yml has no alert {name}"
    assert re.search(r"^\s+severity: critical", blocks["MLXRankHung"], re.M)
    assert re.search(r"^\s+severity: critical", blocks["MLXNodeRebootRequired"], re.M)


def test_every_alert_tested_firing_and_not_firing():
    tests = RULE_TESTS.read_text()
    for name in _rule_blocks():
        fires = re.search(rf"alertname: {name}\s*\n\s*exp_alerts:\s*\n\s*- exp_labels:", tests)
        quiet = re.search(rf"alertname: {name}, exp_alerts: \[\]", tests)
        assert fires, f"tests/support/alerts_test.yml never expects {name} to fire"
        assert quiet, f"tests/support/alerts_test.yml never expects {name} to stay quiet"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up == 0", set()),
        (
            "histogram_quantile(0.99, rate(mlx_watchdog_scan_duration_seconds_bucket[5m]))",
            {"mlx_watchdog_scan_duration_seconds_bucket"},
        ),
        (
            'a{x="mlx_watchdog_nope"} and mlx_watchdog_rank_state',
            {"mlx_watchdog_nope", "mlx_watchdog_rank_state"},
        ),
    ],
)
def test_metric_names_in(expr, names):
    assert metric_names_in(expr) == names
