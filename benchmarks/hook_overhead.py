"""Per-call cost of the heartbeat hook's hot path, in nanoseconds.

In one process (MLX_WATCHDOG unset, so nothing is instrumented at start):

    eval        mx.eval on an already-evaluated array, original vs wrapped
    item        array.item() on an evaluated scalar, original vs wrapped
    all_sum     mx.distributed.all_sum on a size-1 group (no evaluation),
                original vs wrapped
    py call     an empty Python function: the yardstick, since this VM's speed
                varies from run to run and differs from an Apple silicon Mac's
    enter+exit  Heartbeat.enter_wait + Heartbeat.exit_wait, called directly
    collective  Heartbeat.collective, called directly
    wait path   what the hook's wrapper of a wait adds to a do-nothing wrapper of the
                same function (the wrapper opens, closes and counts the wait itself)
    coll. path  the same for the wrapper of a collective

Plain and wrapped are measured in alternating repeats (install, measure,
uninstall, measure, ...) so drift of the machine cancels; each figure is the
median over the repeats of (loop time / iterations), with timeit's loop (its
own cost, the `pass` row, is included in every row, and cancels in the
differences).

Then the interpreter start-up cost of `mlx_watchdog.pth` with MLX_WATCHDOG
unset: two throw-away venvs (no system site-packages) that differ only by
that file, `python -c pass` run alternately in each, wall and CPU time per run; and,
in process, the cost of `site.addpackage` on that one file.

    python -m benchmarks.hook_overhead --iterations 200000 --repeats 9 --startup-runs 100
"""

from __future__ import annotations

import argparse
import os
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import venv
from pathlib import Path

import mlx.core as mx

import watchdog
from watchdog import record
from watchdog.rank import hook, patches

REPO = Path(__file__).resolve().parent.parent
PTH = REPO / "watchdog" / "_pth" / "mlx_watchdog.pth"


def per_call_ns(stmt: str, env: dict, number: int, repeats: int = 1) -> list[float]:
    timer = timeit.Timer(stmt, globals=env)
    return [t * 1e9 / number for t in timer.repeat(repeats, number)]


def hot_path(iterations: int, repeats: int, directory: str) -> dict[str, dict[str, float]]:
    group = mx.distributed.init()  # no hostfile: the size-1 group
    assert group.size() == 1, group.size()
    a = mx.ones(16)
    mx.eval(a)
    scalar = mx.array(1.0)
    mx.eval(scalar)
    def nothing() -> None:
        pass

    env = {"mx": mx, "a": a, "s": scalar, "g": group, "f": nothing}
    cases = {
        "pass": "pass",
        "py call": "f()",  # the yardstick: machines differ, ratios to it travel better
        "eval": "mx.eval(a)",
        "item": "s.item()",
        "all_sum": "mx.distributed.all_sum(a, group=g)",
    }
    plain: dict[str, list[float]] = {k: [] for k in cases}
    wrapped: dict[str, list[float]] = {k: [] for k in cases}
    direct: dict[str, list[float]] = {"enter+exit": [], "collective": [], "wait path": [],
                                      "coll. path": []}

    def passthrough(original):  # a do-nothing wrapper, as cheap as Python allows
        def wrapper(*args, **kwargs):
            return original(*args, **kwargs)
        return wrapper

    def same(x):
        return x

    op_eval, op_sum = record.OP_CODE["eval"], record.OP_CODE["all_sum"]
    for rep in range(repeats):
        order = ("plain", "wrapped") if rep % 2 == 0 else ("wrapped", "plain")
        for which in order:
            if which == "wrapped":
                hb = watchdog.install(directory=directory, job="bench")
                assert hb.active, "the hook did not install"
                assert mx.eval is not patches.applied[0][2]
                for name, stmt in cases.items():
                    wrapped[name] += per_call_ns(stmt, env, iterations)
                henv = {"enter": hb.enter_wait, "leave": hb.exit_wait,
                        "issued": hb.collective, "a": a, "E": op_eval, "S": op_sum}
                direct["enter+exit"] += per_call_ns("leave(enter(E), E)", henv, iterations)
                direct["collective"] += per_call_ns("issued(S, a)", henv, iterations)
                # The hook's own wrappers around a trivial function, against do-nothing ones.
                wenv = {"hw": patches.wrap_wait(hb, abs, op_eval), "pw": passthrough(abs),
                        "hc": patches.wrap_collective(hb, same, op_sum),
                        "pc": passthrough(same), "a": a}
                hook_w, plain_w = (per_call_ns(stmt, wenv, iterations)[0]
                                   for stmt in ("hw(1)", "pw(1)"))
                direct["wait path"].append(hook_w - plain_w)
                hook_c, plain_c = (per_call_ns(stmt, wenv, iterations)[0]
                                   for stmt in ("hc(a)", "pc(a)"))
                direct["coll. path"].append(hook_c - plain_c)
                watchdog.uninstall()
            else:
                for name, stmt in cases.items():
                    plain[name] += per_call_ns(stmt, env, iterations)
    out: dict[str, dict[str, float]] = {}
    for name in cases:
        p, w = statistics.median(plain[name]), statistics.median(wrapped[name])
        out[name] = {"plain": p, "wrapped": w, "overhead": w - p}
    for name, values in direct.items():
        out[name] = {"direct": statistics.median(values)}
    return out


