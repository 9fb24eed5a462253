"""Instructions per iteration counted by valgrind's callgrind, plain and instrumented.

Two workloads, each in a process of its own (a group of one, no ring: the collectives
are issued and evaluated, the peers' time is left out):

  ring  `mx.eval(mx.distributed.all_sum(x))`, 16 floats: plain MLX, do-nothing Python
        wrappers, the hook over its compiled hot path, over its pure-Python one
  lm    one token of mlx-lm's own `generate_step` on the small random Llama of
        tests/support/lm_prog.py, sharded with `model.shard` (two all_sum per layer): plain,
        and with MLX_WATCHDOG=1 (zero-code activation, as a user runs it) over each
        hot path

Instruction counts do not depend on what else the machine is doing, so these figures
are repeatable on a shared, loaded machine where timings are not (docs/performance.md).
Each kind runs twice, N and 6N iterations; the difference over 5N is the cost of one
iteration, start-up cancelled. Needs valgrind.

    python -m benchmarks.hook_instructions --iterations 1000
    python -m benchmarks.hook_instructions --workload lm --iterations 50
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
LM = """
import resource
import sys
# mlx_lm raises its descriptor limit to 4096 at import, which valgrind (it keeps a few
# descriptors of its own) refuses; a few descriptors are all this loop needs.
raise_limit = resource.setrlimit
def setrlimit(which, limits):
    try:
        raise_limit(which, limits)
    except ValueError:
        pass
resource.setrlimit = setrlimit
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models import llama
kind, n = sys.argv[1], int(sys.argv[2])
group = mx.distributed.init()
mx.random.seed(0)
model = llama.Model(llama.ModelArgs(
    model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256))
model.shard(group)
mx.eval(model.parameters())
prompt = mx.array([(7 * i + 3) % 256 for i in range(16)])
for _ in generate_step(prompt, model, max_tokens=8):  # warm-up
    pass
tokens = sum(1 for _ in generate_step(prompt, model, max_tokens=n))
assert tokens == n, tokens
if kind != "plain":
    import watchdog
    hb = watchdog.current()
    assert hb is not None and hb.published and hb.compiled == (kind == "hook"), kind
"""
KINDS = {"ring": ("plain", "wrapped", "hook", "pyhook"), "lm": ("plain", "hook", "pyhook")}


def instructions(workload: str, kind: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
        env["PYTHONPATH"] = str(REPO)
        if workload == "lm" and kind != "plain":
            env.update(MLX_WATCHDOG="1", MLX_WATCHDOG_DIR=tmp,
                       MLX_WATCHDOG_HOTPATH="python" if kind == "pyhook" else "auto")
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.out",
             sys.executable, "-c", LOOP if workload == "ring" else LM, kind, str(n)],
            capture_output=True, text=True, check=False, env=env)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or not found:
        sys.exit(f"{kind} x {n} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(KINDS), default="ring")
    parser.add_argument("--iterations", type=int, default=1000, help="N")
    parser.add_argument("--kinds", help="a comma-separated subset of the workload's kinds")
    args = parser.parse_args()
    n = args.iterations
    unit = "iteration" if args.workload == "ring" else "token"
    per = {}
    kinds = args.kinds.split(",") if args.kinds else KINDS[args.workload]
    for kind in kinds:
        per[kind] = (instructions(args.workload, kind, 6 * n)
                     - instructions(args.workload, kind, n)) / (5 * n)
        print(f"  {kind:<8} {per[kind]:10.0f} instructions per {unit}", flush=True)
    for kind in per:
        for base in ("plain", "wrapped"):
            if kind in ("hook", "pyhook") and base in per:
                print(f"  {kind}/{base}: {per[kind] / per[base]:.4f} "
                      f"({per[kind] - per[base]:+.0f} instructions per {unit})")


if __name__ == "__main__":
    main()
