"""`service install/uninstall` where systemctl cannot reach systemd (a container, WSL):
the install says what to do, the uninstall removes the file whatever systemctl says; and
a unit whose ExecStart lies under a temporary directory is warned about (PrivateTmp hides
it). Through the stand-in systemctl (tests/support/bin), in process with CliRunner.
"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from tests.support import BIN
from watchdog.cli.commands import cli
from watchdog.cli.service import unit as svc


@pytest.fixture
def no_bus(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMCTL_NO_BUS", "1")
    monkeypatch.setenv("FAKE_SYSTEMCTL_LOG", str(tmp_path / "systemctl.log"))
    return tmp_path


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_install_without_systemd_says_to_use_no_load_and_uninstall_removes_it(no_bus):
    unit = no_bus / "mlx-watchdog.service"
    done = run("service", "install", "--systemd", "--path", str(unit), "--load")
    assert done.exit_code == 3 and unit.exists()
    said = " ".join(done.stderr.split())
    assert "systemctl cannot reach systemd on this machine (a container, or WSL" in said
    assert "Install with --no-load" in said
    assert f"{unit} is written but not loaded" in said
    assert "service uninstall --systemd" in said

    done = run("service", "uninstall", "--systemd", "--path", str(unit))
    assert done.exit_code == 0, done.output
    assert not unit.exists()
    assert f"removed {unit}" in done.stdout
    assert "warning: systemctl disable --now mlx-watchdog.service failed" in done.stderr
    assert "Install with --no-load" in " ".join(done.stderr.split())


def test_install_with_no_load_needs_no_systemd(no_bus):
    unit = no_bus / "mlx-watchdog.service"
    done = run("service", "install", "--systemd", "--path", str(unit), "--no-load")
    assert done.exit_code == 0, done.output
    assert "load it with:" in done.stdout and unit.exists()
    assert not (no_bus / "systemctl.log").exists()


def test_an_execstart_under_tmp_is_warned_about(no_bus, monkeypatch, tmp_path):
    script = tmp_path / "venv" / "bin" / "mlx-watchdog"
    monkeypatch.setattr(svc, "script_path", lambda: str(script))
    done = run("service", "install", "--systemd", "--path", str(tmp_path / "u.service"),
               "--no-load")
    assert done.exit_code == 0, done.output
    said = " ".join(done.stderr.split())
    under = svc.under_private_tmp(str(script))  # tmp_path: /tmp, or $TMPDIR
    assert under and f"the unit runs {script}, under {under}, which the unit's PrivateTmp=yes" \
        " hides" in said


def test_under_private_tmp():
    assert svc.under_private_tmp("/tmp/x/bin/mlx-watchdog") == "/tmp"
    assert svc.under_private_tmp("/var/tmp/v/bin/mlx-watchdog") == "/var/tmp"
    assert svc.under_private_tmp("/opt/mlx-watchdog/bin/mlx-watchdog") is None
    assert svc.under_private_tmp("/tmpfoo/bin/mlx-watchdog") is None
