"""`mlx-watchdog launch --restart` end to end: the real mlx.launch starting two local ring
ranks (`-n 2`), the real daemon ending a hung attempt, the launcher deciding what next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.ranks.rank.test_launch import two_free_ports
from tests.support.ranks import DaemonProc, base_env, http_get, wait_for
from watchdog.daemon.store import journal
from watchdog.launch.supervisor import INTERRUPT_GRACE

pytestmark = pytest.mark.ranks

# Rank 1 freezes itself (SIGSTOP) at iteration FREEZE_AFTER of the attempts in FREEZE_ON,
# or exits 3 (dies of SIGKILL) at iteration 5 of those in FAIL_ON (CRASH_ON); rank 0
# writes a real reboot flag into FLAG_DIR on the attempts in FLAG_ON before anything else
# (what the daemon does when a kill leaves wired memory behind), and starts HOLDER (below)
# on those in HOLD_ON. Every other rank finishes ITERATIONS all_sums, one each PAUSE s.
PROG = textwrap.dedent("""
    import os, signal, sys, time
    import mlx.core as mx

    def attempts(name):
        return {int(a) for a in os.environ.get(name, "").split(",") if a}

    attempt = int(os.environ["MLX_WATCHDOG_ATTEMPT"])
    group = mx.distributed.init()
    rank = group.rank()
    if rank == 0 and attempt in attempts("FLAG_ON"):
        from watchdog.daemon.store import journal
        journal.set_reboot_flag(os.environ["FLAG_DIR"], "test: wired memory stayed up")
    if rank == 0 and attempt in attempts("HOLD_ON"):
        import subprocess
        subprocess.Popen([sys.executable, os.environ["HOLDER"]], start_new_session=True)
    for i in range(int(os.environ.get("ITERATIONS", "200"))):
        if rank == 1 and attempt in attempts("FREEZE_ON") and i == int(os.environ["FREEZE_AFTER"]):
            os.kill(os.getpid(), signal.SIGSTOP)
        if rank == 1 and attempt in attempts("FAIL_ON") and i == 5:
            sys.exit(3)
        if rank == 1 and attempt in attempts("CRASH_ON") and i == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
        mx.eval(mx.distributed.all_sum(mx.ones(4)))
        # Slow enough that a frozen rank resumed by the watchdog's SIGCONT is still
        # running when its SIGTERM comes.
        time.sleep(float(os.environ.get("PAUSE", "0.005")))
    print(f"DONE rank={rank} attempt={attempt}", flush=True)
