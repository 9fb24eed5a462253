"""An operator's first week (issue 28), as real processes: `run` honours the node's
config file, one daemon per directory, a daemon that cannot keep its state refuses to
start (and `doctor` says so), a non-UTF-8 config is one line, SIGHUP reloads, and exit
codes a script can trust (a setup or usage error never shares a code with a verdict).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.ranks import REPO, base_env, wait_for
from tests.support.users import OTHER_UID, become
from watchdog.cli.commands import cli
from watchdog.daemon.store import journal

# No MLX_WATCHDOG_* variable: the config file's directories are the ones used.
NO_MLX_ENV = {k: v for k, v in base_env("unused").items() if not k.startswith("MLX_")}


def cli_proc(args: list[object], env: dict[str, str] | None = None, timeout: float = 60,
             **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "watchdog.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env or base_env("/nonexistent-default-dir"), **kwargs)


class Daemon:
    """`mlx-watchdog ARGS` (a `run`) with its stderr in a file, read as it grows."""

    def __init__(self, tmp_path: Path, args: list[object], env: dict[str, str] | None = None):
        self.log_path = tmp_path / f"daemon-{len(list(tmp_path.glob('daemon-*')))}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "watchdog.cli", *map(str, args)], stdout=log,
                stderr=subprocess.STDOUT, cwd=REPO,
                env=env or NO_MLX_ENV)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 60) -> str:
        def seen() -> str:
            if self.proc.poll() is not None and text not in self.log():
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
            return self.log() if text in self.log() else ""
        return wait_for(seen, timeout, what=repr(text))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=30)


def config(path: Path, tmp_path: Path, **keys: object) -> Path:
    values = {"dir": str(tmp_path / "rec"), "state_dir": str(tmp_path / "state"),
              "listen": "127.0.0.1:0", **keys}
    path.write_text("[watchdog]\n" + "".join(f"{k} = {json.dumps(v)}\n"
                                             for k, v in values.items()))
    return path


# -- 1. `run` reads the node's config, as every command does ------------------------------


@pytest.mark.slow
def test_run_reads_the_config_given_to_the_group_as_every_command_does(tmp_path):
    cfg = config(tmp_path / "obs.toml", tmp_path, mode="observe", deadline="45s",
                 peers=["10.0.0.2:9753"])
    daemon = Daemon(tmp_path, ["--config", cfg, "run"])
    try:
        log = daemon.wait_log("watching")
    finally:
        assert daemon.stop() == 0
    assert f"settings from {cfg}" in log, log
    # 7. The start says whether peers and fences are on, and that no peer can reach a
    # loopback listen address.
    assert "INFO peers 10.0.0.2:9753 (timeout 1s); fences off (no secret)" in log, log
    assert ("WARNING listen 127.0.0.1:0 is loopback but peers are configured: no peer can "
            "reach this node") in log, log
    watching = next(line for line in log.splitlines() if "watching" in line)
    assert f"watching {tmp_path / 'rec'} " in watching and "mode observe" in watching, log
    assert "deadline 45" in watching, watching


# -- 2. a config file that is not UTF-8 -----------------------------------------------------


@pytest.mark.slow
def test_a_config_file_that_is_not_utf8_is_one_line_and_a_usage_exit(tmp_path):
    cfg = tmp_path / "latin1.toml"
    cfg.write_bytes(b'[watchdog]\nmode = "observ\xe9"\n')
    for args in (["run", "--config", cfg, "--listen", "127.0.0.1:0"],
                 ["--config", cfg, "status"]):
        done = cli_proc(args)
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert done.stderr.splitlines() == [
            f"mlx-watchdog: config file {cfg} is not UTF-8 text (byte 25: b'\\xe9')"], done.stderr


# -- 3. one daemon per directory ------------------------------------------------------------


@pytest.mark.slow
def test_a_second_daemon_on_the_same_directories_refuses_naming_the_first(tmp_path):
    rec, state = tmp_path / "rec", tmp_path / "state"
    first = Daemon(tmp_path, ["run", "--dir", rec, "--state-dir", state,
                              "--listen", "127.0.0.1:0"])
    try:
        first.wait_log("watching")
        pointer = json.loads((rec / journal.POINTER).read_text())
        assert pointer["daemon_pid"] == first.proc.pid
        # The same state directory (another port): refused, one line naming the first.
        same = cli_proc(["run", "--dir", rec, "--state-dir", state, "--listen", "127.0.0.1:0"])
        assert same.returncode == 3, same
        stop = (f"stop it first (sudo systemctl stop mlx-watchdog if it is the service, "
                f"else kill {first.proc.pid})")
        assert same.stderr.splitlines() == [
            f"mlx-watchdog: another daemon (pid {first.proc.pid}) already uses state "
            f"directory {state}: {stop}, or give this one another --state-dir"], same.stderr
        # Another state directory, the same record directory: refused too, and the
        # directories the refused start made (parents too) are gone again.
        other = cli_proc(["run", "--dir", rec, "--state-dir", tmp_path / "new" / "state2",
                          "--listen", "127.0.0.1:0"])
        assert other.returncode == 3, other
        assert other.stderr.splitlines() == [
            f"mlx-watchdog: another daemon (pid {first.proc.pid}) already watches {rec} "
            f"(its state directory is {state}): {stop}"], other.stderr
        assert not (tmp_path / "new").exists()
        # Refused for a port in use: nothing left behind either.
        served = re.search(r"serving \S+ \S+ \S+ on http://(\S+)", first.log())
        assert served, first.log()
        busy = cli_proc(["run", "--dir", tmp_path / "r3", "--state-dir", tmp_path / "s3",
                         "--listen", served.group(1)])
        assert busy.returncode == 3 and busy.stderr.splitlines() == [
            f"mlx-watchdog: cannot listen on {served.group(1)}: Address already in use: an "
            f"mlx-watchdog daemon (pid {first.proc.pid}, state directory {state}) already "
            f"listens there: {stop}, or pass --listen another port"], busy.stderr
        assert not (tmp_path / "r3").exists() and not (tmp_path / "s3").exists()
        # The refused ones took nothing away: the first is still the one `status` finds.
        assert json.loads((rec / journal.POINTER).read_text())["daemon_pid"] == first.proc.pid
        shown = cli_proc(["status", "--dir", rec, "--state-dir", state])
        assert shown.returncode == 0 and "no daemon" not in shown.stdout + shown.stderr, shown
    finally:
        assert first.stop() == 0
    # Once it has stopped, its directories are free again (a lock, not a stale file).
    again = Daemon(tmp_path, ["run", "--dir", rec, "--state-dir", state,
                              "--listen", "127.0.0.1:0"])
    try:
        again.wait_log("watching")
    finally:
        assert again.stop() == 0


# -- 4. a non-root daemon that cannot write its state directory ---------------------------


def as_other_user(argv: list[object]) -> tuple[int, str]:
    """`mlx-watchdog ARGV` in a forked child of uid 65534: (exit code, stdout + stderr).

    Forked, not exec'd: this Python lives under /root, which that user cannot
    read; what the command imports later is imported here first."""
    import fcntl  # noqa: F401 - the lock, imported before the drop
    import resource  # noqa: F401 - the daemon's descriptor limit

    import watchdog.cli.node.doctor
    import watchdog.cli.node.doctor_env
    import watchdog.daemon.runner  # noqa: F401
    from watchdog.cli.commands import main

    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 70
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - not pytest's capture
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                become(OTHER_UID)
                try:
                    main([str(a) for a in argv])
                except SystemExit as done:
                    code = done.code if isinstance(done.code, int) else 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        return os.waitstatus_to_exitcode(status), out.read().decode(errors="replace")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_a_daemon_that_cannot_write_its_state_refuses_and_doctor_says_why():
    top = Path(tempfile.mkdtemp(prefix="mlx-wd-i28-"))
    try:
        top.chmod(0o755)  # reachable by uid 65534; the state directory stays root's 755
        rec, state = top / "rec", top / "state"
        rec.mkdir()
        rec.chmod(0o1777)
        state.mkdir(mode=0o755)
        code, said = as_other_user(["run", "--dir", rec, "--state-dir", state,
                                    "--listen", "127.0.0.1:0"])
        assert code == 3, said
        assert said.splitlines() == [
            f"mlx-watchdog: cannot write in state directory {state} (uid {OTHER_UID}): run "
            "as root, or pass --state-dir a directory this user owns"], said
        code, said = as_other_user(["doctor", "--dir", rec, "--state-dir", state,
                                    "--listen", "127.0.0.1:1"])
        assert code == 1, said
        assert (f"[FAIL] this user (uid {OTHER_UID}) cannot write in {state} and no daemon "
                "publishes there") in said, said
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)


# -- 5. exit codes: a usage or setup error never shares a code with a verdict --------------


def test_setup_and_usage_errors_never_share_a_verdicts_code(tmp_path):
    missing = tmp_path / "missing"
    runner = CliRunner()
    for args, code, said in (
            (["status", "--check", "--dir", missing, "--state-dir", missing], 3,
             f"record directory {missing} does not exist"),
            (["node", "status", "--state-dir", missing], 3,
             f"state directory {missing} does not exist"),
            (["node", "wait-healthy", "--timeout", "0", "--state-dir", missing], 3,
             f"state directory {missing} does not exist"),
            (["cluster", "status", "notahostport"], 2, "'notahostport' is not HOST:PORT"),
            (["run", "--grace", "ten"], 2, "'--grace': must be a number (e.g. 10 or 10s")):
        result = runner.invoke(cli, [str(a) for a in args])
        assert result.exit_code == code, (args, result.exit_code, result.output)
        assert said in result.output, (args, result.output)
        assert "node fit" not in result.output and "listen must be" not in result.output


def test_durations_and_sizes_accept_units():
    from watchdog.daemon.config import build

    settings = build({"grace": "10s", "settle": "2m", "deadline": "1m30s",
                      "evidence_timeout": "500ms"}, {"wired_threshold": "1G"})
    assert (settings.grace, settings.settle, settings.deadline) == (10, 120, 90)
    assert settings.evidence_timeout == 0.5 and settings.wired_threshold == 1 << 30
    assert build({"wired_threshold": "512MiB"}, {}).wired_threshold == 512 << 20


# -- 6. SIGHUP reloads what can change without a restart -----------------------------------


@pytest.mark.slow
def test_sighup_reloads_mode_deadlines_peers_and_secret_and_logs_what_changed(tmp_path):
    cfg = config(tmp_path / "node.toml", tmp_path, mode="observe")
    daemon = Daemon(tmp_path, ["run", "--config", cfg])
    state = tmp_path / "state"
    try:
        daemon.wait_log("watching")
        wait_for(lambda: (state / journal.STATUS).exists(), 30, what="status.json")
        assert json.loads((state / journal.STATUS).read_text())["mode"] == "observe"
        config(cfg, tmp_path, mode="enforce", deadline="30s", peers=["127.0.0.2:9753"],
               secret="s" * 24, listen="127.0.0.1:1")
        daemon.proc.send_signal(signal.SIGHUP)
        log = daemon.wait_log("SIGHUP: reloaded")
        reloaded = next(line for line in log.splitlines() if "SIGHUP: reloaded" in line)
        for change in ("mode observe -> enforce", "deadline auto -> 30s",
                       "peers none -> 127.0.0.2:9753", "secret unset -> set"):
            assert change in reloaded, reloaded
        assert (f"SIGHUP: reloaded {cfg}, the rest applied: needs a restart, kept as running: "
                "listen 127.0.0.1:0 -> ") in log, log
        # Never "nothing changed" beside what was kept (issue 56): one story.
        assert "nothing changed" not in log, log
        # Issue 38, item 3: the file now holds the secret at mode 644.
        daemon.wait_log(f"WARNING config file {cfg} holds the fence secret and its group "
                        "and everyone may read it (mode 644)")
        wait_for(lambda: json.loads((state / journal.STATUS).read_text()).get("mode")
                 == "enforce", 30, what="the snapshot in enforce mode")
        # A file broken meanwhile: one line, and the running settings are kept.
        cfg.write_text("mode = [\n")
        daemon.proc.send_signal(signal.SIGHUP)
        log = daemon.wait_log("the running settings are kept")
        assert daemon.proc.poll() is None, log
        assert json.loads((state / journal.STATUS).read_text())["mode"] == "enforce"
        # The file as applied, but its listen: only what needs a restart differs.
        config(cfg, tmp_path, mode="enforce", deadline="30s", peers=["127.0.0.2:9753"],
               secret="s" * 24, listen="127.0.0.1:1")
        daemon.proc.send_signal(signal.SIGHUP)
        log = daemon.wait_log("nothing else changed: needs a restart")
        assert "nothing changed" not in log, log
    finally:
        assert daemon.stop() == 0
    assert not (tmp_path / "rec" / journal.POINTER).exists()


# -- 8, 9, 10: what a person types -----------------------------------------------------------


def test_help_units_and_errors_speak_of_what_was_typed(tmp_path):
    runner = CliRunner()
    for args, shown in ((["inspect", "--help"], "--json One JSON object"),
                        (["incidents", "--help"], "--json One JSON list"),
                        (["node", "status", "--help"], "--json One JSON object"),
                        (["cluster", "status", "--help"], "--json The nodes and the judged"),
                        (["doctor", "--help"], "Where the daemon serves /healthz"),
                        (["demo", "--help"], "Ranks of the local MLX ring job"),
                        (["run", "--help"], "learn it per job and kind of wait")):
        out = " ".join(runner.invoke(cli, args).output.split())
        assert shown in out, (args, out)
    # The metavar says ENFORCE|OBSERVE: so typed, it is taken.
    from watchdog.daemon.config import coerce

    assert coerce("mode", "ENFORCE") == "enforce" and coerce("kill_scope", "Rank") == "rank"
    # A flag's error names the flag, not the config file's key.
    result = runner.invoke(cli, ["run", "--grace", "0"])
    assert result.exit_code == 2 and "'--grace': must be > 0" in result.output, result.output


def test_launch_with_nothing_to_launch_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli, ["launch", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "nothing to launch" in result.output and "attempt" not in result.output
    assert not (tmp_path / "launches.jsonl").exists()  # no failed attempt journalled


@pytest.mark.slow
def test_service_install_checks_the_config_file_it_names(tmp_path):
    unit = tmp_path / "mlx-watchdog.service"
    missing = tmp_path / "nonexistent.toml"
    result = CliRunner().invoke(cli, ["service", "install", "--systemd", "--path", str(unit),
                                      "--config", str(missing)])
    assert result.exit_code == 3, result.output
    assert f"config file {missing} does not exist" in result.output
    assert not unit.exists()
    bad = tmp_path / "bad.toml"
    bad.write_text('mode = "enforcing"\n')
    done = cli_proc(["service", "install", "--systemd", "--path", unit, "--config", bad])
    # Byte for byte, the file named: the operator's next step is to edit it.
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"mlx-watchdog: config file {bad}: mode must be 'enforce' or 'observe', "
        "got 'enforcing'"], done.stderr
    assert not unit.exists()


# -- 11. the demo's story matches its own lines ---------------------------------------------


@pytest.mark.slow
def test_the_demo_never_promises_a_cpu_figure_its_lines_may_contradict():
    """The verdict reads what a thread wants (demand); the lines show the share it got,
    which on a loaded machine is far below a core: the story must not say ~100%."""
    import shutil

    from watchdog.cli.demo.job import _Rank
    from watchdog.cli.demo.story import Demo
    from watchdog.status import RankStatus

    told: list[str] = []
    demo = Demo(ranks=2, deadline=4, fault="stop", echo=told.append)
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        demo.ranks = [_Rank(n, p, "") for n, p in enumerate(sleepers)]
        demo.inject(demo_result())
        seen = {0: RankStatus(job="demo", pid=sleepers[0].pid, rank=0, state="stalled",
                              phase="wait", seconds_in_wait=6.0, current_op="eval (all_sum #9)",
                              busiest_thread_cpu=0.0)}
        told.append(demo.state_line(seen))
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        shutil.rmtree(demo.tmp, ignore_errors=True)
    story = " ".join(" ".join(told).split())
    assert "100%" not in story, story
    assert "wants a whole core" in story and "busiest thread got 0% of a core" in story, story


def demo_result():
    from watchdog.cli.demo.story import _Result

    return _Result()


# -- 14. doctor in a job's environment: its hook against the daemon's version ----------------


@pytest.mark.parametrize("daemon_version, level, said", [
    ("999.0.0", "warn", "is older than the daemon's 999.0.0"),
    ("0.0.1", "fail", "is newer than the daemon's 0.0.1: the daemon may not read"),
])
def test_doctor_compares_this_environments_hook_with_the_daemons_version(
        tmp_path, daemon_version, level, said):
    import time

    from watchdog import __version__
    from watchdog.cli.node.doctor import check_versions

    state = tmp_path / "state"
    state.mkdir()
    snap = {"host": "h", "daemon_pid": os.getpid(), "version": daemon_version,
            "interval": 1.0, "scan_monotonic": time.monotonic(), "ranks": []}
    (state / journal.STATUS).write_text(json.dumps(snap))
    lines = check_versions(str(state))
    assert [lvl for lvl, _ in lines] == [level], lines
    assert f"mlx-watchdog {__version__} (the hook its ranks load) {said}" in lines[0][1]
    snap["version"] = __version__
    (state / journal.STATUS).write_text(json.dumps(snap))
    assert check_versions(str(state))[0][0] == "ok"


# -- the start warns when systemd's watchdog would restart a healthy daemon ------------------


def test_the_start_warns_when_the_interval_outlasts_half_of_systemds_watchdog(tmp_path):
    import logging

    from watchdog.daemon.config import Settings
    from watchdog.daemon.runner import describe
    from watchdog.net.notify import watchdog_interval

    settings = Settings(dir=str(tmp_path), state_dir=str(tmp_path), interval=20.0)
    timeout = watchdog_interval({"WATCHDOG_USEC": "30000000"})  # the unit's WatchdogSec=30
    warned = [line for level, line in describe(settings, None, timeout)
              if level == logging.WARNING]
    assert warned == ["interval 20s is more than half systemd's WatchdogSec (30s): systemd "
                      "may restart a healthy daemon; lower interval or raise WatchdogSec"]
    for fine in (None, 40.0):  # not under systemd's watchdog, or a long enough one
        assert not [line for level, line in describe(settings, None, fine)
                    if level == logging.WARNING]


def test_cluster_status_says_this_nodes_daemon_is_down(tmp_path):
    """A node whose daemon is down (its state directory there, no daemon publishing):
    `cluster status`, with no peers too, says so with the command that starts it."""
    state = tmp_path / "state"
    state.mkdir()
    result = CliRunner().invoke(cli, ["cluster", "status", "--state-dir", str(state)])
    assert result.exit_code == 4, result.output
    assert result.output.splitlines()[0] == (
        f"this node's daemon: DOWN: no daemon publishes in {state}: this node's ranks are "
        "not watched; start it: sudo systemctl restart mlx-watchdog (macOS: sudo launchctl "
        "kickstart -k system/com.github.mlx-watchdog), or `mlx-watchdog doctor` says what "
        "is wrong")
    assert "no node answered (no peers: name the nodes" in result.output


def test_setup_errors_say_what_fixes_them_byte_for_byte(tmp_path, caplog):
    """Issue 49, item 9: each message names the file, the process or the command."""
    import logging

    from watchdog.daemon.store.dirs import UnsafeDirectory, check_state_dir
    from watchdog.net.http import _addresses

    # A state directory of another user's: the chown.
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafeDirectory) as refused:
        check_state_dir(str(theirs))
    me = os.geteuid()
    assert str(refused.value) == (
        f"state directory {theirs} is owned by uid 65534, not root or the daemon's user "
        f"(uid {me}): run: sudo chown {me} {theirs}, or pass a directory of this user's")
    # `inspect` of a rank that ended (killed, or exited): where to look instead.
    gone = subprocess.Popen(["true"])
    gone.wait()
    done = cli_proc(["inspect", gone.pid, "--dir", tmp_path])
    assert done.returncode == 3
    assert done.stderr == (f"mlx-watchdog: pid {gone.pid} is not running: a rank's record is "
                           "removed when it ends; what happened to it: mlx-watchdog "
                           "incidents\n")
    # A peer whose name does not resolve: what to fix, and what it costs meanwhile.
    with caplog.at_level(logging.WARNING, logger="watchdog.net.http"):
        _addresses(("mac9.invalid:9753",))
    assert [r.getMessage() for r in caplog.records] == [
        "peer mac9.invalid:9753 does not resolve: fix its name in peers (or /etc/hosts), "
        "then reload (SIGHUP); until then its requests are not told from local clients' "
        "and may wait behind them when many are connected"]


def test_service_install_of_another_oss_manager_says_so(tmp_path):
    done = cli_proc(["service", "install", "--launchd"])
    assert done.returncode == 3
    assert done.stderr == ("mlx-watchdog: launchd is macOS only: on this machine, install "
                           "--systemd (or `service print --launchd`, or --path FILE, to write "
                           "the plist for a Mac)\n")
