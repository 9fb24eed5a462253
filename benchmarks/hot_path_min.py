"""The hook's hot path in empty Python calls, from the fastest of many short timings.

On a shared, loaded machine the median of hook_overhead.py moves by 2x from run to
run; the minimum of many short timings is what the code costs when it gets a core.
Run it from two checkouts alternately to compare two versions of the hook:

    PYTHONPATH=. python -m benchmarks.hot_path_min 15

Prints one JSON line: the empty call's cost in ns, then in empty calls: enter_wait +
exit_wait, collective, and what the hook's wrappers add to do-nothing wrappers of the
same function (wait path, collective path); and the raw minima in ns.
"""
import json
import sys
import tempfile
import timeit

import mlx.core as mx

import watchdog
from watchdog import record
from watchdog.rank import patches

d = tempfile.mkdtemp()
mx.distributed.init()
hb = watchdog.install(d, job="ab")
a = mx.ones(16)
mx.eval(a)
E, S = record.OP_CODE["eval"], record.OP_CODE["all_sum"]


def f():
    pass


def passthrough(o):
    def w(*args, **kwargs):
        return o(*args, **kwargs)
    return w


def same(x):
    return x


env = dict(enter=hb.enter_wait, leave=hb.exit_wait, issued=hb.collective, E=E, S=S, a=a, f=f,
           hw=patches.wrap_wait(hb, abs, E), pw=passthrough(abs),
           hc=patches.wrap_collective(hb, same, S), pc=passthrough(same))
cases = {"pass": "pass", "call": "f()", "enter+exit": "leave(enter(E), E)",
         "collective": "issued(S, a)", "hw": "hw(1)", "pw": "pw(1)", "hc": "hc(a)", "pc": "pc(a)"}
best = {k: float("inf") for k in cases}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 15):
    for k, stmt in cases.items():
        t = timeit.Timer(stmt, globals=env).timeit(20000) / 20000 * 1e9
        best[k] = min(best[k], t)
call = best["call"] - best["pass"]
out = {"call_ns": round(call, 1), "enter+exit": round(best["enter+exit"] / call, 1),
       "collective": round(best["collective"] / call, 1),
       "wait path": round((best["hw"] - best["pw"]) / call, 1),
       "collective path": round((best["hc"] - best["pc"]) / call, 1),
       "ns": {k: round(v) for k, v in best.items()}}
print(json.dumps(out))
watchdog.uninstall()
