"""`mlx-watchdog doctor`: each finding, through run_checks and through the CLI."""

from __future__ import annotations

import os
import socket

import pytest
from click.testing import CliRunner

from watchdog.cli.commands import cli
from watchdog.cli.node import doctor, doctor_env
from watchdog.cli.node.doctor import run_checks
from watchdog.daemon.store import journal
from watchdog.net.http import serve, shut


@pytest.fixture
def good(tmp_path, monkeypatch):
    """A record dir like the service makes (1777), a state dir (755), ranks pointed at it."""
    record = tmp_path / "records"
    state = tmp_path / "state"
    record.mkdir()
    state.mkdir()
    os.chmod(record, 0o1777)
    os.chmod(state, 0o755)
    monkeypatch.setenv("MLX_WATCHDOG_DIR", str(record))
    monkeypatch.delenv("MLX_WATCHDOG_DUMP_SIGNAL", raising=False)
    return record, state


@pytest.fixture
def daemon_http():
    """A real endpoint of the daemon's kind; `health[0]` says what /healthz answers."""
    health = [True]
    server = serve(("127.0.0.1", 0), lambda: {}, lambda: health[0])
    try:
        yield f"127.0.0.1:{server.server_address[1]}", health
    finally:
        shut(server)


def closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def find(lines, level, text):
    return [m for lvl, m in lines if lvl == level and text in m]


@pytest.mark.slow
def test_good_setup_reports_ok(good, daemon_http):
    record, state = good
    listen, _ = daemon_http
    lines = run_checks(str(record), str(state), listen)
    assert all(level in ("ok", "warn", "fail") for level, _ in lines)
    assert not [m for lvl, m in lines if lvl == "fail"], lines
    assert find(lines, "ok", f"record directory {record}: owner uid {os.getuid()}, mode 1777")
    assert find(lines, "ok", f"state directory {state}: owner uid {os.getuid()}, mode 755")
    assert find(lines, "ok", f"the daemon answers at http://{listen}/healthz")
    assert find(lines, "ok", "watchdog.rank.hook imports")
    assert find(lines, "ok", "mlx 0.")
    assert find(lines, "ok", "no foreign 'watchdog' package")
    assert find(lines, "ok", "ranks dump their Python stacks on SIGUSR2")
    assert find(lines, "ok", "platform probes")
    assert find(lines, "ok", "no reboot flag")


@pytest.mark.slow
def test_good_setup_through_the_cli_exits_0(good, daemon_http):
    record, state = good
    listen, _ = daemon_http
    result = CliRunner().invoke(cli, ["doctor", "--dir", str(record), "--state-dir", str(state),
                                      "--listen", listen])
    assert result.exit_code == 0, result.output
    assert "[OK  ] record directory" in result.output
    assert "[FAIL]" not in result.output


@pytest.mark.slow
def test_world_writable_record_dir_without_sticky_bit_fails_with_the_chmod(good, daemon_http):
    record, state = good
    os.chmod(record, 0o777)
    lines = run_checks(str(record), str(state), daemon_http[0])
    assert find(lines, "fail", f"run: chmod 1777 {record}"), lines
    result = CliRunner().invoke(cli, ["doctor", "--dir", str(record), "--state-dir", str(state),
                                      "--listen", daemon_http[0]])
    assert result.exit_code == 1
    assert f"[FAIL] record directory {record} is writable by others without the sticky bit" \
        in result.output


@pytest.mark.slow
def test_missing_record_dir_fails(good, daemon_http):
    record, state = good
    missing = record.parent / "nowhere"
    lines = run_checks(str(missing), str(state), daemon_http[0])
    assert find(lines, "fail", f"record directory {missing} does not exist"), lines
    assert find(lines, "fail", f"mkdir -m 1777 {missing}"), lines
    assert find(lines, "warn", "ranks started from this environment publish to"), lines


@pytest.mark.slow
def test_missing_state_dir_fails(good, daemon_http):
    record, state = good
    state.rmdir()
    result = CliRunner().invoke(cli, ["doctor", "--dir", str(record), "--state-dir", str(state),
                                      "--listen", daemon_http[0]])
    assert result.exit_code == 1, result.output
    assert f"[FAIL] state directory {state} does not exist" in result.output


@pytest.mark.slow
def test_group_writable_state_dir_fails(good, daemon_http):
    record, state = good
    os.chmod(state, 0o775)
    lines = run_checks(str(record), str(state), daemon_http[0])
    assert find(lines, "fail", f"run: chmod 755 {state}"), lines


