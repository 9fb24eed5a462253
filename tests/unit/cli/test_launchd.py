"""launchd driven for real through a stand-in `launchctl` on PATH (tests/support/bin/launchctl),
which checks each call against launchctl(1)'s syntax and keeps the job state; the
plist checked key by key against launchd.plist(5); `doctor` on a Mac; and the systemd
symmetry through a stand-in `systemctl`."""

from __future__ import annotations

import json
import os
import plistlib
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support import BIN
from watchdog.cli.node import doctor
from watchdog.cli.service import control as servicectl
from watchdog.cli.service import unit as service

LABEL = "com.github.mlx-watchdog"
TARGET = f"system/{LABEL}"

# launchctl(1) (macOS 10.10+ "legacy-free" subcommands), the forms used here:
#   bootstrap <domain-target> [service-path ...]   bootout <service-target>
#   enable <service-target>    kickstart [-kp] <service-target>    print <service-target>
# with domain-target system | user/<uid> | gui/<uid>, service-target <domain-target>/<label>.
_DOMAIN = r"(?:system|user/\d+|gui/\d+)"
_SERVICE = rf"{_DOMAIN}/[^/\s]+"
DOCUMENTED = {
    "bootstrap": re.compile(rf"^bootstrap {_DOMAIN}( /\S+)+$"),
    "bootout": re.compile(rf"^bootout {_SERVICE}$"),
    "enable": re.compile(rf"^enable {_SERVICE}$"),
    "kickstart": re.compile(rf"^kickstart( -[kp])* {_SERVICE}$"),
    "print": re.compile(rf"^print {_SERVICE}$"),
}


@pytest.fixture
def mac(tmp_path, monkeypatch, darwin):
    """A fake Mac: launchctl/systemctl stand-ins first on PATH (the operator's
    commands), `sample` at the Mac's path (the daemon runs it by that alone), their
    logs here."""
    from watchdog.daemon.probes import macos

    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(macos.TOOLS, "sample", str(BIN / "sample"))
    monkeypatch.setenv("FAKE_LAUNCHCTL_STATE", str(tmp_path / "launchd-state.json"))
    monkeypatch.setenv("FAKE_LAUNCHCTL_LOG", str(tmp_path / "launchctl.log"))
    monkeypatch.setenv("FAKE_SYSTEMCTL_LOG", str(tmp_path / "systemctl.log"))
    return tmp_path


def calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def cli(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "watchdog.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def launchd_state(mac: Path) -> dict:
    return json.loads((mac / "launchd-state.json").read_text())


def assert_documented(argvs: list[list[str]]) -> None:
    for argv in argvs:
        line = " ".join(argv)
        assert DOCUMENTED[argv[0]].match(line), f"not launchctl(1) syntax: {line}"


@pytest.mark.slow
def test_install_bootstraps_into_the_system_domain(mac):
    plist = mac / f"{LABEL}.plist"
    done = cli("service", "install", "--launchd", "--path", str(plist), "--load")
    assert done.returncode == 0, done.stderr
    ran = calls(mac / "launchctl.log")
    assert ran == [["print", TARGET], ["enable", TARGET], ["bootstrap", "system", str(plist)]]
    assert_documented(ran)
    assert launchd_state(mac)["loaded"] == {LABEL: str(plist)}
    assert "ran: launchctl bootstrap system" in done.stdout
    assert plistlib.loads(plist.read_bytes())["Label"] == LABEL


@pytest.mark.slow
def test_reinstall_boots_the_loaded_job_out_first(mac):
    plist = mac / f"{LABEL}.plist"
    assert cli("service", "install", "--launchd", "--path", str(plist), "--load").returncode == 0
    (mac / "launchctl.log").unlink()
    done = cli("service", "install", "--launchd", "--path", str(plist), "--load")
    assert done.returncode == 0, done.stderr
    ran = calls(mac / "launchctl.log")
    assert ran == [["print", TARGET], ["bootout", TARGET], ["print", TARGET],
                   ["enable", TARGET], ["bootstrap", "system", str(plist)]]
    assert_documented(ran)


def test_bootstrap_of_a_loaded_job_fails_as_launchctl_does(mac):
    """The stand-in refuses what launchctl refuses; so an install that skipped the
    bootout would fail here, not only on a Mac."""
    plist = mac / f"{LABEL}.plist"
    plist.write_bytes(service.render("launchd", executable="/x/mlx-watchdog", config=None,
                                     record_dir="/var/run/mlx-watchdog",
                                     state_dir="/var/db/mlx-watchdog").encode())
    env = dict(os.environ)
    first = subprocess.run(["launchctl", "bootstrap", "system", str(plist)], env=env)
    again = subprocess.run(["launchctl", "bootstrap", "system", str(plist)], env=env,
                           capture_output=True, text=True)
    assert first.returncode == 0
    assert again.returncode == 5 and "Bootstrap failed: 5: Input/output error" in again.stderr


def test_no_load_prints_the_commands_instead(mac):
    plist = mac / f"{LABEL}.plist"
    done = cli("service", "install", "--launchd", "--path", str(plist))
    assert done.returncode == 0, done.stderr
    assert calls(mac / "launchctl.log") == []
    assert f"sudo launchctl enable {TARGET}" in done.stdout
    assert f"sudo launchctl bootstrap system {plist}" in done.stdout


@pytest.mark.slow
def test_uninstall_boots_out_and_removes_the_file_and_is_idempotent(mac):
    plist = mac / f"{LABEL}.plist"
    assert cli("service", "install", "--launchd", "--path", str(plist), "--load").returncode == 0
    (mac / "launchctl.log").unlink()
    done = cli("service", "uninstall", "--launchd", "--path", str(plist))
    assert done.returncode == 0, done.stderr
    ran = calls(mac / "launchctl.log")
    assert ran == [["print", TARGET], ["bootout", TARGET], ["print", TARGET]]
    assert_documented(ran)
    assert not plist.exists() and launchd_state(mac)["loaded"] == {}
    again = cli("service", "uninstall", "--launchd", "--path", str(plist))
    assert again.returncode == 0 and f"no {plist} to remove" in again.stdout


@pytest.mark.slow
def test_restart_is_kickstart_k(mac):
    plist = mac / f"{LABEL}.plist"
    assert cli("service", "install", "--launchd", "--path", str(plist), "--load").returncode == 0
    done = cli("service", "restart", "--launchd")
    assert done.returncode == 0, done.stderr
    assert calls(mac / "launchctl.log")[-1] == ["kickstart", "-k", TARGET]
    assert_documented(calls(mac / "launchctl.log"))


@pytest.mark.slow
def test_not_root_is_one_line_no_traceback(mac):
    plist = mac / f"{LABEL}.plist"
    done = cli("service", "install", "--launchd", "--path", str(plist), "--load",
               env_extra={"FAKE_LAUNCHCTL_EUID": "501"})
    assert done.returncode == 3  # a setup error, never a verdict's 1
    assert done.stderr.strip() == (f"mlx-watchdog: launchctl enable {TARGET} failed (exit 1): "
                                   "Enable failed: 1: Operation not permitted")


def test_no_launchctl_on_path_says_so(mac, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(service.ServiceError, match="launchctl is not on PATH: run by hand"):
        servicectl.load("launchd", "/Library/LaunchDaemons/x.plist")


@pytest.mark.slow
def test_systemd_install_and_uninstall_through_systemctl(mac):
    unit = mac / "mlx-watchdog.service"
    done = cli("service", "install", "--systemd", "--path", str(unit), "--load")
    assert done.returncode == 0, done.stderr
    assert calls(mac / "systemctl.log") == [["daemon-reload"],
                                            ["enable", "--now", "mlx-watchdog.service"]]
    (mac / "systemctl.log").unlink()
    done = cli("service", "uninstall", "--systemd", "--path", str(unit))
    assert done.returncode == 0, done.stderr
    assert calls(mac / "systemctl.log") == [["disable", "--now", "mlx-watchdog.service"],
                                            ["daemon-reload"]]
    assert not unit.exists()


# -- the plist, key by key against launchd.plist(5) ------------------------------------

# key: (type, what launchd.plist(5) says it must be / we require)
PLIST_TYPES = {
    "Label": str, "ProgramArguments": list, "RunAtLoad": bool, "KeepAlive": bool,
    "ThrottleInterval": int, "ExitTimeOut": int, "ProcessType": str,
    "StandardOutPath": str, "StandardErrorPath": str,
}


def test_plist_key_by_key():
    text = service.render("launchd", executable="/opt/venv/bin/mlx-watchdog",
                          config="/etc/mlx-watchdog.toml",
                          record_dir=service.DEFAULT_RECORD_DIR["launchd"],
                          state_dir=service.DEFAULT_STATE_DIR["launchd"])
    job = plistlib.loads(text.encode())
    assert set(job) == set(PLIST_TYPES)
    for key, kind in PLIST_TYPES.items():
        # bool is an int in Python: check exactly, as plist <true/> vs <integer> differ.
        assert type(job[key]) is kind, (key, job[key])
    # Label: reverse-DNS and the file is named <Label>.plist.
    assert job["Label"] == LABEL and service.default_path("launchd").endswith(f"/{LABEL}.plist")
    assert all(type(arg) is str for arg in job["ProgramArguments"])
    assert job["ProgramArguments"][:2] == ["/opt/venv/bin/mlx-watchdog", "run"]
    # KeepAlive true: restarted whatever the exit; ThrottleInterval: seconds between
    # restarts (launchd's default 10; anything under 1 is useless).
    assert job["KeepAlive"] is True and job["RunAtLoad"] is True
    assert 1 <= job["ThrottleInterval"] <= 60
    # ProcessType: one of the four documented values; Interactive is not throttled.
    assert job["ProcessType"] in {"Background", "Standard", "Adaptive", "Interactive"}
    assert job["ProcessType"] == "Interactive"
    # ExitTimeOut: SIGTERM-to-SIGKILL seconds; 0 means infinity and "should not be used".
    assert job["ExitTimeOut"] > 0
    assert job["ExitTimeOut"] >= service.shutdown_seconds()
    # Log paths: absolute, in a directory macOS ships (launchd creates the file only).
    for key in ("StandardOutPath", "StandardErrorPath"):
        assert os.path.isabs(job[key]) and os.path.dirname(job[key]) == "/var/log"
        assert os.path.isdir(os.path.dirname(job[key]))


def test_shutdown_time_covers_an_escalation_under_way():
    from watchdog.daemon.config import Settings

    s = Settings()
    assert service.shutdown_seconds() >= s.evidence_timeout + s.grace + s.kill_timeout + s.settle


@pytest.mark.slow
def test_the_real_daemon_stops_on_sigterm_well_within_exit_timeout(tmp_path):
    """What launchd does to stop the job: SIGTERM, then SIGKILL after ExitTimeOut."""
    job = plistlib.loads(service.render(
        "launchd", executable="/x", config=None, record_dir="/var/run/mlx-watchdog",
        state_dir="/var/db/mlx-watchdog").encode())
    records, state = tmp_path / "records", tmp_path / "state"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "watchdog.cli", "run", "--dir", str(records), "--state-dir",
         str(state), "--listen", "127.0.0.1:0", "--interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (state / "status.json").exists() and time.monotonic() < deadline:
            assert daemon.poll() is None, daemon.stderr.read() if daemon.stderr else ""
            time.sleep(0.1)
        assert (state / "status.json").exists()
        began = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=job["ExitTimeOut"])
        took = time.monotonic() - began
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert code == 0 and took < job["ExitTimeOut"]


# -- doctor on a Mac ----------------------------------------------------------------------


def mac_memory(monkeypatch) -> None:
    from tests.unit.daemon.probes.test_macos import mac_vmem

    monkeypatch.setattr(psutil, "virtual_memory", lambda: mac_vmem(9 << 30))


@pytest.mark.slow
def test_doctor_on_a_mac_with_the_job_loaded(mac, monkeypatch, record_dir, state_dir):
    mac_memory(monkeypatch)
    plist = mac / f"{LABEL}.plist"
    service.install("launchd", str(plist), executable="/x/mlx-watchdog", config=None,
                    record_dir=str(record_dir), state_dir=str(state_dir))
    servicectl.load("launchd", str(plist))
    lines = doctor.run_checks(str(record_dir), str(state_dir), "127.0.0.1:0")
    text = "\n".join(f"[{level}] {message}" for level, message in lines)
    assert "[ok] platform probes (macos):" in text and "wired memory 9216 MiB" in text
    assert f"[ok] native stacks for evidence: sample ({BIN / 'sample'})" in text
    assert "ptrace_scope" not in text  # Linux's Yama: not a Mac concern
    assert (f"[ok] launchd job {TARGET} loaded and running (pid 4321, from {plist})"
            in text)
    assert ["print", TARGET] in calls(mac / "launchctl.log")


def test_doctor_on_a_mac_without_the_job(mac, monkeypatch, record_dir, state_dir):
    mac_memory(monkeypatch)
    [(level, message)] = doctor.check_service()
    assert level == "warn" and f"{TARGET} is not loaded (it is not installed)" in message
    assert "sudo mlx-watchdog service install --launchd" in message


def test_doctor_on_a_mac_with_the_job_crashing(mac, monkeypatch):
    servicectl.run_command(["launchctl", "bootstrap", "system", str(_plist(mac))])
    monkeypatch.setenv("FAKE_LAUNCHCTL_JOB_STATE", "not running")
    monkeypatch.setenv("FAKE_LAUNCHCTL_LAST_EXIT", "2")
    [(level, message)] = doctor.check_service()
    assert level == "fail" and "loaded but not running (last exit code 2)" in message
    assert "/var/log/mlx-watchdog.err.log" in message


def test_doctor_on_a_mac_without_launchctl(mac, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    [(level, message)] = doctor.check_service()
    assert level == "warn" and "launchctl is not on PATH" in message


def test_doctor_on_a_mac_hints_at_sample(mac, monkeypatch, tmp_path):
    """No /usr/bin/sample (a `sample` on PATH is never the daemon's)."""
    from watchdog.daemon.probes import macos

    monkeypatch.setitem(macos.TOOLS, "sample", str(tmp_path / "none" / "sample"))
    [(level, message)] = doctor.check_evidence_tools()
    assert level == "warn" and "/usr/bin/sample ships with macOS" in message


def test_doctor_on_linux_has_no_launchd_line(record_dir):
    assert doctor.check_service() == []


def _plist(mac: Path) -> Path:
    plist = mac / f"{LABEL}.plist"
    plist.write_bytes(service.render("launchd", executable="/x/mlx-watchdog", config=None,
                                     record_dir="/var/run/mlx-watchdog",
                                     state_dir="/var/db/mlx-watchdog").encode())
    return plist


@pytest.mark.slow
def test_reinstall_waits_for_a_bootout_that_returns_before_the_job_exits(mac, monkeypatch):
    plist = mac / f"{LABEL}.plist"
    assert cli("service", "install", "--launchd", "--path", str(plist), "--load").returncode == 0
    (mac / "launchctl.log").unlink()
    done = cli("service", "install", "--launchd", "--path", str(plist), "--load",
               env_extra={"FAKE_LAUNCHCTL_BOOTOUT_LAG": "2"})
    assert done.returncode == 0, done.stderr
    ran = calls(mac / "launchctl.log")
    # Without the wait, bootstrap would meet the exiting job: "5: Input/output error".
    assert ran[:2] == [["print", TARGET], ["bootout", TARGET]]
    assert ran[2:5] == [["print", TARGET]] * 3 and ran[5:] == [
        ["enable", TARGET], ["bootstrap", "system", str(plist)]]


def test_systemd_uninstall_of_nothing_runs_nothing(mac):
    done = cli("service", "uninstall", "--systemd", "--path", str(mac / "none.service"))
    assert done.returncode == 0 and "no " in done.stdout
    assert calls(mac / "systemctl.log") == []


@pytest.mark.slow
def test_systemd_restart(mac):
    assert cli("service", "restart", "--systemd").returncode == 0
    assert calls(mac / "systemctl.log") == [["restart", "mlx-watchdog.service"]]


@pytest.mark.slow
def test_a_launchctl_that_hangs_or_cannot_run_is_one_error(mac, monkeypatch, tmp_path):
    monkeypatch.setattr(servicectl, "COMMAND_TIMEOUT", 0.5)
    with pytest.raises(service.ServiceError, match=r"sleep 30 did not finish in 0.5s"):
        servicectl.run_command(["sleep", "30"])
    broken = tmp_path / "brokenbin"
    broken.mkdir()
    (broken / "launchctl").write_text("#!/nonexistent/interpreter\n")
    (broken / "launchctl").chmod(0o755)
    monkeypatch.setenv("PATH", str(broken))
    with pytest.raises(service.ServiceError, match="cannot run launchctl"):
        servicectl.run_command(["launchctl", "print", TARGET])


def test_uninstall_not_permitted_says_run_as_root(mac, monkeypatch):
    plist = _plist(mac)

    def refuse(path: str) -> None:
        raise PermissionError(1, "Operation not permitted", path)

    monkeypatch.setattr(service.os, "unlink", refuse)
    with pytest.raises(service.ServiceError, match="not permitted to remove .* run this as root"):
        servicectl.uninstall("launchd", str(plist))
    monkeypatch.setattr(service.os, "unlink",
                        lambda path: (_ for _ in ()).throw(OSError(30, "Read-only file system")))
    with pytest.raises(service.ServiceError, match="Read-only file system"):
        servicectl.uninstall("launchd", str(plist))


@pytest.mark.slow
def test_a_job_that_never_finishes_exiting_is_reported(mac, monkeypatch):
    plist = _plist(mac)
    servicectl.run_command(["launchctl", "bootstrap", "system", str(plist)])
    monkeypatch.setenv("FAKE_LAUNCHCTL_BOOTOUT_LAG", "1000")
    monkeypatch.setattr(servicectl, "shutdown_seconds", lambda: -9)  # give up after 1 s
    with pytest.raises(service.ServiceError, match="was still exiting 1s after bootout"):
        servicectl.load("launchd", str(plist))
    assert ["bootstrap", "system", str(plist)] not in calls(mac / "launchctl.log")[1:]
