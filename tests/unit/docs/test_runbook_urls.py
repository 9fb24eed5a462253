"""The alert rules' runbook links: relative in docs/alerts.yml, made absolute by the
command docs/metrics.md gives for the copy Prometheus loads, which promtool accepts."""

from __future__ import annotations

import re
import subprocess

from tests.support import REPO
from tests.unit.docs.test_alerts import promtool_path
from tests.unit.docs.test_readme import shell_lines


def test_the_documented_copy_has_absolute_runbook_urls(tmp_path):
    doc = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    (line,) = [line for line in shell_lines(doc) if "runbook_url" in line]
    target = tmp_path / "mlx-watchdog-alerts.yml"
    done = subprocess.run(["bash", "-c", line.replace("/etc/prometheus/", f"{tmp_path}/")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    urls = re.findall(r'runbook_url: "([^"]+)"', target.read_text())
    relative = re.findall(r'runbook_url: "([^"]+)"',
                          (REPO / "docs" / "alerts.yml").read_text())
    assert urls and len(urls) == len(relative)
    for url, was in zip(urls, relative, strict=True):
        assert url == "https://github.com/YOU/mlx-watchdog/blob/main/" + was, url
    checked = subprocess.run([promtool_path(), "check", "rules", str(target)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