@pytest.mark.slow
def test_reboot_flag_fails_with_the_clear_command(good, daemon_http):
    record, state = good
    journal.set_reboot_flag(str(state), "wired memory stayed above the baseline after the kill")
    result = CliRunner().invoke(cli, ["doctor", "--dir", str(record), "--state-dir", str(state),
                                      "--listen", daemon_http[0]])
    assert result.exit_code == 1, result.output
    line = next(ln for ln in result.output.splitlines() if "flagged for reboot" in ln)
    assert line.startswith("[FAIL]")
    assert "wired memory stayed above the baseline" in line
    assert f"mlx-watchdog node clear-reboot --state-dir {state}" in line


def test_no_daemon_is_a_warning(good):
    record, state = good
    listen = closed_port()
    lines = run_checks(str(record), str(state), listen)
    assert find(lines, "warn", f"no daemon answers at http://{listen}/healthz"), lines
    assert not [m for lvl, m in lines if lvl == "fail"], lines
    result = CliRunner().invoke(cli, ["doctor", "--dir", str(record), "--state-dir", str(state),
                                      "--listen", listen])
    assert result.exit_code == 0, result.output  # warnings alone do not fail


@pytest.mark.slow
def test_daemon_not_scanning_fails(good, daemon_http):
    record, state = good
    listen, health = daemon_http
    health[0] = False
    lines = run_checks(str(record), str(state), listen)
    assert find(lines, "fail", "has not completed a scan recently"), lines


def test_bad_listen_address_fails(good):
    record, state = good
    lines = run_checks(str(record), str(state), "nonsense")
    assert find(lines, "fail", "--listen: listen must be HOST:PORT"), lines


@pytest.mark.slow
def test_foreign_watchdog_distribution_is_named_with_the_fix(good, daemon_http, monkeypatch):
    record, state = good
    real = doctor_env.metadata.distribution

    class Foreign:
        version = "4.0.1"

    def distribution(name):
        return Foreign() if name == "watchdog" else real(name)

    monkeypatch.setattr(doctor_env.metadata, "distribution", distribution)
    lines = run_checks(str(record), str(state), daemon_http[0])
    found = find(lines, "fail", "the PyPI package 'watchdog' 4.0.1 (filesystem events")
    assert found, lines
    assert "pip uninstall -y watchdog && pip install --force-reinstall mlx-watchdog" in found[0]


@pytest.mark.slow
def test_dump_signal_setting(good, daemon_http, monkeypatch):
    record, state = good
    monkeypatch.setenv("MLX_WATCHDOG_DUMP_SIGNAL", "USR1")
    lines = run_checks(str(record), str(state), daemon_http[0])
    assert find(lines, "ok", "on SIGUSR1 (MLX_WATCHDOG_DUMP_SIGNAL)"), lines
    monkeypatch.setenv("MLX_WATCHDOG_DUMP_SIGNAL", "0")
    assert find(run_checks(str(record), str(state), daemon_http[0]), "warn",
                "stack dumps are off")
    monkeypatch.setenv("MLX_WATCHDOG_DUMP_SIGNAL", "SIGNOPE")
    assert find(run_checks(str(record), str(state), daemon_http[0]), "fail",
                "'SIGNOPE' is not a signal")
    monkeypatch.setenv("MLX_WATCHDOG_DUMP_SIGNAL", "SIGINT")
    assert find(run_checks(str(record), str(state), daemon_http[0]), "warn",
                "which the daemon never sends")


@pytest.mark.slow
def test_a_broken_check_is_a_failure_line_not_a_traceback(good, daemon_http, monkeypatch):
    record, state = good

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(doctor, "check_probes", broken)
    lines = run_checks(str(record), str(state), daemon_http[0])
    assert find(lines, "fail", "the platform probes check itself failed: RuntimeError('boom')")
    assert find(lines, "ok", "no reboot flag")  # the checks after it still ran


@pytest.mark.slow
def test_foreign_files_mixed_into_the_package_are_reported(good, daemon_http, monkeypatch):
    record, state = good
    real = doctor_env.importlib.util.find_spec

    def find_spec(name, *args):
        return object() if name == "watchdog.observers" else real(name, *args)

    monkeypatch.setattr(doctor_env.importlib.util, "find_spec", find_spec)
    lines = run_checks(str(record), str(state), daemon_http[0])
    assert find(lines, "fail", "/observers exists: files of the filesystem-events"), lines


