"""Issue 55: the field's false kills, reproduced against the real daemon and real ranks.

Each test is named after the incident of a maintained exo fork it reproduces (2026):
a runner killed mid-capture under a tracer, a late peer at bring-up, a cold first step,
a GPU (here: cores) shared with another job. Short deadlines prove the mechanism; the
figures at the defaults are measured in benchmarks/ (docs/performance.md).
"""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import time

import pytest

from tests.support.ranks import DaemonProc, RingJob, wait_for

pytestmark = pytest.mark.ranks


def _tracer_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("TracerPid:")).split()[1])


@pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")
def test_incident_1_a_runner_under_a_tracer_is_held_then_judged_from_the_detach_and_a_stop_still_ends_it(  # noqa: E501
        tmp_path, record_dir, state_dir):
    """A person's gdb holds rank 1 (stopped, traced) for 3 deadlines: its job is held,
    rank 1 shown `traced` by gdb's pid and name; after the detach the job runs on. The
    same rank SIGSTOPped with no tracer is the culprit of a `peer_stopped` hang, as ever."""
    with DaemonProc(record_dir, state_dir, deadline=2) as daemon, \
            RingJob(tmp_path, record_dir, 3, "loop") as job:
        job.wait_running()
        target = job.procs[1].pid
        # A person's debugger: no descendant of the daemon (nor of ours: a shell's child).
        subprocess.run(["sh", "-c", shlex.join(["gdb", "-q", "-nx", "-batch", "-p",
                                                str(target), "-ex", "shell sleep 6"])
                        + " >/dev/null 2>&1 &"], check=True)
        tracer = wait_for(lambda: _tracer_of(target), 30, what="gdb to attach")
        seen = wait_for(lambda: (r := daemon.ranks().get(target)) and r["state"] == "traced"
                        and r, 10, what="rank 1 shown traced")
        assert seen["tracer_pid"] == tracer and seen["tracer"] == "gdb", seen
        assert f"traced by pid {tracer} (gdb)" in seen["reason"]
        wait_for(lambda: not _tracer_of(target), 30, what="gdb to detach")
        # Traced past 3 deadlines: nothing acted on, and the job runs on after the detach.
        before = daemon.ranks()[job.procs[0].pid]["progress"]
        wait_for(lambda: daemon.ranks()[job.procs[0].pid]["progress"] > before + 3, 15,
                 what="the job to run on after the detach")
        assert daemon.incidents() == [] and all(p.poll() is None for p in job.procs)
        assert "tracer_pid" not in daemon.ranks()[target]
        job.signal(1, signal.SIGSTOP)
        stopped_at = time.monotonic()
        inc = wait_for(daemon.incidents, 40, what="the stopped rank's job ended")[-1]
        assert inc["cause"] == "peer_stopped" and inc["culprit"]["pid"] == target, inc
        assert time.monotonic() - stopped_at >= 2


def test_incident_5_a_late_peer_at_bring_up_is_waited_for_and_one_that_never_comes_is_named(
        tmp_path, record_dir, state_dir):
    """A ring whose rank 1 starts past half the bring-up bound (here 8 s) forms and runs,
    rank 0 shown waiting for it meanwhile; a ring whose rank 1 never starts is ended at
    the bound, cause `peer_never_joined` naming rank 1."""
    with DaemonProc(record_dir, state_dir, init_deadline=8) as daemon:
        late = RingJob(tmp_path, record_dir, 2, "loop").start(ranks=1)
        never = RingJob(tmp_path, record_dir, 2, "loop").start(ranks=1)
        try:
            first = late.procs[0].pid
            seen = wait_for(lambda: (r := daemon.ranks().get(first)) and r["state"] == "suspect"
                            and r, 20, what="rank 0 past half its bring-up bound")
            assert seen["awaiting"] == [1] and seen["phase"] == "init", seen
            assert "waiting for rank 1 (not seen on this node)" in seen["reason"], seen
            late.start_rank(1)
            late.wait_running()
            inc = wait_for(daemon.incidents, 30, what="the lone rank 0 ended")[-1]
            assert inc["pids"] == [never.procs[0].pid], inc
            assert inc["cause"] == "peer_never_joined", inc
            assert inc["summary"].startswith("rank 1 never joined the group: rank 0 on "), inc
            assert all(p.poll() is None for p in late.procs)
            assert len(daemon.incidents()) == 1
        finally:
            late.stop()
            never.stop()
