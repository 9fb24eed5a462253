"""One rank of benchmarks/ring_overhead.py (launched by it; not run by hand).

    python ring_rank.py ROUNDS ITERATIONS FLOATS RECORD_DIR

Joins the ring, then runs ROUNDS timed rounds of ITERATIONS
`mx.eval(mx.distributed.all_sum(x))` with x of FLOATS float32. Rounds follow
the pattern plain, instrumented, instrumented, plain (ABBA, repeated), so a
linear drift of the machine cancels: `watchdog.install()` before an
instrumented round, `watchdog.uninstall()` after it. Every rank follows the
same pattern, and a small all_sum lines the ranks up before each round. Prints
one JSON line per round: {"round", "instrumented", "ns"}.
"""

import json
import sys
import time

import mlx.core as mx

import watchdog

ROUNDS, ITERATIONS, FLOATS = (int(a) for a in sys.argv[1:4])
RECORD_DIR = sys.argv[4]

group = mx.distributed.init(backend="ring", strict=True)
rank, size = group.rank(), group.size()
x = mx.ones(FLOATS)
mx.eval(x)
sync = mx.zeros(1)
mx.eval(sync)

for _ in range(max(200, ITERATIONS // 5)):  # warm up the sockets and the caches
    mx.eval(mx.distributed.all_sum(x))

for rnd in range(ROUNDS):
    instrumented = rnd % 4 in (1, 2)
    if instrumented:
        hb = watchdog.install(directory=RECORD_DIR, job="ring-overhead")
        if not hb.active:
            sys.exit("the hook did not install")
    mx.eval(mx.distributed.all_sum(sync))  # line the ranks up
    began = time.perf_counter_ns()
    for _ in range(ITERATIONS):
        y = mx.distributed.all_sum(x)
        mx.eval(y)
    took = time.perf_counter_ns() - began
    if instrumented:
        if hb.collectives < ITERATIONS:
            sys.exit(f"instrumented round counted {hb.collectives} collectives")
        watchdog.uninstall()
    if y[0].item() != size:
        sys.exit(f"WRONG all_sum: {y[0].item()} != {size}")
    print(json.dumps({"rank": rank, "round": rnd, "instrumented": instrumented,
                      "ns": took / ITERATIONS}), flush=True)