def test_doctor_does_not_call_a_missing_state_directory_unflagged(tmp_path):
    lines = doctor.check_reboot_flag(str(tmp_path / "nowhere"))
    assert [level for level, _ in lines] == [doctor.WARN]
    assert "no reboot flag" not in lines[0][1] and "does not exist" in lines[0][1]
    assert doctor.check_reboot_flag(str(tmp_path))[0][0] == doctor.OK


def test_doctor_compares_the_installed_pth_with_the_one_this_version_ships(tmp_path,
                                                                          monkeypatch):
    from pathlib import Path

    import watchdog
    from watchdog.cli.node import doctor_env

    shipped = (Path(watchdog.__file__).parent / "_pth" / doctor_env.PTH).read_bytes()
    monkeypatch.setattr(doctor_env, "_site_dirs", lambda: [str(tmp_path)])
    (tmp_path / doctor_env.PTH).write_bytes(shipped)
    ((level, line),) = doctor_env.check_pth()
    assert level == doctor_env.OK and "present" in line
    (tmp_path / doctor_env.PTH).write_bytes(shipped + b"# an older hook\n")
    ((level, line),) = doctor_env.check_pth()
    assert level == doctor_env.WARN and "differs from this version's hook" in line


def _config(tmp_path, record, state, listen, *extra):
    path = tmp_path / "mlx-watchdog.toml"
    path.write_text("\n".join([f'dir = "{record}"', f'state_dir = "{state}"',
                               f'listen = "{listen}"', *extra]) + "\n")
    return path


def test_a_daemon_down_under_a_config_fails(good, tmp_path):
    """A node whose config says it runs a daemon, none answering: exit 1, `ok: false`
    (a rolling upgrade waits for doctor; a daemon that did not come back must fail it)."""
    import json

    record, state = good
    listen = closed_port()
    config = _config(tmp_path, record, state, listen)
    result = CliRunner().invoke(cli, ["--config", str(config), "doctor", "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["ok"] is False
    (daemon,) = [c for c in report["checks"] if c["check"] == "daemon"]
    assert daemon["level"] == "fail"
    assert f"yet this node has a config file ({config})" in daemon["message"]
    assert "start it:" in daemon["message"]


@pytest.mark.parametrize("bad, said", [
    ('secret = "REPLACE-with-a-long-random-string"', "placeholder"),
    ('dedline = 10', "unknown setting 'dedline'; did you mean deadline?"),
    ('mode = "enforcing"', "mode"),
])
def test_a_bad_config_is_one_failed_check_and_the_rest_run(good, tmp_path, daemon_http, bad,
                                                           said):
    """doctor --json on a bad config: valid JSON, the config's fault one failed check
    naming the file, every other check run (with the file's good keys)."""
    import json

    record, state = good
    listen, _ = daemon_http
    config = _config(tmp_path, record, state, listen, bad)
    result = CliRunner().invoke(cli, ["--config", str(config), "doctor", "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    failed = [c for c in report["checks"] if c["level"] == "fail"]
    assert [c["check"] for c in failed] == ["config"], failed
    assert f"config file {config}" in failed[0]["message"] and said in failed[0]["message"]
    assert "fix it, then run doctor again" in failed[0]["message"]
    # The rest ran, with the file's good keys: its directories and its daemon.
    checks = {c["check"] for c in report["checks"]}
    assert {"record directory", "state directory", "daemon", "instrumentation"} <= checks
    assert any(str(record) in c["message"] for c in report["checks"]
               if c["check"] == "record directory")


def test_a_daemon_watching_other_directories_is_one_cause_not_three():
    """Issue 56: a daemon given other directories than the config names failed doctor
    three times (the config's record and state directories missing, then the mismatch):
    the directories missing follow from the mismatch, said so, not failed again."""
    from watchdog.cli.node.doctor import _one_cause
    from watchdog.cli.node.doctor_env import FAIL, OK, WARN

    lines = [("record directory", FAIL, "record directory /r does not exist: ..."),
             ("state directory", FAIL, "state directory /s does not exist: ..."),
             ("daemon", OK, "the daemon answers"),
             ("daemon's directories", FAIL, "the daemon watches records in /x ..."),
             ("reboot flag", WARN, "cannot tell ...: the state directory /s does not exist")]
    shown = _one_cause(lines)
    assert [level for _, level, _ in shown] == [WARN, WARN, OK, FAIL, WARN]
    assert all(m.endswith("(follows from the daemon's directories: one cause)")
               for n, _, m in shown if n != "daemon" and n != "daemon's directories")
    alone = [("record directory", FAIL, "record directory /r does not exist: ...")]
    assert _one_cause(alone) == alone  # with no other cause it is the cause
