"""The launchd and systemd service files: content, drift, verification, install."""

import os
import plistlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from watchdog.cli.service import control as servicectl
from watchdog.cli.service import unit as service
from watchdog.cli.service.unit import ServiceError

STATIC = {
    "launchd": REPO / "launchd" / "com.github.mlx-watchdog.plist",
    "systemd": REPO / "systemd" / "mlx-watchdog.service",
}
REFERENCE_EXECUTABLE = "/usr/local/bin/mlx-watchdog"
SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"

# Every key documented in launchd.plist(5).
LAUNCHD_KEYS = frozenset(
    """
    Label Disabled UserName GroupName inetdCompatibility LimitLoadToHosts
    LimitLoadFromHosts LimitLoadToSessionType Program ProgramArguments
    EnableGlobbing EnableTransactions EnablePressuredExit OnDemand ServiceIPC
    KeepAlive RunAtLoad RootDirectory WorkingDirectory EnvironmentVariables
    Umask TimeOut ExitTimeOut ThrottleInterval InitGroups WatchPaths
    QueueDirectories StartOnMount StartInterval StartCalendarInterval
    StandardInPath StandardOutPath StandardErrorPath Debug WaitForDebugger
    SoftResourceLimits HardResourceLimits Nice ProcessType AbandonProcessGroup
    LowPriorityIO LowPriorityBackgroundIO MaterializeDatalessFiles
    LaunchOnlyOnce MachServices Sockets LaunchEvents AssociatedBundleIdentifiers
    SessionCreate LegacyTimers
    """.split()
)


def reference(kind, **overrides):
    kwargs = {
        "executable": REFERENCE_EXECUTABLE,
        "config": service.DEFAULT_CONFIG,
        "record_dir": service.DEFAULT_RECORD_DIR[kind],
        "state_dir": service.DEFAULT_STATE_DIR[kind],
    }
    kwargs.update(overrides)
    return service.render(kind, **kwargs)


def unit_settings(text):
    """{(section, key): [values]} of a unit file, comments skipped."""
    settings, section = {}, None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault((section, key), []).append(value)
    return settings


def verify(unit_path):
    """Run systemd-analyze verify; return the diagnostics that concern our unit."""
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(unit_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify exits 0 on "Unknown key ... ignoring" and similar, so its stderr
    # is the verdict; lines about other units on this machine are not ours.
    ours = [line for line in result.stderr.splitlines() if unit_path.name in line]
    return result.returncode, ours, result.stderr


@pytest.mark.parametrize("kind", service.KINDS)
def test_static_files_are_render_output(kind):
    assert STATIC[kind].read_text(encoding="utf-8") == reference(kind), (
        f"{STATIC[kind]} drifted from watchdog/cli/service/unit.py; regenerate it with render()"
    )


def test_launchd_plist_keys_are_real_and_values_right():
    job = plistlib.loads(STATIC["launchd"].read_bytes())
    assert set(job) <= LAUNCHD_KEYS, set(job) - LAUNCHD_KEYS
    assert job["Label"] == "com.github.mlx-watchdog"
    assert job["ProgramArguments"] == [
        REFERENCE_EXECUTABLE,
        "run",
        "--config",
        "/etc/mlx-watchdog.toml",
    ]
    assert job["RunAtLoad"] is True
    assert job["KeepAlive"] is True
    assert job["ThrottleInterval"] == 10
    assert job["ProcessType"] in ("Interactive", "Standard")
    assert job["StandardOutPath"] == "/var/log/mlx-watchdog.log"
    assert job["StandardErrorPath"] == "/var/log/mlx-watchdog.err.log"
    # A LaunchDaemon runs as root unless told otherwise.
    assert "UserName" not in job and "GroupName" not in job
    # NumberOfFiles here would change kern.maxfiles for the whole machine.
    assert "SoftResourceLimits" not in job and "HardResourceLimits" not in job


def test_launchd_plist_explains_itself_in_comments():
    text = STATIC["launchd"].read_text(encoding="utf-8")
    assert "<!-- Interactive, not Standard" in text
    assert "kern.maxfiles" in text


def test_launchd_non_default_paths_become_arguments():
    text = service.render(
        "launchd",
        executable="/opt/my venv/bin/mlx-watchdog",
        config=None,
        record_dir="/private/var/run/ranks",
        state_dir="/Library/Application Support/mlx-watchdog/",
    )
    job = plistlib.loads(text.encode())
    assert job["ProgramArguments"] == [
        "/opt/my venv/bin/mlx-watchdog",
        "run",
        "--dir",
        "/private/var/run/ranks",
        "--state-dir",
        "/Library/Application Support/mlx-watchdog",
    ]


def test_systemd_unit_settings():
    settings = unit_settings(STATIC["systemd"].read_text(encoding="utf-8"))

    def one(section, key):
        assert len(settings[(section, key)]) == 1, key
        return settings[(section, key)][0]

    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "30",
        "Restart": "always",
        "RestartSec": "2",
        "ExecStart": f"{REFERENCE_EXECUTABLE} run --config /etc/mlx-watchdog.toml",
        "RuntimeDirectory": "mlx-watchdog",
        "RuntimeDirectoryMode": "1777",
        "RuntimeDirectoryPreserve": "yes",
        "StateDirectory": "mlx-watchdog",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "read-only",
    }
    for key, value in expected.items():
        assert one("Service", key) == value, key
    assert one("Install", "WantedBy") == "multi-user.target"
    capabilities = set(one("Service", "CapabilityBoundingSet").split())
    assert {"CAP_KILL", "CAP_SYS_PTRACE"} <= capabilities
    # The daemon must keep seeing other users' processes.
    for hiding in ("ProtectProc", "ProcSubset", "PrivatePIDs", "PrivateUsers", "User"):
        assert ("Service", hiding) not in settings, hiding


