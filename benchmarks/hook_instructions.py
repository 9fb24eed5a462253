"""Instructions per iteration of an `mx.eval(mx.distributed.all_sum(x))` loop, counted by
valgrind's callgrind: plain MLX, do-nothing Python wrappers, the hook over its compiled hot
path, and the hook over its pure-Python one.

Instruction counts do not depend on what else the machine is doing, so this figure is
repeatable on a shared, loaded machine where timings are not (docs/performance.md). Each
kind runs twice in a process of its own (a group of one, no ring: the collective is
issued and evaluated, the peers' time is left out), with N and 6N iterations; the
difference over 5N is the cost of one iteration, start-up cancelled. Needs valgrind.

    python benchmarks/hook_instructions.py --iterations 1000
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOOP = """
import os, sys, tempfile
import mlx.core as mx
import watchdog
kind, n = sys.argv[1], int(sys.argv[2])
mx.distributed.init()
x = mx.ones(16)
mx.eval(x)
plain_eval, plain_all_sum = mx.eval, mx.distributed.all_sum
if kind == "wrapped":
    def wrapped_eval(*args, **kwargs):
        return plain_eval(*args, **kwargs)
    def wrapped_all_sum(*args, **kwargs):
        return plain_all_sum(*args, **kwargs)
    mx.eval, mx.distributed.all_sum = wrapped_eval, wrapped_all_sum
elif kind in ("hook", "pyhook"):
    os.environ["MLX_WATCHDOG_HOTPATH"] = "python" if kind == "pyhook" else "auto"
    hb = watchdog.install(tempfile.mkdtemp(), job="instructions")
    assert hb.compiled == (kind == "hook"), hb.hotpath
for _ in range(n):
    mx.eval(mx.distributed.all_sum(x))
"""


def instructions(kind: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             "-c", LOOP, kind, str(n)],
            capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or not found:
        sys.exit(f"{kind} x {n} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=1000, help="N")
    n = parser.parse_args().iterations
    per = {}
    for kind in ("plain", "wrapped", "hook", "pyhook"):
        per[kind] = (instructions(kind, 6 * n) - instructions(kind, n)) / (5 * n)
        print(f"  {kind:<8} {per[kind]:10.0f} instructions per iteration", flush=True)
    print(f"the hook adds {per['hook'] - per['plain']:.0f} instructions to plain MLX "
          f"({per['hook'] / per['plain']:.4f}x) and {per['hook'] - per['wrapped']:.0f} to "
          f"do-nothing wrappers ({per['hook'] / per['wrapped']:.4f}x); over the pure-Python "
          f"path {per['pyhook'] - per['plain']:.0f} ({per['pyhook'] / per['plain']:.4f}x) "
          f"and {per['pyhook'] - per['wrapped']:.0f} ({per['pyhook'] / per['wrapped']:.4f}x)")


if __name__ == "__main__":
    main()
