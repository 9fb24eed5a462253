"""One rank of benchmarks/ring_overhead.py (launched by it; not run by hand).

    python ring_rank.py ROUNDS ITERATIONS FLOATS RECORD_DIR

Joins the ring, then runs ROUNDS timed rounds of ITERATIONS
`mx.eval(mx.distributed.all_sum(x))` with x of FLOATS float32, in three kinds:

    plain    MLX as it is
    wrapped  mx.eval and all_sum behind do-nothing Python wrappers: what any
             Python-level instrumentation costs before it does anything
    hook     `watchdog.install()` for the round, `watchdog.uninstall()` after
             (the compiled hot path, where it is built)
    pyhook   the same with the pure-Python hot path (MLX_WATCHDOG_HOTPATH=python)

Rounds cycle plain, wrapped, hook, pyhook, pyhook, hook, wrapped, plain, so a
linear drift of the machine cancels. Every rank follows the same cycle, and a small all_sum
lines the ranks up before each round. Prints one JSON line per round:
{"round", "kind", "ns", "cpu_ns"}: wall time and the main thread's CPU time
(time.thread_time_ns), per collective.
"""

import json
import os
import sys
import time

import mlx.core as mx

import watchdog

ROUNDS, ITERATIONS, FLOATS = (int(a) for a in sys.argv[1:4])
RECORD_DIR = sys.argv[4]
CYCLE = ("plain", "wrapped", "hook", "pyhook", "pyhook", "hook", "wrapped", "plain")

group = mx.distributed.init(backend="ring", strict=True)
rank, size = group.rank(), group.size()
x = mx.ones(FLOATS)
mx.eval(x)
sync = mx.zeros(1)
mx.eval(sync)
plain_eval, plain_all_sum = mx.eval, mx.distributed.all_sum


def wrapped_eval(*args, **kwargs):
    return plain_eval(*args, **kwargs)


def wrapped_all_sum(*args, **kwargs):
    return plain_all_sum(*args, **kwargs)


for _ in range(max(200, ITERATIONS // 5)):  # warm up the sockets and the caches
    mx.eval(mx.distributed.all_sum(x))

for rnd in range(ROUNDS):
    kind = CYCLE[rnd % len(CYCLE)]
    if kind in ("hook", "pyhook"):
        os.environ["MLX_WATCHDOG_HOTPATH"] = "python" if kind == "pyhook" else "auto"
        hb = watchdog.install(directory=RECORD_DIR, job="ring-overhead")
        if not hb.active or hb.compiled != (kind == "hook"):
            sys.exit(f"the hook did not install as {kind}: {hb.hotpath}")
    elif kind == "wrapped":
        mx.eval, mx.distributed.all_sum = wrapped_eval, wrapped_all_sum
    mx.eval(mx.distributed.all_sum(sync))  # line the ranks up
    began, cpu = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(ITERATIONS):
        y = mx.distributed.all_sum(x)
        mx.eval(y)
    took, cpu = time.perf_counter_ns() - began, time.thread_time_ns() - cpu
    if kind in ("hook", "pyhook"):
        if hb.collectives < ITERATIONS:
            sys.exit(f"instrumented round counted {hb.collectives} collectives")
        watchdog.uninstall()
    elif kind == "wrapped":
        mx.eval, mx.distributed.all_sum = plain_eval, plain_all_sum
    if y[0].item() != size:
        sys.exit(f"WRONG all_sum: {y[0].item()} != {size}")
    print(json.dumps({"rank": rank, "round": rnd, "kind": kind, "ns": took / ITERATIONS,
                      "cpu_ns": cpu / ITERATIONS}), flush=True)
