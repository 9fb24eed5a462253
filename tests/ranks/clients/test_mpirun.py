"""MPI as a first-class backend: real `mpirun` ranks (Open MPI), run as a user runs
them, `mpirun -np 2 -x MLX_WATCHDOG=1 python prog.py`, and the real daemon.

MPI's wait on a peer busy-polls in user space (the JACCL shape): a frozen peer must
still end the job, and a peer computing in Python must still hold it. Both rest on
every rank of one mpirun being one job, which nothing but mpirun's own environment
says. MLX_MPI_LIBNAME, MLX's own variable (`mlx.launch --backend mpi` sets it too), is
passed only where needed (tests/support/mpi.py). MLX_WATCHDOG_DIR is the test's own
record directory. Every rank binds loopback (btl tcp on lo, the runtime's oob on lo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.mpi import MpiJob, alive
from tests.support.ranks import REPO, DaemonProc, base_env, wait_for

pytestmark = pytest.mark.ranks

DEADLINE = 2.0


def test_one_mpirun_is_one_job_of_two_ranks_in_status(tmp_path, record_dir, state_dir):
    with MpiJob(tmp_path, record_dir, "loop") as job:
        recs = job.wait_running()
        assert {r.job for r in recs.values()} == {recs[0].job} and recs[0].job.startswith("j")
        done = subprocess.run([sys.executable, "-m", "watchdog.cli", "status", "--json",
                               "--dir", str(record_dir), "--state-dir", str(state_dir)],
                              capture_output=True, text=True, timeout=60,
                              env=base_env(record_dir), cwd=REPO)
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)
        assert sorted((r["job"], r["rank"], r["world_size"], r["backend"]) for r in shown) == [
            (recs[0].job, 0, 2, "mpi"), (recs[0].job, 1, 2, "mpi")]
        assert {r["state"] for r in shown} <= {"running", "suspect"}, shown


def test_a_frozen_mpi_peer_is_ended_with_its_job(tmp_path, record_dir, state_dir):
    with DaemonProc(record_dir, state_dir, deadline=DEADLINE) as daemon, \
            MpiJob(tmp_path, record_dir, "loop") as job:
        job.wait_running()
        # Its wait polls in user space: no wait share, and every rank says so (issue 47).
        notes = wait_for(lambda: (n if all(n) else None) if (n := [
            (daemon.ranks().get(pid) or {}).get("pace_note") for pid in job.pids.values()])
            else None, 20, what="each MPI rank's pace note")
        assert all("mpi backend polls in user space" in n for n in notes), notes
        os.kill(job.pids[1], signal.SIGSTOP)
        frozen = time.monotonic()
        wait_for(lambda: not any(alive(p) for p in job.pids.values()), 30,
                 what="both MPI ranks ended")
        ended = time.monotonic() - frozen
        inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
        assert inc["verdict"] == "stalled", inc
        assert inc["culprit"]["pid"] == job.pids[1] and inc["culprit"]["state"] == "stopped"
        assert sorted(inc["pids"]) == sorted(job.pids.values())  # the job, not one rank
        assert set(inc["outcome"].values()) <= {"killed", "gone"}, inc["outcome"]
        # The survivor's wait polls in user space, like JACCL's.
        assert inc["busiest_thread_cpu"] >= 0.3, inc
        assert ended < DEADLINE + 12, f"{ended:.1f}s from the freeze to the job's end"


def test_an_mpi_peer_computing_in_python_is_held(tmp_path, record_dir, state_dir):
    compute = 3 * DEADLINE
    with DaemonProc(record_dir, state_dir, deadline=DEADLINE) as daemon, \
            MpiJob(tmp_path, record_dir, "slowpeer", str(compute)) as job:
        job.wait_running(timeout=60)
        wait_for(lambda: "computing" in job.log(), 30, what="rank 1 computing")
        held = False
        while job.proc.poll() is None:
            r0 = daemon.ranks().get(job.pids[0])
            if r0 and "held" in r0["reason"]:
                held = True
                assert r0["state"] == "suspect", r0
            time.sleep(0.2)
        assert job.proc.returncode == 0, job.log()
        assert job.log().count("done") == 2
        assert daemon.incidents() == []
        assert held, "rank 0 was never seen past its deadline: the test proved nothing"