def make_venv(path: Path, with_pth: bool) -> str:
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(path)
    python = str(path / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True,
                             check=True).stdout.strip()
    if with_pth:
        shutil.copy(PTH, Path(purelib) / PTH.name)
    return python


def startup(runs: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "MLX_WATCHDOG"}
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as tmp:
        without = make_venv(Path(tmp) / "without", False)
        with_ = make_venv(Path(tmp) / "with", True)
        check = subprocess.run([with_, "-c", "import sys; print([p for p in sys.path])"],
                               capture_output=True, text=True, env=env, check=True)
        assert "without" not in check.stdout
        times: dict[str, list[float]] = {"without": [], "with": []}
        cpu: dict[str, list[float]] = {"without": [], "with": []}
        for python in (without, with_):  # warm the page cache
            for _ in range(5):
                subprocess.run([python, "-c", "pass"], env=env, check=True)
        for i in range(runs):
            order = (("without", without), ("with", with_))
            for name, python in (order if i % 2 == 0 else order[::-1]):
                began = time.perf_counter()
                pid = os.posix_spawn(python, [python, "-c", "pass"], env)
                _, status, usage = os.wait4(pid, 0)
                times[name].append(time.perf_counter() - began)
                cpu[name].append(usage.ru_utime + usage.ru_stime)
                assert os.waitstatus_to_exitcode(status) == 0
        # In process: what site.py does with the file (open, read, exec the line).
        pth_dir = Path(tmp) / "pthonly"
        pth_dir.mkdir()
        shutil.copy(PTH, pth_dir / PTH.name)
        saved = os.environ.pop("MLX_WATCHDOG", None)
        try:
            before = list(sys.path)
            addpackage = timeit.Timer(
                lambda: site.addpackage(str(pth_dir), PTH.name, set())).repeat(7, 2000)
            sys.path[:] = before
        finally:
            if saved is not None:
                os.environ["MLX_WATCHDOG"] = saved
    return {
        "without_ms": statistics.median(times["without"]) * 1e3,
        "with_ms": statistics.median(times["with"]) * 1e3,
        "without_mean_ms": statistics.fmean(times["without"]) * 1e3,
        "with_mean_ms": statistics.fmean(times["with"]) * 1e3,
        "stdev_ms": statistics.stdev(times["without"] + times["with"]) * 1e3,
        "without_cpu_ms": statistics.fmean(cpu["without"]) * 1e3,
        "with_cpu_ms": statistics.fmean(cpu["with"]) * 1e3,
        # standard error of the difference of the two means (wall)
        "se_ms": (statistics.variance(times["without"]) / runs
                  + statistics.variance(times["with"]) / runs) ** 0.5 * 1e3,
        "addpackage_us": min(addpackage) / 2000 * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--startup-runs", type=int, default=100,
                        help="python -c pass runs per venv (0: skip)")
    args = parser.parse_args()
    if os.environ.get("MLX_WATCHDOG", "0") not in ("", "0") or hook.current() is not None:
        sys.exit("unset MLX_WATCHDOG: this benchmark installs and uninstalls the hook itself")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f} on {os.cpu_count()} cpus; python "
          f"{sys.version.split()[0]}, mlx {mx.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        res = hot_path(args.iterations, args.repeats, tmp)
    print(f"hot path, median of {args.repeats} repeats x {args.iterations} calls (ns/call):")
    print(f"  {'call':<12} {'plain':>8} {'wrapped':>8} {'overhead':>9}")
    for name, r in res.items():
        if "direct" in r:
            print(f"  {name:<12} {'':>8} {r['direct']:8.0f}")
        else:
            print(f"  {name:<12} {r['plain']:8.0f} {r['wrapped']:8.0f} {r['overhead']:9.0f}")
    call = res["py call"]["plain"] - res["pass"]["plain"]
    in_calls = {name: (r.get("direct") or r["overhead"]) / call for name, r in res.items()}
    print(f"  in empty Python calls ({call:.0f} ns here): wrapped eval +{in_calls['eval']:.0f}, "
          f"enter+exit {in_calls['enter+exit']:.0f}, collective {in_calls['collective']:.0f}, "
          f"wait path {in_calls['wait path']:.0f}, collective path "
          f"{in_calls['coll. path']:.0f}")
    if args.startup_runs:
        s = startup(args.startup_runs)
        print(f"interpreter start-up, `python -c pass`, {args.startup_runs} runs each, "
              f"MLX_WATCHDOG unset:")
        print(f"  without the .pth: median {s['without_ms']:.2f} ms (mean "
              f"{s['without_mean_ms']:.2f})")
        print(f"  with the .pth:    median {s['with_ms']:.2f} ms (mean {s['with_mean_ms']:.2f})")
        print(f"  difference: median {s['with_ms'] - s['without_ms']:+.2f} ms, mean "
              f"{s['with_mean_ms'] - s['without_mean_ms']:+.2f} ms +- {s['se_ms']:.2f} "
              f"(standard error; run-to-run stdev {s['stdev_ms']:.2f} ms)")
        print(f"  cpu (user+sys) per run: without {s['without_cpu_ms']:.2f} ms, with "
              f"{s['with_cpu_ms']:.2f} ms, difference "
              f"{s['with_cpu_ms'] - s['without_cpu_ms']:+.2f} ms (ru_utime/ru_stime tick "
              f"granularity applies)")
        print(f"  site.addpackage on the .pth alone, in process: {s['addpackage_us']:.1f} us")


if __name__ == "__main__":
    main()
