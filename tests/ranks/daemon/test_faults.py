"""The daemon's own faults: killed mid-escalation, started late, starved of CPU.

Real MLX ring ranks on 127.0.0.1 and the real daemon as a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.ranks import DaemonProc, RingJob, torn_down, wait_for
from tests.support.records import SyntheticWriter
from watchdog.daemon.store import journal
from watchdog.record import OP_CODE
from watchdog.states import Phase

pytestmark = pytest.mark.ranks


def all_exited(job: RingJob) -> bool:
    return all(p.poll() is not None for p in job.procs)


def journal_lines(state_dir) -> list[dict]:
    """Every line of incidents.jsonl, each of which must be one whole JSON object."""
    path = state_dir / journal.INCIDENTS
    if not path.exists():
        return []
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n"), "a torn last line"
    out = []
    for line in raw.splitlines():
        item = json.loads(line)  # raises on a torn or interleaved line
        assert isinstance(item, dict)
        out.append(item)
    return out


@pytest.mark.parametrize("kill_at", ["evidence", "grace"])
def test_daemon_killed_mid_escalation_and_restarted_converges(tmp_path, record_dir, state_dir,
                                                               kill_at):
    """SIGKILL the daemon while it gathers evidence, or between SIGTERM and SIGKILL.

    The ranks ignore SIGTERM, so only the restarted daemon's SIGKILL can end them.
    """
    flag = journal.set_reboot_flag(str(state_dir), "an earlier unkillable rank", time=1.0,
                                   incident="earlier")
    flag_bytes = (state_dir / journal.REBOOT_FLAG).read_bytes()
    options = dict(deadline=2, blocked_deadline=3, grace=5, evidence_timeout=2)
    first = DaemonProc(record_dir, state_dir, **options)
    second = DaemonProc(record_dir, state_dir, **options)
    with RingJob(tmp_path, record_dir, 2, "stubborn") as job:
        try:
            first.start()
            wait_for(lambda: "ignoring SIGTERM" in job.log(0) and "ignoring SIGTERM" in job.log(1),
                     60, what="both ranks ignoring SIGTERM")
            marker = r"; ending ranks 0, 1;" if kill_at == "evidence" else \
                r"SIGTERM to pid \d+.*sent"
            pattern = re.compile(marker)
            wait_for(lambda: len(pattern.findall(first.log())) >= (1 if kill_at == "evidence"
                                                                   else 2),
                     30, interval=0.01, what=f"the escalation to reach {kill_at}")
            first.stop(signal.SIGKILL)
            killed_at = time.monotonic()
            assert first.proc.returncode == -signal.SIGKILL
            assert not all_exited(job), "the ranks died without the daemon's SIGKILL"
            assert "SIGKILL to pid" not in first.log()
            if kill_at == "evidence":
                assert "SIGTERM to pid" not in first.log()
            # The interrupted escalation left no incident line, and no torn one.
            assert journal_lines(state_dir) == []
            assert (state_dir / journal.REBOOT_FLAG).read_bytes() == flag_bytes

            second.start()
            assert second.status()["reboot_required"] is True
            wait_for(lambda: all_exited(job), 40, what="the restarted daemon to end the ranks")
            took = time.monotonic() - killed_at
            assert [p.returncode for p in job.procs] == [-signal.SIGKILL] * 2
            incidents = wait_for(lambda: journal_lines(state_dir), 10, what="the incident")
            assert len(incidents) == 1
            inc = incidents[0]
            assert sorted(inc["pids"]) == sorted(job.pids)
            assert torn_down(inc["outcome"]), inc["outcome"]
            sent = {(s["pid"], s["signal"]) for s in inc["signals"] if s["result"] == "sent"}
            assert {(pid, "SIGKILL") for pid in job.pids} <= sent
            # Restart, deadline already passed, evidence, grace 5 s: well under 40 s.
            assert took < 40
            # The reboot flag survived the SIGKILL and the restart, reason first.
            after = journal.reboot_flag(str(state_dir))
            assert after is not None and after.reason == flag.reason
            wait_for(lambda: second.status()["reboot_required"] is True, 5)
            assert second.alive()
        finally:
            first.stop(signal.SIGKILL)
            second.stop()


def test_daemon_started_after_the_ranks_hung_ends_them(tmp_path, record_dir, state_dir):
    with RingJob(tmp_path, record_dir, 2, "loop") as job:
        job.wait_running()
        frozen = job.procs[1].pid
        job.signal(1, signal.SIGSTOP)
        stopped_at = time.time()
        time.sleep(4)  # twice the deadline, with no daemon at all
        with DaemonProc(record_dir, state_dir, deadline=2) as daemon:
            started = time.time()
            wait_for(lambda: all_exited(job), 40, what="the late daemon to end the hung job")
            inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
            assert inc["culprit"]["pid"] == frozen and inc["culprit"]["state"] == "stopped"
            assert sorted(inc["pids"]) == sorted(job.pids)
            assert torn_down(inc["outcome"]), inc["outcome"]
            assert inc["seconds_without_progress"] >= 4
            term = min(s["time"] for s in inc["signals"] if s["signal"] == "SIGTERM")
            # It needs a few scans to see the survivor spin, then evidence: not a full
            # deadline again, whatever the ranks' history before it came up.
            assert term - started < 20, term - started
            assert term - stopped_at >= 4


BURNER = "while True: pass"


def test_daemon_under_cpu_starvation_still_acts_within_its_slack(tmp_path, record_dir,
                                                                 state_dir):
    """Two spinning survivors plus two CPU burners on this 2-core machine."""
    deadline, slack = 2.0, 10.0
    burners: list[subprocess.Popen] = []
    try:
        with DaemonProc(record_dir, state_dir, deadline=deadline) as daemon, \
                RingJob(tmp_path / "hung", record_dir, 3, "loop") as hung, \
                RingJob(tmp_path / "ok", record_dir, 2, "soak", args=("600", "0.05")) as ok:
            hung.wait_running()
            ok.wait_running()
            burners = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(2)]
            time.sleep(1)
            hung.signal(1, signal.SIGSTOP)
            stopped_at = time.time()
            wait_for(lambda: all_exited(hung), deadline + slack + 20,
                     what="the hung job ended under starvation")
            inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
            first_signal = min(s["time"] for s in inc["signals"])
            assert first_signal - stopped_at <= deadline + slack, first_signal - stopped_at
            assert inc["culprit"]["pid"] == hung.procs[1].pid
            assert sorted(inc["pids"]) == sorted(hung.pids)
            # The healthy job and the burners were left alone.
            time.sleep(1)
            assert all(p.poll() is None for p in ok.procs), [ok.log(r) for r in range(2)]
            assert all(b.poll() is None for b in burners)
            assert len(daemon.incidents()) == 1
            assert {r["state"] for pid, r in daemon.ranks().items() if pid in ok.pids} <= {
                "running", "suspect"}
    finally:
        for b in burners:
            b.kill()
            b.wait()


SLEEPER = "import time\nwhile True: time.sleep(1)"


def test_a_rank_stopped_inside_its_record_write_is_still_named_and_ended(record_dir,
                                                                        state_dir):
    """SIGSTOP can land while the hook holds the record's seqlock (about 1 in 100
    stops of a rank in a tight collective loop, measured here): its record then
    stays mid-write for good. The daemon must still see a stopped rank of the job,
    name it, and take it down with its hung peer."""
    procs = [subprocess.Popen([sys.executable, "-c", SLEEPER]) for _ in range(2)]
    try:
        for rank, proc in enumerate(procs):
            writer = SyntheticWriter(str(record_dir / f"{proc.pid}.rec"), pid=proc.pid,
                                  start_time=psutil.Process(proc.pid).create_time(),
                                  uid=os.getuid(), host="h", job="midwrite", rank=rank,
                                  world_size=2, backend="ring", dump_signal=0)
            writer.begin()
            # Rank 0 waits on its peer since boot (a hang, nothing spinning).
            writer.write_hot(5, 5, 4, 0, Phase.WAIT, OP_CODE["eval"], 1, 1, 1, 0, 0)
            if rank == 0:
                writer.end()  # rank 1 stops inside its write: `seq` stays odd
            writer.words.release()
            writer._map.close()  # unmapped; the file stays as the rank left it
        procs[1].send_signal(signal.SIGSTOP)
        with DaemonProc(record_dir, state_dir, deadline=1, blocked_deadline=2) as daemon:
            wait_for(lambda: procs[0].poll() is not None, 30, what="the hung rank 0 ended")
            inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
            assert (inc.get("culprit") or {}).get("pid") == procs[1].pid, inc.get("culprit")
            wait_for(lambda: procs[1].poll() is not None, 10,
                     what="the stopped rank 1 to go down with its job")
            assert sorted(inc["pids"]) == sorted(p.pid for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()


def test_evidence_that_cannot_be_written_never_stops_the_kill(tmp_path, record_dir,
                                                              state_dir):
    """The evidence folder cannot be made (a file in its place, as a full or broken
    disk would): the hung job is still ended, and the incident says why it has no
    stacks."""
    (state_dir / "evidence").write_text("not a directory")
    with DaemonProc(record_dir, state_dir, deadline=2) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        job.wait_running()
        job.signal(1, signal.SIGSTOP)
        wait_for(lambda: all_exited(job), 40, what="the hung job ended without evidence")
        inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
        assert inc["evidence"] == [] and "evidence_error" in inc
        assert torn_down(inc["outcome"]), inc["outcome"]
        assert "escalation failed" not in daemon.log()
