"""The backstop with real ranks and the real daemon: a main thread blocked in a
native call the hook cannot wrap (the buffer protocol) while a peer is frozen is
caught; Python threads at work, Python compute and a quiet rank are not."""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack

import pytest

from tests.support.ranks import DaemonProc, RingJob, wait_for

pytestmark = pytest.mark.ranks


def all_exited(job: RingJob) -> bool:
    return all(p.poll() is not None for p in job.procs)


def test_a_hang_inside_the_buffer_protocol_is_caught_by_the_backstop(
        tmp_path, record_dir, state_dir):
    with DaemonProc(record_dir, state_dir, deadline=2) as daemon, \
            RingJob(tmp_path, record_dir, 2, "buffer") as job:
        recs = job.wait_running()
        # Nothing the hook wraps is called in this loop: its progress is collectives
        # and steps, and its phase stays "running".
        assert recs[0].waits_completed == recs[1].waits_completed
        frozen = job.procs[1].pid
        job.signal(1, signal.SIGSTOP)
        wait_for(lambda: job.procs[0].poll() is not None, 60, what="the stuck rank ended")
        wait_for(lambda: all_exited(job), 20, what="the stopped rank ended with its job")
        inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
        assert inc["verdict"] == "stalled"
        assert "stuck in a native call outside a known wait" in inc["reason"], inc["reason"]
        assert inc["culprit"]["pid"] == frozen and inc["culprit"]["state"] == "stopped"
        stuck = [r for r in inc["ranks"] if r["rank"] == 0][0]
        assert stuck["phase"] == "running" and stuck["state"] == "stalled"
        assert inc["outcome"][str(job.procs[0].pid)] == "killed"
        # The stacks show where: the faulthandler dump has the memoryview line.
        dumps = [p for p in inc["evidence"] if p.endswith("-python.txt")]
        assert dumps, inc["evidence"]
        text = "".join(open(p).read() for p in dumps)
        assert "rank_prog.py" in text
        # The native stack (gdb, which reads the frozen rank) shows the main thread
        # inside MLX's eval, called through the buffer protocol.
        native = [p for p in inc["evidence"] if p.endswith("-native.txt") and "rank0" in p]
        assert native, inc["evidence"]
        assert "mlx::core" in open(native[0]).read()


def test_the_backstop_does_not_fire_on_python_work_or_a_quiet_rank(
        tmp_path, record_dir, state_dir):
    """Three jobs at once under one daemon (a Python worker thread at work, Python
    compute, a quiet rank), each for more than five deadlines without progress."""
    seconds = 10
    modes = ("pyworker", "pycompute", "sleeper")
    with DaemonProc(record_dir, state_dir, deadline=1.5, blocked_deadline=60) as daemon, \
            ExitStack() as stack:
        jobs = {mode: stack.enter_context(RingJob(tmp_path / mode, record_dir, 2, mode,
                                                  args=(str(seconds),)))
                for mode in modes}
        for mode, job in jobs.items():
            job.wait_running(collectives=1)
            log = job.log
            wait_for(lambda: f"{mode} started" in log(0), 60,  # noqa: B023 (called here)
                     what=f"{mode} started")
        seen: dict[str, set[str]] = {mode: set() for mode in modes}
        while any(job.procs[0].poll() is None for job in jobs.values()):
            ranks = daemon.ranks()
            for mode, job in jobs.items():
                rank = ranks.get(job.procs[0].pid)
                if rank is not None and job.procs[0].poll() is None:
                    seen[mode].add(rank["state"])
                    assert rank["state"] in ("running", "suspect", "exited"), (mode, rank)
            time.sleep(0.2)
        for mode, job in jobs.items():
            assert job.procs[0].returncode == 0, job.log(0)
            assert f"{mode} done" in job.log(0)
            assert "running" in seen[mode], (mode, seen[mode])
        assert daemon.incidents() == []
