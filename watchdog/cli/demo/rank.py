"""One rank of `mlx-watchdog demo`: `python -m watchdog.cli.demo.rank [--trigger PATH]`.

A small instrumented MLX ring job: every round is one `all_sum` whose result
is checked, then `hb.step()` and a short pause standing in for real work. The
launcher sets MLX_HOSTFILE, MLX_RANK and MLX_WATCHDOG_DIR.

With `--trigger PATH` (the `mismatch` fault), rank 0 watches for that file.
Once it appears, rank 0 raises a flag inside the next `all_sum`, so every
rank leaves the loop after the same round; then rank 0 posts a `recv` from
rank 1 that rank 1 never sends, while the other ranks go on to wait for work
outside MLX. Rank 0 then waits forever: the hang the watchdog must end.

Ships inside the package (the tests are not installed). Exit codes: 0 never
(the ranks run until they are ended), 3 a wrong all_sum, 4 the recv returned.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import cast

PAUSE = 0.01  # seconds of "work" between collectives: keeps 3 ranks light on 2 cores


def main(argv: list[str] | None = None) -> int:
    """Run one demo rank: a checked ring all_sum per step; off script, rank 0 waits in a recv."""
    parser = argparse.ArgumentParser(prog="watchdog.cli.demo.rank")
    parser.add_argument("--trigger", help="mismatch fault: rank 0 goes off script once "
                        "this file exists")
    args = parser.parse_args(argv)

    import mlx.core as mx

    import watchdog

    hb = watchdog.install()
    group = mx.distributed.init(backend="ring", strict=True)
    rank, size = group.rank(), group.size()
    print(f"rank {rank} of {size} up (pid {os.getpid()})", flush=True)

    step = 0
    while True:
        off_script = bool(args.trigger and rank == 0 and os.path.exists(args.trigger))
        x = mx.distributed.all_sum(mx.array([1.0, 1.0 if off_script else 0.0]))
        mx.eval(x)
        total, flag = cast("list[float]", x.tolist())
        if total != size:
            print(f"WRONG all_sum at step {step}: {total} != {size}", flush=True)
            return 3
        step += 1
        hb.step()
        if flag > 0:
            break
        time.sleep(PAUSE)

    print(f"rank {rank}: leaving the loop after step {step}", flush=True)
    if rank == 0:
        print("rank 0: posting a recv from rank 1, which never sends", flush=True)
        mx.eval(mx.distributed.recv((4,), mx.float32, 1))
        print("rank 0: the recv returned (it should not have)", flush=True)
        return 4
    while True:  # the step is over for us: wait for work, outside MLX
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
