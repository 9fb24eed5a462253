"""The Grafana dashboard in docs/grafana-dashboard.json.

Checks that it is importable JSON, that every panel is addressable and bound to
the Prometheus data source input, and that its queries are valid PromQL over
metrics the daemon exports (the fixed list lives in test_alerts.py).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.support import REPO
from tests.unit.docs.test_alerts import (
    EXPORTED_METRICS,
    EXPORTED_SERIES,
    metric_names_in,
    run_promtool,
)

DASHBOARD = REPO / "docs" / "grafana-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

# Grafana's variables, replaced by something Prometheus accepts before promtool
# checks the queries.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "$instance": ".*",
    "$mlx_job": ".*",
}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict) -> list[dict]:
    """Every panel, including those nested in collapsed rows."""
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def _exprs(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"])
    return exprs


def test_is_a_dashboard(dashboard):
    assert dashboard["title"] == "mlx-watchdog"
    assert dashboard["uid"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["id"] is None, "an exported dashboard must not carry a database id"
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource"


def test_template_variables(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"instance", "mlx_job"} <= set(variables)
    for name in ("instance", "mlx_job"):
        assert variables[name]["datasource"] == DATASOURCE
        assert variables[name]["multi"] and variables[name]["includeAll"]
    assert 'up{job="mlx-watchdog"}' in variables["instance"]["definition"]


def test_panels_have_unique_ids_and_a_datasource(dashboard):
    panels = _panels(dashboard)
    assert len(panels) >= 10
    ids = [p.get("id") for p in panels]
    assert all(isinstance(i, int) for i in ids), ids
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for panel in panels:
        assert panel.get("datasource") == DATASOURCE, f"panel {panel['title']!r}"
        assert panel.get("title")
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"panel {panel['title']!r} is wider than the grid"
        targets = panel.get("targets", [])
        assert targets, f"panel {panel['title']!r} has no query"
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), f"panel {panel['title']!r}: duplicate refIds"
        for target in targets:
            assert target.get("datasource", DATASOURCE) == DATASOURCE
            assert target["expr"].strip()


def test_only_exported_metrics(dashboard):
    used = set()
    for expr in _exprs(dashboard):
        used |= metric_names_in(expr)
    unknown = used - EXPORTED_SERIES
    assert not unknown, f"the dashboard queries metrics the daemon does not export: {unknown}"


def test_every_exported_metric_is_shown(dashboard):
    used = set()
    for expr in _exprs(dashboard):
        used |= metric_names_in(expr)
    shown = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    missing = EXPORTED_METRICS - shown
    assert not missing, f"no panel shows {sorted(missing)}"


def test_rank_panels_filter_on_both_variables(dashboard):
    for expr in _exprs(dashboard):
        for selector in re.findall(r"mlx_watchdog_rank_\w+\{([^}]*)\}", expr):
            assert 'instance=~"$instance"' in selector, expr
            if "label_values" not in expr:
                assert 'mlx_job=~"$mlx_job"' in selector, expr


def test_a_rank_or_a_jobs_kills_are_never_merged_across_owners(dashboard):
    """A job is its owner's uid with its id (another user may name the same id): an
    aggregation that keeps `mlx_job` keeps `uid` too (issue 37)."""
    for expr in _exprs(dashboard):
        for kept in re.findall(r"by \(([^)]*)\)", expr):
            labels = {label.strip() for label in kept.split(",")}
            if "mlx_job" in labels:
                assert "uid" in labels, expr


def test_queries_are_valid_promql(dashboard, tmp_path):
    rules = ["groups:", "  - name: dashboard", "    rules:"]
    for n, expr in enumerate(e for e in _exprs(dashboard) if not e.startswith("label_values(")):
        for variable, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
        rules.append(f"      - record: dashboard:query_{n}")
        rules.append(f"        expr: {json.dumps(expr)}")
    path = tmp_path / "dashboard_queries.yml"
    path.write_text("\n".join(rules) + "\n")
    run_promtool("check", "rules", str(path))