@pytest.fixture
def rendered_unit(tmp_path):
    """Write a rendered unit whose ExecStart exists on this machine."""

    def write(**overrides):
        text = reference("systemd", executable=sys.executable, **overrides)
        path = tmp_path / service.UNIT
        path.write_text(text, encoding="utf-8")
        return path

    return write


def test_systemd_analyze_verify_is_clean(rendered_unit):
    returncode, ours, stderr = verify(rendered_unit())
    assert returncode == 0, stderr
    assert ours == [], stderr


def test_systemd_analyze_verify_catches_a_bad_key(rendered_unit):
    """Guard the guard: the check above must see warnings when there are some."""
    path = rendered_unit()
    path.write_text(path.read_text().replace("[Service]\n", "[Service]\nNoSuchKey=1\n"))
    _, ours, stderr = verify(path)
    assert any("NoSuchKey" in line for line in ours), stderr


def test_systemd_quoting_survives_verify(tmp_path):
    # A path needing quotes and specifier escapes, pointing at a real program.
    odd_dir = tmp_path / "my venv 100%$HOME"
    odd_dir.mkdir()
    link = odd_dir / "mlx-watchdog"
    link.symlink_to(sys.executable)
    record_dir, state_dir = tmp_path / "records", tmp_path / "state"
    record_dir.mkdir()
    state_dir.mkdir()
    text = service.render(
        "systemd",
        executable=str(link),
        config=str(odd_dir / 'a "quoted" \\config.toml'),
        record_dir=str(record_dir),
        state_dir=str(state_dir),
    )
    exec_start = unit_settings(text)[("Service", "ExecStart")][0]
    program, _, arguments = exec_start.partition('mlx-watchdog" ')
    assert program.startswith('"') and "100%%$HOME" in program
    assert "100%%$$HOME" in arguments and r'a \"quoted\" \\config.toml"' in arguments
    assert f"--dir {record_dir}" in exec_start
    assert f"--state-dir {state_dir}" in exec_start
    assert f"ReadWritePaths={record_dir} {state_dir}" in text
    assert "RuntimeDirectory=" not in text
    path = tmp_path / service.UNIT
    path.write_text(text, encoding="utf-8")
    returncode, ours, stderr = verify(path)
    assert returncode == 0 and ours == [], stderr


