"""The command line against real ranks, through CliRunner and as real processes.

`status --check` is a health check: exit 0 on a healthy job, 1 while a rank is
hung, with the daemon's verdicts (observe mode, so the hang stays) and with no
daemon at all (status samples the processes itself). `inspect`, `watch`,
`incidents` and `node status` are read on the same real job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.support.ranks import DaemonProc, RingJob, wait_for
from tests.unit.cli.test_cli import CLEAR, invoke, run_cli
from watchdog.daemon.store import journal

# Design section 7: the fields of one rank in `status --json`.
RANK_FIELDS = ("pid", "host", "job", "rank", "world_size", "backend", "state", "phase",
               "progress", "collectives", "steps", "seconds_since_progress",
               "deadline_seconds", "busiest_thread_cpu", "current_op")


def check_schema(ranks: list[dict], pids: list[int], source: str) -> None:
    assert sorted(r["pid"] for r in ranks) == sorted(pids)
    for r in ranks:
        missing = [f for f in RANK_FIELDS if f not in r]
        assert not missing, f"status --json lacks {missing}"
        assert r["source"] == source
        assert r["world_size"] == len(pids) and r["backend"] == "ring"
        assert isinstance(r["progress"], int) and isinstance(r["collectives"], int)
    assert sorted(r["rank"] for r in ranks) == list(range(len(pids)))


@pytest.mark.ranks
def test_with_a_daemon_status_inspect_watch_incidents_node(tmp_path, record_dir, state_dir):
    with DaemonProc(record_dir, state_dir, "--mode", "observe", deadline=1.5) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        job.wait_running()
        wait_for(lambda: len(daemon.ranks()) == 2 and {
            r["state"] for r in daemon.ranks().values()} == {"running"}, 15,
            what="both ranks running in the daemon's view")
        dirs = ["--dir", record_dir, "--state-dir", state_dir]

        # Healthy: --check exits 0, in process and as a real process.
        result = invoke(["status", "--check", *dirs])
        assert result.exit_code == 0, result.output
        assert all(str(pid) in result.stdout for pid in job.pids)
        assert "verdicts from the daemon" in result.stderr
        assert run_cli(["status", "--check", *dirs]).returncode == 0
        # `cluster status` with no peers: this node alone, not a usage error.
        result = invoke(["cluster", "status", "--state-dir", state_dir])
        assert result.exit_code == 0, result.output
        assert "this node's daemon: ok" in result.stdout and "healthy" in result.stdout.lower()

        result = invoke(["status", "--json", *dirs])
        assert result.exit_code == 0
        ranks = json.loads(result.stdout)
        check_schema(ranks, job.pids, "daemon")

        # Given only the record directory, status finds the daemon that watches it
        # (its pointer there names the state directory) instead of judging alone.
        no_state = tmp_path / "no-such-state-dir"
        result = invoke(["status", "--json", "--dir", record_dir, "--state-dir", no_state])
        check_schema(json.loads(result.stdout), job.pids, "daemon")
        # A daemon that watches another directory is not this directory's judge.
        other = tmp_path / "other-records"
        other.mkdir()
        result = invoke(["status", "--dir", other, "--state-dir", state_dir])
        assert result.exit_code == 0 and "no ranks in" in result.stdout, result.output
        # A pointer another user wrote is not believed (it could name forged verdicts).
        pointer = record_dir / journal.POINTER
        os.chown(pointer, 65534, 65534)
        try:
            result = invoke(["status", "--json", "--dir", record_dir, "--state-dir", no_state])
            check_schema(json.loads(result.stdout), job.pids, "sampled")
        finally:
            os.chown(pointer, os.getuid(), os.getgid())
        assert {r["state"] for r in ranks} == {"running"}
        assert {r["deadline_seconds"] for r in ranks} == {1.5}

        # inspect: threads with CPU, counters, the flight recorder.
        pid = job.pids[0]
        proc = run_cli(["inspect", pid, "--dir", record_dir, "--json"])
        assert proc.returncode == 0, proc.stderr
        info = json.loads(proc.stdout)
        assert info["pid"] == pid and info["rank"] == 0 and info["world_size"] == 2
        assert info["threads"] and {"id", "cpu_seconds", "cpu_ratio"} <= set(info["threads"][0])
        assert info["threads"][0]["cpu_ratio"] >= max(t["cpu_ratio"] for t in info["threads"])
        assert info["counters"]["collectives"] > 0 and info["counters"]["waits_completed"] > 0
        assert info["flight_recorder"] and info["flight_recorder"][-1]["op"] == "all_sum"
        numbers = [f["number"] for f in info["flight_recorder"]]
        assert numbers == sorted(numbers)
        # The pace table: the loop's evals, counted as they complete.
        assert info["pace"]["eval"]["waits"] > 0
        assert 0 < info["pace"]["eval"]["longest_seconds"] < 60
        result = invoke(["inspect", pid, "--dir", record_dir])
        assert result.exit_code == 0, result.output
        text = result.stdout
        assert f"pid {pid}" in text and "rank 0/2" in text
        assert "threads (busiest first):" in text and "% of a core" in text
        assert "flight recorder (last" in text and "all_sum" in text
        assert "completed waits (the pace the auto deadline learns): eval " in text

        # watch: two refreshes, each clearing the screen in place on a terminal
        # (color=True: as on a tty; piped, click strips the escape codes).
        result = invoke(["watch", "--count", 2, "--interval", 0.1, *dirs], color=True)
        assert result.exit_code == 0, result.output
        assert result.stdout.count(CLEAR) == 2
        assert result.stdout.count("mlx-watchdog  (daemon)") == 2
        for frame in result.stdout.split(CLEAR)[1:]:
            assert all(str(p) in frame for p in job.pids) and "STATE" in frame
        proc = run_cli(["watch", "--count", 2, "--interval", 0.1, *dirs])
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.count("mlx-watchdog  (daemon)") == 2 and CLEAR not in proc.stdout

        result = invoke(["node", "status", "--state-dir", state_dir])
        assert result.exit_code == 0
        assert "reboot required: no" in result.stdout and "daemon: running" in result.stdout

        # Freeze rank 1: the daemon (observe mode) keeps it stalled; --check says 1.
        job.signal(1, signal.SIGSTOP)
        frozen = job.pids[1]
        wait_for(lambda: {r["pid"]: r["state"] for r in daemon.ranks().values()} == {
            pid: "stalled", frozen: "stopped"}, 30, what="rank 0 stalled, rank 1 stopped")
        result = invoke(["status", "--check", *dirs])
        assert result.exit_code == 1, result.output
        assert "stalled" in result.stdout and "stopped" in result.stdout
        proc = run_cli(["status", "--check", *dirs])
        assert proc.returncode == 1, proc.stderr
        proc = run_cli(["status", "--check", "--json", *dirs])
        assert proc.returncode == 1
        assert {r["state"] for r in json.loads(proc.stdout)} == {"stalled", "stopped"}

        # incidents: the last one, as JSON and as text.
        name = ranks[0]["job"]
        wait_for(daemon.incidents, 10, what="the observed incident")
        result = invoke(["incidents", "--json", "--last", 1, "--state-dir", state_dir])
        assert result.exit_code == 0, result.output
        items = json.loads(result.stdout)
        assert len(items) == 1
        inc = items[0]
        assert inc["job"] == name and inc["verdict"] == "stalled" and inc["mode"] == "observe"
        assert inc["culprit"]["pid"] == frozen and inc["signals"] == []
        proc = run_cli(["incidents", "--last", 1, "--state-dir", state_dir])
        assert proc.returncode == 0, proc.stderr
        headers = [line for line in proc.stdout.splitlines() if not line.startswith(" ")]
        assert len(headers) == 1 and f"job {name}" in headers[0] and "stalled" in headers[0]
        assert re.search(rf"culprit: rank 1 on \S+ \(pid {frozen}\): ", proc.stdout), proc.stdout
        # Its time carries its zone; an observed hang has no evidence folder to show.
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z+\-\d]+  ", headers[0]), headers

        # node status: exit 1 while the node is flagged, 0 once cleared.
        journal.set_reboot_flag(str(state_dir), "test: wired memory leaked")
        result = invoke(["node", "status", "--state-dir", state_dir])
        assert result.exit_code == 1
        assert "reboot required: YES (test: wired memory leaked)" in result.stdout
        proc = run_cli(["node", "status", "--json", "--state-dir", state_dir])
        assert proc.returncode == 1
        info = json.loads(proc.stdout)
        assert info["reboot_required"] is True and info["daemon_running"] is True
        assert isinstance(info["wired_bytes"], int)
        proc = run_cli(["node", "clear-reboot", "--state-dir", state_dir])
        assert proc.returncode == 0 and "cleared" in proc.stdout
        assert invoke(["node", "status", "--state-dir", state_dir]).exit_code == 0
        assert all(p.poll() is None for p in job.procs), "observe mode ended a rank"


@pytest.mark.ranks
def test_with_no_daemon_status_samples_the_ranks_itself(tmp_path, record_dir):
    """No daemon: status reads the records and samples the processes. With no
    config to read, the deadline to judge by comes from --deadline."""
    no_daemon = tmp_path / "no-daemon"
    no_daemon.mkdir()
    # A dead daemon's leftover status.json (all ranks "stalled") must be ignored.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (no_daemon / "status.json").write_text(json.dumps({
        "daemon_pid": dead.pid, "interval": 1, "time": time.time(),
        "ranks": [{"pid": 1, "state": "stalled"}]}))
    with RingJob(tmp_path, record_dir, 2, "loop") as job:
        job.wait_running()
        args = ["--dir", record_dir, "--state-dir", no_daemon, "--deadline", 1]
        result = invoke(["status", "--check", *args])
        assert result.exit_code == 0, result.output
        assert all(str(pid) in result.stdout for pid in job.pids)
        proc = run_cli(["status", "--json", *args])
        assert proc.returncode == 0, proc.stderr
        ranks = json.loads(proc.stdout)
        check_schema(ranks, job.pids, "sampled")
        assert {r["state"] for r in ranks} == {"running"}
        assert {r["deadline_seconds"] for r in ranks} == {1}

        job.signal(1, signal.SIGSTOP)
        time.sleep(1.5)  # past the 1 s deadline
        proc = run_cli(["status", "--check", "--json", *args])
        states = {r["rank"]: r["state"] for r in json.loads(proc.stdout)}
        assert states[1] == "stopped", states
        assert states[0] in ("stalled", "blocked"), states
        assert proc.returncode == 1
        result = invoke(["status", "--check", *args])
        assert result.exit_code == 1, result.output
        assert "stopped" in result.stdout
        # No flag: the node's config file's deadline, as its daemon would judge.
        config = tmp_path / "node.toml"
        config.write_text("deadline = 1\n")
        configured = ["--config", str(config), "status", "--check", "--json",
                      "--dir", str(record_dir), "--state-dir", str(no_daemon)]
        proc = run_cli(configured)
        assert proc.returncode == 1, proc.stdout
        assert {r["deadline_seconds"] for r in json.loads(proc.stdout)} == {1}
