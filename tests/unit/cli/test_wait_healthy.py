"""`mlx-watchdog node wait-healthy` as the first step of a KeepAlive / Restart=always
service: the example LaunchAgent through the stand-in launchctl, the example systemd unit
through systemd-analyze, each service's start run as its manager would run it.
tests/ranks/cli/test_wait_healthy.py reads a peer's reboot flag from a real daemon.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support import BIN
from tests.support.ranks import REPO
from tests.unit.cli.test_launchd import calls
from tests.unit.cli.test_service import LAUNCHD_KEYS, unit_settings, verify
from watchdog.daemon.store import journal
from watchdog.launch.relaunch import EXIT_REFUSED

PLIST = REPO / "launchd" / "com.example.mlx-lm-server.plist"
UNIT = REPO / "systemd" / "mlx-lm-server.example.service"
INSTALLED = "/usr/local/bin/mlx-watchdog"
SERVER = "/usr/local/bin/mlx_lm.server"


def stand_ins(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An `mlx-watchdog` that is this tree's CLI, and a server that says it started."""
    wd = tmp_path / "bin" / "mlx-watchdog"
    wd.parent.mkdir(exist_ok=True)
    wd.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m watchdog.cli \"$@\"\n")
    started = tmp_path / "server-started"
    server = tmp_path / "bin" / "mlx_lm.server"
    server.write_text(f"#!/bin/sh\necho \"$@\" > {shlex.quote(str(started))}\n")
    for f in (wd, server):
        f.chmod(0o755)
    return wd, server, started


def run_start(argv: list[str], env: dict[str, str], state_dir: Path, clear_when_waiting: bool
              ) -> subprocess.CompletedProcess[str]:
    """Run a service's start the way its manager does; optionally clear the reboot flag
    (as an operator would after rebooting) once wait-healthy says it waits."""
    full = dict(os.environ, PYTHONPATH=str(REPO), MLX_WATCHDOG_STATE_DIR=str(state_dir),
                MLX_WATCHDOG_CONFIG=str(state_dir / "none.toml"), **env)
    (state_dir / "none.toml").write_text("")
    proc = subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    said: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            said.append(line)
            if clear_when_waiting and "waiting for a fit node" in line:
                journal.clear_reboot_flag(str(state_dir))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    return subprocess.CompletedProcess(argv, proc.returncode, "", "".join(said))


def test_the_example_launch_agent_is_a_valid_keepalive_job(tmp_path, monkeypatch):
    job = plistlib.loads(PLIST.read_bytes())
    assert set(job) <= LAUNCHD_KEYS, set(job) - LAUNCHD_KEYS
    assert job["KeepAlive"] is True and job["RunAtLoad"] is True
    program, flag, script = job["ProgramArguments"]
    assert (program, flag) == ("/bin/sh", "-c")
    assert script.startswith(f"{INSTALLED} node wait-healthy --timeout 300 && exec {SERVER} ")
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LAUNCHCTL_STATE", str(tmp_path / "launchd-state.json"))
    monkeypatch.setenv("FAKE_LAUNCHCTL_LOG", str(tmp_path / "launchctl.log"))
    loaded = subprocess.run(["launchctl", "bootstrap", "gui/501", str(PLIST)],
                            capture_output=True, text=True, timeout=30)
    assert loaded.returncode == 0, loaded.stderr
    assert calls(tmp_path / "launchctl.log") == [["bootstrap", "gui/501", str(PLIST)]]


@pytest.mark.slow
@pytest.mark.parametrize("cleared", [False, True])
def test_the_launch_agent_never_starts_its_server_into_a_flagged_node(tmp_path, state_dir,
                                                                       cleared):
    job = plistlib.loads(PLIST.read_bytes())
    wd, server, started = stand_ins(tmp_path)
    program, flag, script = job["ProgramArguments"]
    script = script.replace(INSTALLED, str(wd)).replace(SERVER, str(server))
    if not cleared:
        script = script.replace("--timeout 300", "--timeout 0.5")
    journal.set_reboot_flag(str(state_dir), "wired memory stayed 414 GiB above the baseline")
    done = run_start([program, flag, script], job["EnvironmentVariables"], state_dir,
                     clear_when_waiting=cleared)
    if cleared:
        assert done.returncode == 0, done.stderr
        assert started.read_text().startswith("--model ")
    else:
        assert done.returncode == EXIT_REFUSED, done.stderr
        assert not started.exists()
        assert done.stderr.splitlines()[-1] == (
            "mlx-watchdog: node not fit: this node is flagged for reboot (wired memory stayed "
            "414 GiB above the baseline; clear it with `mlx-watchdog node clear-reboot` after "
            "rebooting)")


def test_the_example_unit_verifies_and_waits_before_it_starts(tmp_path):
    settings = unit_settings(UNIT.read_text())
    (pre,) = settings[("Service", "ExecStartPre")]
    assert pre.startswith(f"{INSTALLED} node wait-healthy --timeout 300")
    assert settings[("Service", "Restart")] == ["always"]
    assert float(settings[("Service", "TimeoutStartSec")][0]) > 300  # the wait fits in
    assert settings[("Unit", "StartLimitIntervalSec")] == ["0"]
    wd, server, _ = stand_ins(tmp_path)
    unit = tmp_path / "mlx-lm-server.service"
    unit.write_text(UNIT.read_text().replace(INSTALLED, str(wd)).replace(SERVER, str(server)))
    returncode, ours, stderr = verify(unit)
    assert returncode == 0 and ours == [], stderr


@pytest.mark.slow
def test_the_units_start_refuses_while_flagged_then_starts(tmp_path, state_dir):
    """ExecStartPre, then ExecStart only if it succeeded: what systemd does."""
    settings = unit_settings(UNIT.read_text())
    wd, server, started = stand_ins(tmp_path)
    env = dict(e.split("=", 1) for e in settings[("Service", "Environment")])
    pre = shlex.split(settings[("Service", "ExecStartPre")][0].replace(INSTALLED, str(wd)))
    start = shlex.split(settings[("Service", "ExecStart")][0].replace(SERVER, str(server)))
    journal.set_reboot_flag(str(state_dir), "rank 1 survived SIGKILL")
    refused = run_start([*pre[:-1], "0.3"], env, state_dir, clear_when_waiting=False)
    assert refused.returncode == EXIT_REFUSED and "flagged for reboot" in refused.stderr
    waited = run_start(pre, env, state_dir, clear_when_waiting=True)
    assert waited.returncode == 0, waited.stderr
    assert subprocess.run(start, timeout=30).returncode == 0 and started.exists()