def test_systemd_other_run_and_state_names(rendered_unit):
    path = rendered_unit(record_dir="/run/ranks", state_dir="/var/lib/wd/state")
    settings = unit_settings(path.read_text())
    assert settings[("Service", "RuntimeDirectory")] == ["ranks"]
    assert settings[("Service", "StateDirectory")] == ["wd/state"]
    assert "--dir /run/ranks --state-dir /var/lib/wd/state" in settings[("Service", "ExecStart")][0]
    returncode, ours, stderr = verify(path)
    assert returncode == 0 and ours == [], stderr


@pytest.mark.parametrize(
    "overrides",
    [
        {"executable": "mlx-watchdog"},
        {"record_dir": "relative/dir"},
        {"record_dir": "/run"},
        {"state_dir": "/var/lib/with space"},
        {"state_dir": "/var/lib/100%"},
        {"executable": "/usr/bin/mlx\nwatchdog"},
        {"config": "mlx-watchdog.toml"},
        {"executable": '/opt/"venv"/bin/mlx-watchdog'},
    ],
)
def test_render_refuses_what_it_cannot_write_safely(overrides):
    with pytest.raises(ServiceError):
        reference("systemd", **overrides)


def test_unknown_kind():
    with pytest.raises(ServiceError, match="launchd"):
        service.default_path("upstart")
    with pytest.raises(ServiceError):
        service.render("upstart", executable="/x", config=None, record_dir="/a", state_dir="/b")


def test_default_paths():
    assert service.default_path("launchd") == (
        "/Library/LaunchDaemons/com.github.mlx-watchdog.plist"
    )
    assert service.default_path("systemd") == "/etc/systemd/system/mlx-watchdog.service"


@pytest.mark.parametrize("kind", service.KINDS)
def test_install_writes_atomically_with_mode_0644(tmp_path, kind):
    target = tmp_path / "unit"
    target.write_text("old")
    old_umask = os.umask(0o077)
    try:
        written = service.install(
            kind,
            str(target),
            executable=REFERENCE_EXECUTABLE,
            config=service.DEFAULT_CONFIG,
            record_dir=service.DEFAULT_RECORD_DIR[kind],
            state_dir=service.DEFAULT_STATE_DIR[kind],
        )
    finally:
        os.umask(old_umask)
    assert written == str(target)
    assert target.read_text(encoding="utf-8") == reference(kind)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unit"]


def install_kwargs():
    return {
        "executable": REFERENCE_EXECUTABLE,
        "config": None,
        "record_dir": "/run/mlx-watchdog",
        "state_dir": "/var/lib/mlx-watchdog",
    }


def test_install_into_missing_directory_is_a_service_error(tmp_path):
    target = tmp_path / "no-such-dir" / "mlx-watchdog.service"
    with pytest.raises(ServiceError, match="cannot write"):
        service.install("systemd", str(target), **install_kwargs())


def test_install_not_permitted_says_so_and_cleans_up(tmp_path, monkeypatch):
    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(service.os, "replace", refuse)
    target = tmp_path / "mlx-watchdog.service"
    with pytest.raises(ServiceError, match="run this as root") as raised:
        service.install("systemd", str(target), **install_kwargs())
    assert isinstance(raised.value.__cause__, PermissionError)
    assert list(tmp_path.iterdir()) == []


def test_script_path_is_this_interpreters_script():
    path = service.script_path()
    assert os.path.isabs(path) and os.access(path, os.X_OK)
    assert Path(path).name == "mlx-watchdog"
    # Not a pyenv-style shim found on $PATH: the script next to the interpreter.
    with open(path, encoding="utf-8", errors="replace") as script:
        assert "python" in script.readline()


def test_activation_commands():
    assert servicectl.activation_commands("launchd", "/L/x.plist") == [
        ["launchctl", "enable", "system/com.github.mlx-watchdog"],
        ["launchctl", "bootstrap", "system", "/L/x.plist"],
    ]
    unit = "/etc/systemd/system/mlx-watchdog.service"
    assert servicectl.activation_commands("systemd", unit) == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "mlx-watchdog.service"],
    ]


def test_systemd_analyze_is_here():
    # The verify tests above must not silently become a no-op on this machine.
    assert shutil.which(SYSTEMD_ANALYZE) is not None
