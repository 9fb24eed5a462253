"""Time per collective of a real MLX ring all_sum loop, with and without the hook.

N ranks (3 by default) of benchmarks/ring_rank.py on 127.0.0.1, launched
directly (subprocess, MLX_HOSTFILE JSON, MLX_RANK; not mlx.launch), run the
same loop `mx.eval(mx.distributed.all_sum(x))` on a small tensor in rounds of
a fixed number of iterations, of three kinds: plain MLX, the two calls behind
do-nothing Python wrappers, the hook installed (the compiled hot path), and the
hook with the pure-Python hot path (each uninstalled again after its round, in
the same processes). Rounds cycle plain, wrapped, hook, pyhook, pyhook, hook,
wrapped, plain, which cancels drift of the machine. Prints the median, 10th
percentile, min and max time per collective of each kind (rank 0's clock;
the ranks run in lock step) and the ratios hook/plain (target <= 1.05),
wrapped/plain (what a Python wrapper alone does to the figure),
hook/wrapped (what the hook adds beyond that; target <= 1.02) and the same
for the pure-Python path, and the main thread's CPU time per collective of
each kind: what the instrumentation really costs in place, caches cold and
cores shared, as opposed to a warm micro-benchmark.

    python -m benchmarks.ring_overhead --rounds 48 --iterations 2000 --floats 16 --size 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks.launch import run_ranks

HERE = Path(__file__).resolve().parent

def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_job(workdir: Path, size: int, rounds: int, iterations: int, floats: int,
            pin: bool = False) -> list[dict]:
    records = workdir / "records"
    records.mkdir()
    outs = run_ranks(workdir, size, [str(HERE / "ring_rank.py"), str(rounds), str(iterations),
                                     str(floats), str(records)], pin=pin)
    return [json.loads(line) for line in outs[0][0].splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=48, help="a multiple of 8")
    parser.add_argument("--iterations", type=int, default=2000, help="collectives per round")
    parser.add_argument("--floats", type=int, default=16, help="float32 elements per all_sum")
    parser.add_argument("--size", type=int, default=3, help="ranks")
    parser.add_argument("--pin", action="store_true",
                        help="each rank on a core of its own (rank %% cores), Linux only")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
          f"{os.cpu_count()} cpus", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rounds = run_job(Path(tmp), args.size, args.rounds, args.iterations, args.floats,
                         args.pin)
    load = os.getloadavg()
    ns = {kind: [r["ns"] for r in rounds if r["kind"] == kind]
          for kind in ("plain", "wrapped", "hook", "pyhook")}
    # Within each cycle of eight rounds (ABCDDCBA) drift cancels best.
    cycles = [rounds[8 * c: 8 * c + 8] for c in range(len(rounds) // 8)]

    def cycle_ratio(kind: str, base: str) -> list[float]:
        return [sum(r["ns"] for r in cyc if r["kind"] == kind)
                / sum(r["ns"] for r in cyc if r["kind"] == base) for cyc in cycles]

    print(f"{args.size} ranks, {args.floats} float32, {len(rounds)} rounds x "
          f"{args.iterations} all_sum (rank 0), us per collective:")
    print(f"  {'kind':<8} {'median':>8} {'p10':>8} {'min':>8} {'max':>8}")
    for kind, values in ns.items():
        print(f"  {kind:<8} {statistics.median(values) / 1000:8.2f} "
              f"{quantile(values, 0.1) / 1000:8.2f} {min(values) / 1000:8.2f} "
              f"{max(values) / 1000:8.2f}")
    cpu = {kind: statistics.median(r["cpu_ns"] for r in rounds if r["kind"] == kind) / 1000
           for kind in ns}
    print(f"  main thread's CPU per collective (median): plain {cpu['plain']:.2f}, wrapped "
          f"{cpu['wrapped']:.2f}, hook {cpu['hook']:.2f}, pyhook {cpu['pyhook']:.2f} us; "
          f"the hook adds {cpu['hook'] - cpu['plain']:+.2f} us (pure Python: "
          f"{cpu['pyhook'] - cpu['plain']:+.2f})")
    for kind, base in (("hook", "plain"), ("wrapped", "plain"), ("hook", "wrapped"),
                       ("pyhook", "plain"), ("pyhook", "wrapped")):
        ratios = cycle_ratio(kind, base)
        medians = statistics.median(ns[kind]) / statistics.median(ns[base])
        print(f"  ratio {kind}/{base}: {medians:.4f} (medians); per cycle: median "
              f"{statistics.median(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}")
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
