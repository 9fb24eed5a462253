"""The command line's own contract, through CliRunner and as real processes: no ranks,
the node's config file, a flag that overrides the file's deadline, every bad option value
one line on stderr and a non-zero exit (never a traceback), typed options with units.
tests/ranks/cli/test_status.py reads a real job with them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner

from tests.support.ranks import REPO, base_env, wait_for
from watchdog.cli.commands import cli
from watchdog.daemon.store import journal

CLEAR = "\x1b[H\x1b[2J"


def invoke(args: list[str], **kwargs):
    result = CliRunner().invoke(cli, [str(a) for a in args], **kwargs)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.output, result.exception)
    return result


def run_cli(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "watchdog.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=base_env("/nonexistent-default-dir"))


@pytest.mark.slow
def test_no_ranks(tmp_path, record_dir, state_dir):
    dirs = ["--dir", record_dir, "--state-dir", state_dir]
    result = invoke(["status", *dirs])
    assert result.exit_code == 0 and "no ranks in" in result.stdout
    result = invoke(["status", "--json", "--check", *dirs])
    assert result.exit_code == 0 and json.loads(result.stdout) == []
    result = invoke(["incidents", "--state-dir", state_dir])
    assert result.exit_code == 0 and "no incidents" in result.stdout
    result = invoke(["incidents", "--json", "--last", 3, "--state-dir", state_dir])
    assert result.exit_code == 0 and json.loads(result.stdout) == []
    result = invoke(["watch", "--count", 1, *dirs], color=True)
    assert result.exit_code == 0 and result.stdout.count(CLEAR) == 1
    assert "no ranks in" in result.stdout


# -- bad option values ----------------------------------------------------------------


def bad_values(tmp_path, busy_port: int) -> list[list[str]]:
    d = str(tmp_path / "rec")
    s = str(tmp_path / "state")
    # Every `run` case names safe directories and an ephemeral port, so a value
    # wrongly accepted cannot touch the system's directories or default port.
    safe = ["--dir", d, "--state-dir", s, "--listen", "127.0.0.1:0"]
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("interval = [unclosed\n")
    unknown_key = tmp_path / "unknown.toml"
    unknown_key.write_text("[watchdog]\nintervall = 2\n")
    run = [
        ["--interval", "-1"], ["--interval", "0"], ["--interval", "abc"],
        ["--deadline", "soon"], ["--deadline", "0"], ["--deadline", "-3"],
        ["--auto-factor", "inf"], ["--auto-floor", "0"], ["--auto-min-waits", "1.5"],
        ["--auto-fallback", "x"], ["--init-deadline", "-1"], ["--blocked-deadline", "nan"],
        ["--spin-ratio", "2"], ["--confirm", "0"], ["--confirm", "1.5"],
        ["--mode", "kill"], ["--kill-scope", "node"], ["--grace", "nan"],
        ["--kill-timeout", "0"], ["--evidence-timeout", "x"], ["--wired-threshold", "lots"],
        ["--settle", "x"], ["--retention", "-1"], ["--peers", "nope"],
        ["--peer-timeout", "0"], ["--secret", "short"], ["--log-level", "loud"],
        ["--config", "/nonexistent.toml"], ["--config", str(bad_toml)],
        ["--config", str(unknown_key)],
    ]
    cases = [["run", *safe, *extra] for extra in run]
    cases += [
        ["run", "--dir", d, "--state-dir", s, "--listen", "nope"],
        ["run", "--dir", d, "--state-dir", s, "--listen", "127.0.0.1:99999"],
        ["run", "--dir", d, "--state-dir", s, "--listen", f"127.0.0.1:{busy_port}"],
        ["run", "--dir", "/proc/nope/x", "--state-dir", s, "--listen", "127.0.0.1:0"],
        ["run", "--dir", d, "--state-dir", "/proc/nope", "--listen", "127.0.0.1:0"],
        ["status", "--dir", "/nonexistent"],
        ["status", "--dir", d, "--state-dir", s, "--deadline", "soon"],
        ["status", "--dir", d, "--state-dir", s, "--deadline", "0"],
        ["watch", "--dir", "/nonexistent", "--count", "1"],
        ["watch", "--interval", "0"], ["watch", "--interval", "x"], ["watch", "--count", "0"],
        ["inspect", "notapid"], ["inspect", "0"], ["inspect", "-5"],
        ["inspect", "999999999", "--dir", d], ["inspect", "1", "--dir", "/nonexistent"],
        ["incidents", "--last", "0"], ["incidents", "--last", "x"],
        ["incidents", "--state-dir", "/nonexistent"],
        ["node", "status", "--state-dir", "/nonexistent"],
        ["node", "clear-reboot", "--state-dir", "/nonexistent"],
        ["demo", "--ranks", "1"], ["demo", "--deadline", "0"], ["demo", "--fault", "x"],
        ["service", "print", "--launchd", "--systemd"],
        ["service", "install", "--systemd", "--path", "/proc/nope/x"],
        ["cluster", "status", "nope"], ["cluster", "status", "--timeout", "0", "127.0.0.1:1"],
        ["nosuchcommand"], ["status", "--nosuchoption"], ["status", "extra-argument"],
    ]
    return cases


@pytest.mark.slow
def test_a_daemon_that_cannot_start_says_one_line_even_after_raising_its_limits(tmp_path):
    """Started with a soft descriptor limit below the hard one (a login shell's 1024),
    the daemon raises it; a start that then fails (the port is taken) still says only
    why, the raise being logged once the daemon runs."""
    import resource

    (tmp_path / "rec").mkdir()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    soft = 256 if hard == resource.RLIM_INFINITY else min(256, hard // 2)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "watchdog.cli", "run", "--dir", str(tmp_path / "rec"),
             "--state-dir", str(tmp_path / "state"),
             "--listen", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
            env=base_env("/nonexistent-default-dir"),
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    finally:
        busy.close()
    assert proc.returncode != 0
    assert proc.stderr.splitlines() == [
        f"mlx-watchdog: cannot listen on 127.0.0.1:{port}: Address already in use: another "
        f"program holds port {port} (find it: lsof -i :{port}, or ss -ltnp); pass --listen "
        "another port"], proc.stderr


@pytest.mark.slow
def test_every_bad_option_value_is_one_line_and_a_nonzero_exit(tmp_path):
    (tmp_path / "rec").mkdir()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        cases = bad_values(tmp_path, busy.getsockname()[1])

        def attempt(args: list[str]) -> tuple[list[str], int | str, str, str]:
            try:
                proc = run_cli(args, timeout=30)
            except subprocess.TimeoutExpired:  # e.g. a daemon that started after all
                return args, "still running after 30 s", "", ""
            return args, proc.returncode, proc.stdout, proc.stderr

        with ThreadPoolExecutor(max_workers=4) as pool:
            outcomes = list(pool.map(attempt, cases))
    finally:
        busy.close()
    failures = []
    for args, code, out, err in outcomes:
        lines = err.splitlines()
        problems = []
        if code == 0 or isinstance(code, str):
            problems.append(f"exit {code}")
        if len(lines) != 1:
            problems.append(f"{len(lines)} stderr lines")
        elif not lines[0].startswith("mlx-watchdog: "):
            problems.append("stderr line does not start with 'mlx-watchdog: '")
        if "Traceback" in out + err:
            problems.append("a traceback")
        if problems:
            failures.append(f"{' '.join(args)}: {', '.join(problems)}\n"
                            f"    stderr: {err.strip()[-300:]!r}\n    stdout: {out[:200]!r}")
    assert not failures, f"{len(failures)} of {len(cases)} bad values:\n" + "\n".join(failures)


@pytest.mark.slow
def test_options_are_typed_with_units_and_complete_in_the_shell():
    help_text = invoke(["run", "--help"]).stdout
    for shown in ("--interval SECONDS", "--deadline SECONDS|AUTO", "--confirm COUNT",
                  "--spin-ratio RATIO", "--wired-threshold BYTES", "--listen HOST:PORT",
                  "--mode ENFORCE|OBSERVE", "--kill-scope JOB|RANK"):
        assert shown in " ".join(help_text.split()), shown
    # A flag is checked by the setting's own rule, as the file's value is.
    # Said of the flag the user typed, not of the config file's key.
    for args, message in ((["--interval", "0"], "'--interval': must be > 0"),
                          (["--spin-ratio", "1.5"], "'--spin-ratio': must be <= 1"),
                          (["--confirm", "0"], "'--confirm': must be >= 1"),
                          (["--peers", "a:1,b"], "'--peers': must be HOST:PORT")):
        proc = run_cli(["run", *args])
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    env = {**base_env("/nonexistent"), "_MLX_WATCHDOG_COMPLETE": "bash_complete",
           "COMP_WORDS": "mlx-watchdog run --mode ", "COMP_CWORD": "3"}
    done = subprocess.run([sys.executable, "-m", "watchdog.cli"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["plain,enforce", "plain,observe"], done


@pytest.mark.slow
def test_a_flag_given_as_auto_overrides_the_files_deadline(tmp_path, record_dir, state_dir):
    config = tmp_path / "watchdog.toml"
    config.write_text("[watchdog]\ndeadline = 30\nlisten = \"127.0.0.1:0\"\n")
    argv = [sys.executable, "-m", "watchdog.cli", "run", "--config", config, "--dir",
            record_dir, "--state-dir", state_dir]
    for extra, shown in (([], "deadline 30"), (["--deadline", "auto"], "deadline auto")):
        proc = subprocess.Popen([*map(str, argv), *extra], stderr=subprocess.PIPE, text=True,
                                cwd=REPO, env=base_env(record_dir))
        try:
            assert proc.stderr is not None
            line = ""
            deadline = time.monotonic() + 60
            while "watching" not in line and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line:
                    break
            assert shown in line, line
            # The running daemon says, in the directory, that it watches it...
            wait_for(lambda: (record_dir / journal.POINTER).exists(), 30, what="the pointer")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        # ...and takes that back when it stops.
        assert not (record_dir / journal.POINTER).exists()


@pytest.mark.slow
def test_the_nodes_config_file_gives_every_command_its_directories(tmp_path, record_dir,
                                                                   state_dir):
    config = tmp_path / "node.toml"
    config.write_text(f'[watchdog]\ndir = "{record_dir}"\nstate_dir = "{state_dir}"\n')
    env = {k: v for k, v in base_env("unused").items() if not k.startswith("MLX_")}
    for argv, extra in ((["--config", config], {}), ([], {"MLX_WATCHDOG_CONFIG": str(config)})):
        done = subprocess.run([sys.executable, "-m", "watchdog.cli", *map(str, argv), "status"],
                              env={**env, **extra}, cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0 and f"no ranks in {record_dir}" in done.stdout, done
        done = subprocess.run([sys.executable, "-m", "watchdog.cli", *map(str, argv),
                               "incidents"], env={**env, **extra}, cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "no incidents" in done.stdout, done
    # A flag still wins over the file.
    other = tmp_path / "other"
    other.mkdir()
    result = invoke(["--config", config, "status", "--dir", other])
    assert f"no ranks in {other}" in result.stdout, result.output
    # A config file named on purpose must be usable: one line, exit 2.
    config.write_text("dir = [\n")
    done = subprocess.run([sys.executable, "-m", "watchdog.cli", "--config", str(config),
                           "status"], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "not valid TOML" in done.stderr, done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
