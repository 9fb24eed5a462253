"""`mlx-watchdog doctor --mac-check` (issue 54): on the simulated Mac it starts its own
small MLX job, measures each figure through the stand-ins (watchdog/macsim) and prints
it beside what the daemon assumes, with a JSON report; elsewhere it refuses in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.ranks import REPO

pytestmark = pytest.mark.ranks


def doctor(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "watchdog.cli", "doctor", *args],
                          capture_output=True, text=True, timeout=240, cwd=REPO,
                          env={**os.environ, "MLX_WATCHDOG_SIMULATE_ROOT": str(tmp_path),
                               **env})


def test_the_mac_check_measures_the_simulated_mac_and_writes_its_report(tmp_path):
    report = tmp_path / "report.json"
    done = doctor(tmp_path, "--mac-check", "--report", str(report),
                  MLX_WATCHDOG_SIMULATE="macos")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mac check on macos (simulated)" in done.stdout
    data = json.loads(report.read_text())
    checks = {f["check"]: f for f in data["figures"]}
    assert set(checks) == {"threads", "sample", "ioreg", "powermetrics", "save bytes",
                           "wired", "thermal"}, checks
    assert data["ok"] and all(f["level"] != "fail" for f in data["figures"])
    assert checks["ioreg"]["value"]["moves"] > 0  # its GPU time advanced as it computed
    for f in data["figures"]:
        assert f"[{f['level'].upper():4}] {f['check']}: " in done.stdout
        assert "(the daemon assumes: " in done.stdout
    print("\n" + done.stdout)


def test_the_mac_check_refuses_off_a_mac_in_one_line(tmp_path):
    done = doctor(tmp_path, "--mac-check", MLX_WATCHDOG_SIMULATE="")
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "measures a Mac" in done.stderr, done.stderr
