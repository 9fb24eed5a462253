"""MPI as a first-class backend: real `mpirun` ranks (Open MPI), run as a user runs
them, `mpirun -np 2 -x MLX_WATCHDOG=1 python prog.py`, and the real daemon.

MPI's wait on a peer busy-polls in user space (the JACCL shape): a frozen peer must
still end the job, and a peer computing in Python must still hold it. Both rest on
every rank of one mpirun being one job, which nothing but mpirun's own environment
says. MLX_MPI_LIBNAME, MLX's own variable (`mlx.launch --backend mpi` sets it too), is
passed only where needed: Debian's openmpi-bin ships libmpi.so.40 without the
libmpi.so link MLX looks for (libopenmpi-dev has it). MLX_WATCHDOG_DIR is the test's
own record directory.
Every rank binds loopback (btl tcp on lo, the runtime's oob on lo)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import SUPPORT
from tests.support.ranks import REPO, DaemonProc, base_env, wait_for
from watchdog import record

pytestmark = pytest.mark.ranks

MPI_PROG = SUPPORT / "mpi_prog.py"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp",
          "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
DEADLINE = 2.0


def mpi_libname() -> str | None:
    """None when MLX finds libmpi.so by itself; else the versioned name to give it."""
    for name in ("libmpi.so", "libmpi.so.40", "libmpi.40.dylib"):
        for base in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib",
                     "/usr/local/lib", "/opt/homebrew/lib"):
            if os.path.exists(os.path.join(base, name)):
                return None if name == "libmpi.so" else name
    raise AssertionError("no Open MPI library (libmpi): .ci/run installs openmpi-bin")


class MpiJob:
    """One `mpirun -np SIZE` of tests/support/mpi_prog.py; the ranks' pids come from their
    records."""

    def __init__(self, workdir: Path, record_dir: Path, mode: str, *args: str,
                 size: int = 2) -> None:
        assert shutil.which("mpirun"), "mpirun not found: .ci/run installs openmpi-bin"
        self.record_dir, self.log_path = record_dir, workdir / f"mpirun-{id(self)}.log"
        libname = mpi_libname()
        env = base_env(record_dir, MLX_WATCHDOG="1",
                       **({"MLX_MPI_LIBNAME": libname} if libname else {}))
        env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "PMI"))}
        argv = [*MPIRUN, "-np", str(size), "-x", "MLX_WATCHDOG=1",
                *(["-x", "MLX_MPI_LIBNAME"] if libname else []),
                sys.executable, str(MPI_PROG), mode, *args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=REPO)
        self.size = size
        self.pids: dict[int, int] = {}  # rank -> pid, as the records say

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def records(self) -> dict[int, record.Record]:
        out = {}
        for path in self.record_dir.glob(f"*{record.SUFFIX}"):
            try:
                rec = record.read_path(str(path))
            except record.RecordError:
                continue
            out[rec.rank] = rec
        return out

    def wait_running(self, timeout: float = 60) -> dict[int, record.Record]:
        def ready() -> dict[int, record.Record] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"mpirun exited early ({self.proc.returncode}):\n"
                                     + self.log())
            recs = self.records()
            return recs if len(recs) == self.size and all(
                r.collectives >= 3 for r in recs.values()) else None
        recs = wait_for(ready, timeout, what=f"{self.size} MPI ranks running")
        self.pids = {rank: rec.pid for rank, rec in recs.items()}
        return recs

    def stop(self) -> None:
        for pid in self.pids.values():  # the ranks this job started, by their pid
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> MpiJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


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
