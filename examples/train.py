"""A small distributed MLX job to watch: every step computes a little and sums one
array over all ranks with `mx.distributed.all_sum`, checking the result.

It never imports mlx-watchdog: start it with MLX_WATCHDOG=1 and the hook instruments
it (see the README, "Instrumenting a job"). Two ranks on this machine:

    mlx.launch -n 2 --env MLX_WATCHDOG=1 python3 examples/train.py
    mlx.launch --hostfile examples/hosts.json --env MLX_WATCHDOG=1 python3 examples/train.py
    mpirun -np 2 -x MLX_WATCHDOG=1 -x MLX_MPI_LIBNAME=libmpi.so.40 python3 examples/train.py

While it runs, `mlx-watchdog status` lists its ranks; `kill -STOP` one of them and
the other hangs in its all_sum, which is what the watchdog is for.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import mlx.core as mx


def launched_ranks() -> int:
    """How many processes the launcher says it started (MPI's variables), else 0."""
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps to run (default 200)")
    parser.add_argument("--pause", type=float, default=0.02,
                        help="seconds each step sleeps, as if loading data (default 0.02)")
    args = parser.parse_args()

    group = mx.distributed.init()
    rank, size = group.rank(), group.size()
    launched = launched_ranks()
    if launched > 1 and size == 1:
        # mpirun started several processes, but MLX found no MPI library: each runs
        # alone as rank 0 of 1, and their sums are nobody's.
        print(f"train.py: mpirun started {launched} processes but MLX found no MPI "
              "library (libmpi.so), so each would run alone as rank 0 of 1. Name "
              "the library: `mpirun -x MLX_MPI_LIBNAME=libmpi.so.40 ...` (Debian's and "
              "Ubuntu's openmpi-bin), or install libopenmpi-dev, which has libmpi.so.",
              file=sys.stderr)
        return 2
    print(f"rank {rank} of {size} up", flush=True)
    weights = mx.random.normal((64, 64), key=mx.random.key(rank))
    for step in range(1, args.steps + 1):
        weights = weights @ mx.random.normal((64, 64)) / 8.0  # the rank's own work
        total = mx.distributed.all_sum(mx.ones(16))  # waits for every rank
        if total[0].item() != size:
            print(f"rank {rank}: all_sum gave {total[0].item()}, not {size}", file=sys.stderr)
            return 1
        mx.eval(weights)
        if step % 50 == 0 or step == args.steps:
            print(f"rank {rank}: step {step}/{args.steps}", flush=True)
        time.sleep(args.pause)
    print(f"rank {rank} of {size}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
