"""One `mpirun` of tests/support/mpi_prog.py as a user runs it, `mpirun -np 2 -x
MLX_WATCHDOG=1 python mpi_prog.py MODE`: used by tests/ranks/clients/test_mpirun.py,
the simulated Mac's wedge test and benchmarks/wedge.py (`--backend mpi`).

MLX_MPI_LIBNAME, MLX's own variable (`mlx.launch --backend mpi` sets it too), is passed
only where needed: Debian's openmpi-bin ships libmpi.so.40 without the libmpi.so link
MLX looks for (libopenmpi-dev has it). Every rank binds loopback and talks over TCP
(btl self,tcp on lo, the runtime's oob on lo): no shared memory between the ranks, so
their bytes cross sockets the daemon can read. The environment comes from
`ranks.base_env` looked up at each start, so a plugin or benchmark that patches it
(the simulated Mac's) reaches mpirun and its ranks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.support import SUPPORT, ranks
from tests.support.ranks import REPO, wait_for
from watchdog import record

MPI_PROG = SUPPORT / "mpi_prog.py"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp",
          "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]


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
    records. `env`: more variables for mpirun and (inherited) its ranks, e.g. the wedge
    injector's (tests/support/wedges.py)."""

    def __init__(self, workdir: Path, record_dir: Path, mode: str, *args: str,
                 size: int = 2, env: dict[str, str] | None = None) -> None:
        assert shutil.which("mpirun"), "mpirun not found: .ci/run installs openmpi-bin"
        self.record_dir, self.log_path = record_dir, workdir / f"mpirun-{id(self)}.log"
        libname = mpi_libname()
        full = ranks.base_env(record_dir, MLX_WATCHDOG="1",
                              **({"MLX_MPI_LIBNAME": libname} if libname else {}))
        full = {k: v for k, v in full.items() if not k.startswith(("OMPI_", "PMI"))}
        full.update(env or {})
        argv = [*MPIRUN, "-np", str(size), "-x", "MLX_WATCHDOG=1",
                *(["-x", "MLX_MPI_LIBNAME"] if libname else []),
                sys.executable, str(MPI_PROG), mode, *args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=full,
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

    def wait_running(self, timeout: float = 60,
                     collectives: int = 3) -> dict[int, record.Record]:
        def ready() -> dict[int, record.Record] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"mpirun exited early ({self.proc.returncode}):\n"
                                     + self.log())
            recs = self.records()
            return recs if len(recs) == self.size and all(
                r.collectives >= collectives for r in recs.values()) else None
        recs = wait_for(ready, timeout, what=f"{self.size} MPI ranks running")
        self.pids = {rank: rec.pid for rank, rec in recs.items()}
        return recs

    def gone(self) -> bool:
        """Every rank ended (a zombie counts as ended)."""
        return not any(alive(pid) for pid in self.pids.values())

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
