"""Run the ranks of one ring job on 127.0.0.1 and collect what they print (benchmarks only).

Each rank is `python SCRIPT ARGS...` with MLX_HOSTFILE (a JSON list of fresh ports)
and MLX_RANK set, the rest of the MLX_ environment cleared (but MLX_WATCHDOG_HOTPATH,
so a benchmark can be run over either hot path), and PYTHONPATH at the repository.
With `pin`, rank r runs on core r % cores from its start (every thread it starts
inherits that), which takes the scheduler's moves between cores out of the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.ranks import free_ports

REPO = Path(__file__).resolve().parent.parent

def run_ranks(workdir: Path, size: int, argv: list[str], env: dict[str, str] | None = None,
              timeout: float = 3600, pin: bool = False) -> list[tuple[str, str]]:
    """Start `size` ranks, wait for all; (stdout, stderr) of each. Exits on a failed rank."""
    hostfile = workdir / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(size)]))
    cores = os.cpu_count() or 1
    procs = []
    try:
        for rank in range(size):
            rank_env = {k: v for k, v in os.environ.items()
                        if not k.startswith("MLX_") or k == "MLX_WATCHDOG_HOTPATH"}
            rank_env.update(PYTHONPATH=str(REPO), MLX_HOSTFILE=str(hostfile),
                            MLX_RANK=str(rank), **(env or {}))
            core = {rank % cores}
            procs.append(subprocess.Popen(
                [sys.executable, *argv], env=rank_env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, cwd=workdir,
                preexec_fn=(lambda c=core: os.sched_setaffinity(0, c)) if pin else None))
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        if p.returncode != 0 or "mlx-watchdog:" in err:
            sys.exit(f"rank {rank} exited {p.returncode}:\n{err}")
    return outs
