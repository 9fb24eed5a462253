"""The real daemon against real MLX ring ranks on 127.0.0.1."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support.ranks import DaemonProc, RingJob, torn_down, wait_for
from tests.support.records import SyntheticWriter
from watchdog import record
from watchdog.record import OP_CODE
from watchdog.states import Phase

pytestmark = pytest.mark.ranks
# Each scenario parametrized so runs on Linux and on the simulated Mac (docs/macos.md):
# the daemon and the ranks with MLX_WATCHDOG_SIMULATE=macos, the macOS path whole.
SIMULATED_MAC = {"MLX_WATCHDOG_SIMULATE": "macos"}
PLATFORMS = [pytest.param({}, id="linux"), pytest.param(SIMULATED_MAC, id="macos-simulated")]


def daemon_on(platform: dict[str, str], *args: object, **options: object) -> DaemonProc:
    daemon = DaemonProc(*args, **options)  # type: ignore[arg-type]
    daemon.extra_env = dict(platform)
    return daemon


def on_its_platform(daemon: DaemonProc, platform: dict[str, str]) -> None:
    expected = "macos (simulated)" if platform else "linux"
    assert daemon.status()["platform"] == expected


def all_exited(job: RingJob) -> bool:
    return all(p.poll() is not None for p in job.procs)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_frozen_peer_gets_survivors_killed_and_is_named(tmp_path, record_dir, state_dir,
                                                        platform):
    with daemon_on(platform, record_dir, state_dir, deadline=2) as daemon, \
            RingJob(tmp_path, record_dir, 3, "loop", env=platform) as job:
        on_its_platform(daemon, platform)
        job.wait_running()
        frozen = job.procs[1].pid
        job.signal(1, signal.SIGSTOP)
        froze_at = time.monotonic()
        # deadline + confirmation + evidence (2 s) + grace, with room for a busy machine
        wait_for(lambda: all_exited(job), 40, what="the hung job to be ended")
        took = time.monotonic() - froze_at
        assert took >= 2, "killed before the deadline"
        # Survivors ended by SIGTERM; the stopped rank went down with its job.
        assert [p.returncode for p in job.procs] == [-signal.SIGTERM] * 3
        incidents = wait_for(daemon.incidents, 10, what="the incident")
        inc = incidents[-1]
        assert inc["verdict"] == "stalled"
        assert inc["culprit"]["pid"] == frozen and inc["culprit"]["state"] == "stopped"
        assert inc["culprit"]["rank"] == 1
        assert sorted(inc["pids"]) == sorted(job.pids)
        assert torn_down(inc["outcome"]), inc["outcome"]
        # Spinning, not blocked (a busy machine gives it less than a whole core).
        assert inc["busiest_thread_cpu"] >= 0.1
        assert inc["flight_recorder_tail"]["0"][-1]["op"] == "all_sum"
        sent = [(s["pid"], s["signal"]) for s in inc["signals"] if s["result"] == "sent"]
        # Every rank frozen before the first SIGTERM; each resumed only after its own.
        first_term = min(sent.index((pid, "SIGTERM")) for pid in job.pids)
        for pid in job.pids:
            assert sent.index((pid, "SIGSTOP")) < first_term
            assert sent.index((pid, "SIGTERM")) < sent.index((pid, "SIGCONT"))
        # Evidence: the hook's faulthandler dump shows the Python stack of a survivor.
        python_dumps = [p for p in inc["evidence"] if p.endswith("-python.txt")]
        assert python_dumps, inc["evidence"]
        assert "rank_prog.py" in open(python_dumps[0]).read()
        ranks = wait_for(lambda: [r for r in daemon.ranks().values()
                                  if r["state"] == "killed"], 5, what="killed in status")
        assert len(ranks) == 3
        # Killed ranks' records are removed once journaled.
        assert not list(record_dir.glob("*.rec"))


def test_wait_on_a_recv_nobody_sends_is_ended(tmp_path, record_dir, state_dir):
    with DaemonProc(record_dir, state_dir, deadline=2, blocked_deadline=3) as daemon, \
            RingJob(tmp_path, record_dir, 2, "recv") as job:
        job.wait_running(collectives=1)
        wait_for(lambda: job.procs[0].poll() is not None, 40, what="rank 0 to be ended")
        inc = wait_for(daemon.incidents, 10)[-1]
        assert inc["verdict"] in ("stalled", "blocked")
        waiting = [r for r in inc["ranks"] if r["rank"] == 0][0]
        assert waiting["phase"] == "wait" and waiting["op"] == "eval"
        assert waiting["seconds_in_wait"] >= 2
        assert inc["outcome"][str(job.procs[0].pid)] == "killed"
        # Kill scope job: rank 1 (outside a wait, but part of a finished job) too.
        wait_for(lambda: job.procs[1].poll() is not None, 10, what="rank 1 to be ended")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_healthy_server_and_idle_ranks_are_never_killed(tmp_path, record_dir, state_dir,
                                                        platform):
    with daemon_on(platform, record_dir, state_dir, deadline=1, blocked_deadline=1) as daemon, \
            RingJob(tmp_path / "a", record_dir, 2, "loop", env=platform) as loop, \
            RingJob(tmp_path / "b", record_dir, 2, "server", env=platform) as server, \
            RingJob(tmp_path / "c", record_dir, 2, "idle", env=platform) as idle:
        on_its_platform(daemon, platform)
        loop.wait_running()
        server.wait_running(collectives=2)
        wait_for(lambda: len(idle.records()) == 2
                 and all(r.phase == Phase.IDLE for r in idle.records().values()), 60)
        first = {pid: r["progress"] for pid, r in daemon.ranks().items()}
        deadline = time.monotonic() + 6  # six deadlines of watching
        while time.monotonic() < deadline:
            states = {r["state"] for r in daemon.ranks().values()}
            assert states <= {"running", "idle", "suspect"}, daemon.ranks()
            time.sleep(0.25)
        assert daemon.incidents() == []
        for job in (loop, server, idle):
            assert all(p.poll() is None for p in job.procs)
        ranks = daemon.ranks()
        for pid in loop.pids + server.pids:
            assert ranks[pid]["progress"] > first.get(pid, 0)
        assert {ranks[pid]["state"] for pid in idle.pids} == {"idle"}


def test_expect_extends_the_deadline_then_the_rank_dies(tmp_path, record_dir, state_dir):
    with DaemonProc(record_dir, state_dir, deadline=1, blocked_deadline=1) as daemon, \
            RingJob(tmp_path, record_dir, 2, "expect", args=("5",)) as job:
        recs = wait_for(lambda: len(job.records()) == 2 and all(
            r.expect_seconds == 5 and r.phase == Phase.WAIT for r in job.records().values())
            and job.records(), 60, what="ranks waiting inside expect(5)")
        assert {r.expect_reason for r in recs.values()} == {"checkpoint"}
        time.sleep(3)  # well past the 1 s deadline, inside the 5 s window
        assert all(p.poll() is None for p in job.procs), "killed inside the expect window"
        assert {r["deadline_seconds"] for r in daemon.ranks().values()} == {5}
        wait_for(lambda: all_exited(job), 30, what="the ranks ended after the window")
        inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
        assert min(r["seconds_in_wait"] for r in inc["ranks"]) >= 5


def test_observe_mode_reports_but_kills_nothing(tmp_path, record_dir, state_dir):
    with DaemonProc(record_dir, state_dir, "--mode", "observe", deadline=1.5) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        job.wait_running()
        job.signal(1, signal.SIGSTOP)
        inc = wait_for(daemon.incidents, 30, what="an observed incident")[-1]
        assert inc["mode"] == "observe" and inc["signals"] == []
        assert inc["culprit"]["pid"] == job.procs[1].pid
        time.sleep(2)  # eight more scans of the same hung wait
        assert all(p.poll() is None for p in job.procs)
        states = {r["state"] for r in daemon.ranks().values()}
        assert "stopped" in states and ({"stalled", "blocked"} & states)
        assert len(daemon.incidents()) == 1, "one incident per hung wait, not one per scan"


def test_a_reload_to_enforce_ends_a_hang_already_observed(tmp_path, record_dir, state_dir):
    """Issue 38, item 1: the rollout's step (observe, then enforce by SIGHUP) ends the
    hang the node already reported, at once, not at the next restart."""
    cfg = tmp_path / "node.toml"
    cfg.write_text('[watchdog]\nmode = "observe"\n')
    with DaemonProc(record_dir, state_dir, "--config", str(cfg), deadline=1.5) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        job.wait_running()
        job.signal(1, signal.SIGSTOP)
        inc = wait_for(daemon.incidents, 30, what="an observed incident")[-1]
        assert inc["mode"] == "observe" and inc["signals"] == []
        time.sleep(1)  # four more scans: the wait stays observed, nothing ended
        assert all(p.poll() is None for p in job.procs)
        cfg.write_text('[watchdog]\nmode = "enforce"\n')
        daemon.proc.send_signal(signal.SIGHUP)
        reloaded = time.monotonic()
        # evidence (2 s box) + grace (1 s), with room for a busy machine
        wait_for(lambda: all_exited(job), 15, what="the observed hang ended after the reload")
        took = time.monotonic() - reloaded
        assert [p.returncode for p in job.procs] == [-signal.SIGTERM] * 2
        ended = wait_for(lambda: [i for i in daemon.incidents() if i["mode"] == "enforce"],
                         10, what="the enforce incident")
        assert torn_down(ended[-1]["outcome"]), ended[-1]["outcome"]
        assert "mode observe -> enforce" in daemon.log()
        assert "judged again now (only observed so far)" in daemon.log()
        # Issue 38, item 4: each response's end is one line a person reads.
        def told_lines() -> list[str]:
            return [line.split(" INFO ", 1)[1] for line in daemon.log().splitlines()
                    if " INFO incident " in line and "read it: mlx-watchdog incidents" in line]

        told = wait_for(lambda: len(told_lines()) >= 2 and told_lines(), 5, what="two ends")
        assert [line.split(":")[0] for line in told] == [
            f"incident {inc['id']}, job {inc['job']}",
            f"incident {ended[-1]['id']}, job {inc['job']}"], told
        assert "observed in " in told[0] and "nothing signalled (mode observe)" in told[0]
        assert "ranks 0, 1 ended by SIGTERM in " in told[1] and "wired memory" in told[1]
        print(f"ended {took:.1f}s after the reload")


def _fake_record(record_dir, proc: subprocess.Popen, *, owner: int | None = None,
                 start_time: float | None = None, name: str | None = None) -> str:
    """A record for a plain sleeping process, claiming a wait that began long ago."""
    import psutil

    path = os.path.join(record_dir, name or f"{proc.pid}{record.SUFFIX}")
    real_start = psutil.Process(proc.pid).create_time()
    writer = SyntheticWriter(path, pid=proc.pid, start_time=start_time or real_start, uid=0,
                          host="h", job="forged", rank=0, world_size=2, backend="ring",
                          dump_signal=0)
    long_ago = 1  # CLOCK_MONOTONIC starts at boot: a wait as old as the machine
    writer.begin()
    writer.write_hot(1, 1, 0, 0, Phase.WAIT, OP_CODE["eval"], long_ago, long_ago, long_ago, 0, 0)
    writer.end()
    if owner is not None:
        os.chown(path, owner, -1)
    return path


def test_garbage_forged_and_stale_records_are_never_acted_on(tmp_path, record_dir, state_dir):
    sleepers = [subprocess.Popen(["sleep", "120"]) for _ in range(3)]
    try:
        # Forged: file owned by someone else than the uid the record claims.
        _fake_record(record_dir, sleepers[0], owner=65534)
        # Stale: the pid is alive but it is not the process that wrote the record.
        _fake_record(record_dir, sleepers[1], start_time=1_000_000.0)
        # The control: a record that really is sleepers[2]'s, hung "for an hour".
        _fake_record(record_dir, sleepers[2])
        (record_dir / "short.rec").write_bytes(b"MLXWDREC" + b"\0" * 100)
        (record_dir / "garbage.rec").write_bytes(os.urandom(record.RECORD_SIZE))
        os.symlink("/etc/passwd", record_dir / "link.rec")
        (record_dir / "notes.txt").write_text("not a record")
        with DaemonProc(record_dir, state_dir, deadline=1, blocked_deadline=1) as daemon, \
                RingJob(tmp_path, record_dir, 2, "loop") as job:
            wait_for(lambda: sleepers[2].poll() is not None, 30, what="the control killed")
            job.wait_running()
            job.signal(1, signal.SIGSTOP)
            wait_for(lambda: all_exited(job), 40, what="the real hung job ended")
            assert sleepers[0].poll() is None and sleepers[1].poll() is None
            status = daemon.status()
            invalid = status["invalid_records"]
            assert any("owned by uid 65534" in why for why in invalid.values())
            assert any("stale or forged" in why for why in invalid.values())
            for name in ("short.rec", "garbage.rec", "link.rec"):
                assert str(record_dir / name) in invalid
            assert status["counters"]["invalid_records"] >= 5
            killed = {pid for inc in daemon.incidents() for pid in inc["pids"]}
            assert sleepers[0].pid not in killed and sleepers[1].pid not in killed
            assert daemon.alive()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def _shm_remove(shmid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmctl(shmid, 0, None)  # IPC_RMID


def test_wired_leak_flags_reboot_which_survives_restart(tmp_path, record_dir, state_dir):
    from watchdog.cli.commands import main as cli_main  # noqa: F401 - the CLI below runs as a process

    shmid = None
    daemon = DaemonProc(record_dir, state_dir, deadline=1.5, wired_threshold=16 << 20,
                        settle=2).start()
    try:
        with RingJob(tmp_path, record_dir, 2, "shm", args=("64",)) as job:
            job.wait_running()
            shmid = int(re.search(r"shmid (\d+)", job.log(0)).group(1))
            job.signal(1, signal.SIGSTOP)
            wait_for(lambda: all_exited(job), 40, what="the job ended")
            inc = wait_for(lambda: daemon.incidents(), 15)[-1]
        assert inc["wired_check"] == "leaked", inc
        assert inc["wired_after"] - inc["wired_baseline"] >= 60 << 20
        assert inc["reboot_required"]
        cli = [sys.executable, "-m", "watchdog.cli"]
        node = subprocess.run([*cli, "node", "status", "--state-dir", str(state_dir)],
                              capture_output=True, text=True, timeout=30)
        assert node.returncode == 1 and "reboot required: YES" in node.stdout
        # The flag survives a daemon restart and shows in its status.
        daemon.stop()
        daemon = DaemonProc(record_dir, state_dir).start()
        assert daemon.status()["reboot_required"] is True
        cleared = subprocess.run([*cli, "node", "clear-reboot", "--state-dir", str(state_dir)],
                                 capture_output=True, text=True, timeout=30)
        assert cleared.returncode == 0 and "cleared" in cleared.stdout
        wait_for(lambda: daemon.status()["reboot_required"] is False, 10)
    finally:
        daemon.stop()
        if shmid is not None:
            _shm_remove(shmid)


def test_a_crash_is_seen_at_once_not_at_the_next_scan(tmp_path, record_dir, state_dir):
    # With a 5 s interval, only the exit watcher (pidfd / kqueue) sees it this fast.
    with DaemonProc(record_dir, state_dir, interval=5, deadline=60) as daemon, \
            RingJob(tmp_path, record_dir, 2, "idle") as job:
        wait_for(lambda: len(daemon.ranks()) == 2, 60, what="both ranks watched")
        time.sleep(0.5)  # let the watcher pick up the new pids
        pid = job.procs[0].pid
        job.signal(0, signal.SIGKILL)
        died = time.monotonic()
        rank = wait_for(lambda: daemon.ranks()[pid]["state"] == "exited" and daemon.ranks()[pid],
                        10, interval=0.02, what="the crash in status")
        assert time.monotonic() - died < 2.5
        assert "without closing its record" in rank["reason"]
