"""A user's MPI program, as a user runs it: `mpirun -np 2 -x MLX_WATCHDOG=1 python
mpi_prog.py MODE [S]`. It never imports watchdog (MLX_WATCHDOG=1 instruments it) and
calls `mx.distributed.init()` with no backend, which picks MPI under mpirun.

Modes:
  loop        checked all_sum rounds forever
  slowpeer S  a few rounds, then rank 1 computes in Python for S seconds while rank 0
              waits in the next all_sum for it; a few more rounds; "done"; exit 0
"""

import sys
import time

import mlx.core as mx

MODE = sys.argv[1]
ARG = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0

group = mx.distributed.init()
rank, size = group.rank(), group.size()
print(f"rank {rank} of {size} up", flush=True)


def one_round():
    got = mx.distributed.all_sum(mx.ones(16))[0].item()
    if got != size:
        print(f"WRONG all_sum: {got} != {size}", flush=True)
        sys.exit(3)


if MODE == "loop":
    rounds = 0
    while True:
        one_round()
        rounds += 1
        if rounds % 500 == 0:
            print(f"round {rounds}", flush=True)
elif MODE == "slowpeer":
    for _ in range(20):
        one_round()
    if rank == 1:
        print("computing", flush=True)
        end, n = time.monotonic() + ARG, 0
        while time.monotonic() < end:
            n += 1  # pure Python: the user's own work, outside any MLX call
    for _ in range(20):
        one_round()
    print("done", flush=True)
else:
    sys.exit(f"unknown mode {MODE}")