""")


# What a GPU driver releasing a dead job's buffers late looks like to the probe: wired
# (on Linux, Unevictable) memory that stays up for a while after the ranks are gone.
HOLDER = textwrap.dedent("""
    import ctypes, mmap, os, time
    size = int(os.environ["HOLD_MB"]) << 20
    buf = mmap.mmap(-1, size)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mlock(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(buf))),
                      ctypes.c_size_t(size)) == 0, os.strerror(ctypes.get_errno())
    with open(os.environ["HOLDER_PID"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(float(os.environ["HOLD_SECONDS"]))
""")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One real daemon for the module, with a short fixed deadline."""
    base = tmp_path_factory.mktemp("relaunch")
    records, state = base / "records", base / "state"
    records.mkdir()
    with DaemonProc(records, state, deadline=1, interval=0.2, grace=1, settle=2,
                    kill_timeout=3) as daemon:
        yield daemon


class Launch:
    def __init__(self, node: DaemonProc, tmp_path: Path, *options: str, **env: str) -> None:
        self.node, self.tmp_path = node, tmp_path
        prog = tmp_path / "prog.py"
        prog.write_text(PROG)
        self.job = f"relaunch-{tmp_path.name}"
        self.argv = [sys.executable, "-m", "watchdog.cli", "launch", "--restart-backoff", "0.1",
                     *options, "-n", "2", "--starting-port", str(two_free_ports()),
                     "--env", "MLX_WATCHDOG=1", "--env", f"MLX_WATCHDOG_DIR={node.record_dir}",
                     "--env", f"MLX_WATCHDOG_JOB={self.job}", "--",
                     sys.executable, str(prog)]
        self.env = base_env(node.record_dir, MLX_WATCHDOG_STATE_DIR=str(node.state_dir),
                            XDG_STATE_HOME=str(tmp_path / "xdg"), FLAG_DIR=str(node.state_dir),
                            **env)
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Launch:
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.tmp_path, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        return self

    def finish(self, timeout: float = 90) -> tuple[int, str, str]:
        assert self.proc is not None
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: ours only
                self.proc.wait()
        return self.proc.returncode, out, err

    def run(self, timeout: float = 90) -> tuple[int, str, str]:
        return self.start().finish(timeout)

    def events(self) -> list[dict]:
        from watchdog.daemon.store import launchlog

        return [e.to_json() for e in launchlog.read(str(self.node.state_dir))[0]
                if e.job == self.job]

    def incidents(self) -> list[dict]:
        return [i for i in self.node.incidents() if i["job"] == self.job]


def kinds(events: list[dict]) -> list[tuple[str, int]]:
    return [(e["event"], e["attempt"]) for e in events]


def test_a_job_frozen_on_its_first_attempt_is_relaunched_and_finishes(node, tmp_path):
    launch = Launch(node, tmp_path, "--restart", "2", FREEZE_ON="1", FREEZE_AFTER="20")
    code, out, err = launch.run()
    assert code == 0, err
    assert sorted(line for line in out.splitlines() if line.startswith("DONE")) == [
        "DONE rank=0 attempt=2", "DONE rank=1 attempt=2"], out
    assert kinds(launch.events()) == [("launch", 1), ("ended", 1), ("restart", 2),
                                      ("launch", 2), ("ended", 2)]
    ended = [e for e in launch.events() if e["event"] == "ended"]
    assert [e["ending"] for e in ended] == ["watchdog", "clean"]
    assert ended[0]["launcher_code"] == 0  # mlx.launch said 0 for the torn-down attempt too
    # The daemon's incident names the job and the attempt; the launcher's journal names it.
    (incident,) = launch.incidents()
    assert incident["attempt"] == 1 and {r["attempt"] for r in incident["ranks"]} == {1}
    assert ended[0]["incident"] == incident["id"]
    assert f"attempt 1: the watchdog ended it (incident {incident['id']}" in err
    # The relaunch kept the job's name; status and metrics show which attempt is which.
    shown = [r for r in node.status()["ranks"] if r["job"] == launch.job]
    assert {r["attempt"] for r in shown} == {1, 2}
    assert {r["state"] for r in shown if r["attempt"] == 1} == {"killed"}
    _, _, body = http_get(node.url() + "/metrics")
    text = body.decode()
    assert f'mlx_watchdog_rank_attempt{{mlx_job="{launch.job}",rank="0",uid="0"}} 2.0' in text
    assert 'mlx_watchdog_launch_events_total{event="restart"}' in text
    table = subprocess.run(
        [sys.executable, "-m", "watchdog.cli", "status", "--dir", str(node.record_dir),
         "--state-dir", str(node.state_dir)], env=launch.env, capture_output=True, text=True,
        timeout=60).stdout
    assert f"{launch.job} #1" in table and f"{launch.job} #2" in table, table
    shown_incidents = subprocess.run(
        [sys.executable, "-m", "watchdog.cli", "incidents", "--state-dir", str(node.state_dir)],
        env=launch.env, capture_output=True, text=True, timeout=60).stdout
    assert f"job {launch.job}  relaunched as attempt 2" in shown_incidents
    assert f"job {launch.job} attempt 1  stalled" in shown_incidents


def test_a_job_that_hangs_on_every_attempt_stops_after_its_budget(node, tmp_path):
    launch = Launch(node, tmp_path, "--restart", "2", FREEZE_ON="1,2,3", FREEZE_AFTER="20")
    code, out, err = launch.run()
    assert code == 11, err  # the watchdog ended the job, and no restart was left
    assert "DONE" not in out
    assert kinds(launch.events()) == [
        ("launch", 1), ("ended", 1), ("restart", 2), ("launch", 2), ("ended", 2),
        ("restart", 3), ("launch", 3), ("ended", 3)]
    assert all(e["progressed"] for e in launch.events() if e["event"] == "ended")
    assert sorted(i["attempt"] for i in launch.incidents()) == [1, 2, 3]
    assert "attempt 3: the watchdog ended it" in err and "no restart left of 2; exit 11" in err


def test_a_job_that_never_progresses_gives_up_after_k_attempts(node, tmp_path):
    launch = Launch(node, tmp_path, "--restart", "5", "--max-no-progress", "2",
                    FREEZE_ON="1,2,3,4,5,6", FREEZE_AFTER="0")
    code, _, err = launch.run()
    assert code == 13, err
    assert kinds(launch.events()) == [("launch", 1), ("ended", 1), ("restart", 2),
                                      ("launch", 2), ("ended", 2), ("gave_up", 2)]
    assert not any(e["progressed"] for e in launch.events() if e["event"] == "ended")
    (gave_up,) = [e for e in launch.events() if e["event"] == "gave_up"]
    assert gave_up["reason"].startswith("2 attempts in a row made no progress past the warm-up")
    assert f"job {launch.job}: giving up: 2 attempts in a row" in err


def test_a_reboot_flag_makes_the_relaunch_wait_then_refuse(node, tmp_path):
    """The flag appears during attempt 1 (rank 0 writes it, as the daemon would after a
    leak): the relaunch waits --health-timeout for it to be cleared, then refuses."""
    try:
        launch = Launch(node, tmp_path, "--restart", "2", "--health-timeout", "1.5",
                        FREEZE_ON="1", FREEZE_AFTER="20", FLAG_ON="1")
        began = time.monotonic()
        code, out, err = launch.run()
        assert code == 12, err
        assert "DONE" not in out
        assert kinds(launch.events()) == [("launch", 1), ("ended", 1), ("restart", 2),
                                          ("refused", 2)]
        refused = launch.events()[-1]
        assert refused["reason"].startswith("this node is flagged for reboot (test: wired "
                                            "memory stayed up")
        assert f"job {launch.job}: waiting up to 1.5s before attempt 2: this node is " \
               "flagged for reboot" in err
        assert f"job {launch.job}: refusing attempt 2: this node is flagged for reboot" in err
        assert time.monotonic() - began > 1.5
    finally:
        journal.clear_reboot_flag(str(node.state_dir))


def test_a_reboot_flag_cleared_during_the_wait_lets_the_relaunch_go_on(node, tmp_path):
    try:
        launch = Launch(node, tmp_path, "--restart", "1", "--health-timeout", "60",
                        FREEZE_ON="1", FREEZE_AFTER="20", FLAG_ON="1").start()
        flag = node.state_dir / journal.REBOOT_FLAG
        wait_for(lambda: any(e["event"] == "restart" for e in launch.events()), 60,
                 what="the relaunch decided")
        # The launcher now waits on the flag: attempt 2 has not started.
        time.sleep(0.5)
        assert flag.exists() and kinds(launch.events())[-1] == ("restart", 2)
        cleared = subprocess.run([sys.executable, "-m", "watchdog.cli", "node", "clear-reboot",
                                  "--state-dir", str(node.state_dir)], env=launch.env,
                                 capture_output=True, text=True, timeout=60)
        assert cleared.stdout.strip() == "reboot flag cleared"
        code, out, err = launch.finish()
        assert code == 0, err
        assert "DONE rank=0 attempt=2" in out
        assert kinds(launch.events())[-2:] == [("launch", 2), ("ended", 2)]
    finally:
        journal.clear_reboot_flag(str(node.state_dir))


def test_wired_memory_not_back_makes_the_relaunch_wait_for_it(node, tmp_path):
    """Attempt 1 leaves 64 MiB wired after its ranks are gone: the daemon's baseline
    follows it (no rank is live), the launcher's reading from before attempt 1 does not;
    the relaunch waits until the memory is given back, then runs."""
    holder, holder_pid = tmp_path / "holder.py", tmp_path / "holder.pid"
    holder.write_text(HOLDER)
    config = tmp_path / "node.toml"
    # The restart budget from the node's config file this time, not the flag.
    config.write_text(f"wired_threshold = {16 << 20}\nrestart = 1\nhealth_timeout = 60\n")
    launch = Launch(node, tmp_path,
                    FREEZE_ON="1", FREEZE_AFTER="20", HOLD_ON="1", HOLDER=str(holder),
                    HOLDER_PID=str(holder_pid), HOLD_MB="64", HOLD_SECONDS="60",
                    MLX_WATCHDOG_CONFIG=str(config))
    try:
        launch.start()
        wait_for(lambda: any(e["event"] == "restart" for e in launch.events()), 60,
                 what="the relaunch decided")
        # The daemon's baseline soon follows the held memory (no rank is live): by its
        # figures alone the node looks fit, yet attempt 2 does not start.
        wait_for(lambda: abs(node.status()["wired_bytes"]
                             - node.status()["wired_baseline_bytes"]) < (16 << 20), 30,
                 what="the daemon's baseline to follow the held memory")
        time.sleep(1.0)
        assert kinds(launch.events())[-1] == ("restart", 2)
        os.kill(int(holder_pid.read_text()), signal.SIGTERM)  # the memory comes back
        released = time.time()
        code, out, err = launch.finish()
    finally:
        if holder_pid.exists():
            try:
                os.kill(int(holder_pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code == 0, err
    assert "DONE rank=0 attempt=2" in out
    assert f"job {launch.job}: waiting up to 60s before attempt 2: wired memory is" in err
    attempt2 = [e for e in launch.events() if e["event"] == "launch"][1]
    assert attempt2["time"] >= released


def test_a_clean_exit_and_a_ranks_own_failure_are_not_restarted(node, tmp_path):
    # This node's config names a peer that is down: a job of this node alone (-n 2) is
    # not held for it (its reboot flag bears on no rank of the job).
    config = tmp_path / "node.toml"
    config.write_text(f'dir = "{node.record_dir}"\nstate_dir = "{node.state_dir}"\n'
                      f'peers = ["127.0.0.1:{two_free_ports()}"]\n')
    clean = Launch(node, tmp_path, "--restart", "2", ITERATIONS="5",
                   MLX_WATCHDOG_CONFIG=str(config))
    began = time.monotonic()
    code, out, err = clean.run()
    assert code == 0, err
    assert time.monotonic() - began < 25 and "waiting up to" not in err, err
    assert kinds(clean.events()) == [("launch", 1), ("ended", 1)]
    # A rank that exits 3: mlx.launch says 0, we say 10, and do not relaunch by default.
    (tmp_path / "own").mkdir()
    failed = Launch(node, tmp_path / "own", "--restart", "2", FAIL_ON="1")
    code, out, err = failed.run()
    assert code == 10, err
    assert kinds(failed.events()) == [("launch", 1), ("ended", 1)]
    assert failed.events()[-1]["launcher_code"] == 0
    # (rank 0 raises and exits 1 when its peer goes: what mlx.launch reported is said;
    # it does not always report both before it returns)
    said = next(line for line in err.splitlines() if f"job {failed.job} attempt 1:" in line)
    assert "exited with code" in said and said.endswith("; exit 10"), said
    # ...unless asked: --restart-on any relaunches it, and attempt 2 finishes.
    (tmp_path / "any").mkdir()
    anyway = Launch(node, tmp_path / "any", "--restart", "2", "--restart-on", "any",
                    FAIL_ON="1")
    code, out, err = anyway.run()
    assert code == 0, err
    assert [e["ending"] for e in anyway.events() if e["event"] == "ended"] == ["failed", "clean"]


def test_a_rank_that_crashes_is_relaunched(node, tmp_path):
    """A rank killed by a signal nobody in the watchdog sent (here SIGKILL, as the OOM
    killer would) is a crash: relaunched by default; the daemon wrote no incident."""
    launch = Launch(node, tmp_path, "--restart", "1", CRASH_ON="1")
    code, out, err = launch.run()
    assert code == 0, err
    assert "DONE rank=1 attempt=2" in out
    ended = [e for e in launch.events() if e["event"] == "ended"]
    assert [e["ending"] for e in ended] == ["crashed", "clean"]
    assert ended[0]["reason"].startswith("rank 1 died of SIGKILL")
    assert ended[0]["incident"] is None and launch.incidents() == []


def test_ctrl_c_is_not_restarted(node, tmp_path):
    launch = Launch(node, tmp_path, "--restart", "2", ITERATIONS="100000", PAUSE="0.01").start()
    assert launch.proc is not None

    wait_for(lambda: len([r for r in node.status()["ranks"]
                          if r["job"] == launch.job and r["state"] == "running"]) == 2,
             60, what="both ranks running")
    interrupted = time.monotonic()
    launch.proc.send_signal(signal.SIGINT)
    code, out, err = launch.finish(timeout=60)
    assert code == 130, err
    # Promptly: a rank left waiting on a peer that went is ended after the interrupt grace.
    assert time.monotonic() - interrupted < 3 * INTERRUPT_GRACE + 5
    assert kinds(launch.events()) == [("launch", 1), ("ended", 1)]
    assert launch.events()[-1]["ending"] == "interrupted"
    assert launch.incidents() == []
    # The interrupt is ours: mlx.launch's (and the ranks') KeyboardInterrupt tracebacks
    # are not shown, and that is said.
    assert "Traceback" not in err and "KeyboardInterrupt traceback(s)" in err, err
    # Both ranks went with it (the daemon saw them exit, nothing is left running).
    wait_for(lambda: all(r["state"] in ("exited", "killed") for r in node.status()["ranks"]
                         if r["job"] == launch.job), 30, what="the ranks gone")


def test_another_users_incident_under_our_job_id_is_not_taken_for_ours(node, tmp_path):
    """Issue 30, item 3: the job id is world-readable (mlx.launch's command line). A
    process of uid 65534 publishes a hung record naming it; the daemon ends it and
    journals an incident of that uid under our job id. Our healthy attempt (its ranks
    unhooked here, so the launcher saw none of their pids to tell them apart) ends
    cleanly: not "the watchdog ended it", no relaunch, exit 0."""
    from tests.support.users import OTHER_UID, UserProc, publish

    launch = Launch(node, tmp_path, "--restart", "1", ITERATIONS="150", PAUSE="0.05")
    at = launch.argv.index("MLX_WATCHDOG=1")
    del launch.argv[at - 1:at + 1]  # the ranks run unhooked
    with UserProc() as attacker:
        launch.start()
        publish(node.record_dir, attacker.pid, OTHER_UID, launch.job, hung=True,
                world_size=1)
        wait_for(lambda: any(i.get("uid") == OTHER_UID for i in launch.incidents()), 30,
                 what="the other user's incident under our job id")
        code, out, err = launch.finish()
    assert code == 0, err
    assert "the watchdog ended it" not in err, err
    assert kinds(launch.events()) == [("launch", 1), ("ended", 1)], launch.events()
    assert sorted(line for line in out.splitlines() if line.startswith("DONE")) == [
        "DONE rank=0 attempt=1", "DONE rank=1 attempt=1"], out
