"""The README's commands that run the shipped example job (examples/train.py, with
examples/hosts.json) run as written from the root of the clone, and every rank they
start is watched: its record names one job, its rank and the world size.

What the README's lines cannot carry is in the environment, as a user's shell would
hold it: the record directory (MLX_WATCHDOG_DIR), and for Open MPI here, root's
permission and loopback-only transports (OMPI_* variables, not flags on the line).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from tests.ranks.docs.test_quick_start import user_env
from tests.support import REPO
from tests.unit.docs.test_readme import cli_script, readme, shell_lines
from watchdog import record

pytestmark = pytest.mark.ranks

TIMEOUT = 120
OPEN_MPI_HERE = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                 "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
                 "OMPI_MCA_oob_tcp_if_include": "lo"}


def example_lines() -> list[str]:
    """The README's lines that run examples/train.py here (not those marked macOS)."""
    return [line for line in shell_lines(readme())
            if "examples/train.py" in line and not line.rstrip().endswith("# macOS")]


def run_watched(line: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str],
                                                   set[tuple[str, int, int, str]]]:
    """Run `line` in bash from the clone; every record seen meanwhile, as (job, rank,
    world size, backend)."""
    records = tmp_path / "records"
    records.mkdir()
    env = {**user_env(tmp_path), **OPEN_MPI_HERE, "MLX_WATCHDOG_DIR": str(records)}
    seen: set[tuple[str, int, int, str]] = set()
    done = threading.Event()

    def look() -> None:
        while not done.wait(0.05):
            for path in records.glob(f"*{record.SUFFIX}"):
                try:
                    rec = record.read_path(str(path))
                except (record.RecordError, OSError):
                    continue
                seen.add((rec.job, rec.rank, rec.world_size, rec.backend))

    watcher = threading.Thread(target=look, daemon=True)
    watcher.start()
    try:
        proc = subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    finally:
        done.set()
        watcher.join()
    return proc, seen


def test_the_readme_runs_the_examples_it_ships():
    lines = example_lines()
    assert any(re.match(r"mlx\.launch -n 2 ", line) for line in lines), lines
    assert any("--hostfile examples/hosts.json" in line for line in lines), lines
    assert any(line.startswith("mpirun ") for line in lines), lines
    assert (REPO / "examples" / "hosts.json").is_file()


@pytest.mark.parametrize("line", example_lines())
def test_an_example_command_runs_as_written_and_its_ranks_are_watched(line, tmp_path):
    cli_script()  # fail clearly when the package is not installed
    proc, seen = run_watched(line, tmp_path)
    assert proc.returncode == 0, f"{line!r} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    assert "rank 0 of 2: done" in proc.stdout and "rank 1 of 2: done" in proc.stdout, proc.stdout
    # Once the group formed, both ranks publish one job, their ranks, a world of two.
    formed = {(job, rank) for job, rank, size, _ in seen if size == 2}
    jobs = {job for job, _ in formed}
    assert len(jobs) == 1 and {rank for _, rank in formed} == {0, 1}, seen
    if line.startswith("mpirun"):
        assert {backend for _, _, size, backend in seen if size == 2} == {"mpi"}, seen


def libmpi_unversioned() -> bool:
    return any(os.path.exists(os.path.join(base, "libmpi.so")) for base in (
        "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/local/lib"))


def test_mpirun_without_the_library_name_is_stopped_with_the_advice(tmp_path):
    """The README's mpirun line without MLX_MPI_LIBNAME: where MLX then finds no MPI
    (Debian's openmpi-bin), the example stops and says what to do; never two singletons
    summing alone."""
    (line,) = [line for line in example_lines() if line.startswith("mpirun ")]
    bare = line.replace(" -x MLX_MPI_LIBNAME=libmpi.so.40", "")
    assert bare != line
    proc, _ = run_watched(bare.replace("train.py", "train.py --steps 5"), tmp_path)
    if libmpi_unversioned():  # MLX finds MPI by itself here: one job of two
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode != 0
        assert "MLX found no MPI library" in proc.stdout + proc.stderr
        assert "MLX_MPI_LIBNAME=libmpi.so.40" in proc.stdout + proc.stderr
