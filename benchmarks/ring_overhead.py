"""Time per collective of a real 3-rank MLX ring all_sum loop, with and without the hook.

Three ranks of benchmarks/ring_rank.py on 127.0.0.1, launched directly
(subprocess, MLX_HOSTFILE JSON, MLX_RANK; not mlx.launch), run the same loop
`mx.eval(mx.distributed.all_sum(x))` on a small tensor in rounds of a fixed
number of iterations. Rounds alternate plain / instrumented / instrumented /
plain (the hook installed and uninstalled in the same processes between
rounds), which cancels drift of the machine. Prints the median time per
collective of each kind over the rounds (rank 0's clock, which all ranks
share in lock step), the 10th percentile of each (the rounds least disturbed
by other processes on a shared machine), and the ratio instrumented / plain
(target <= 1.01).

    python benchmarks/ring_overhead.py --rounds 40 --iterations 2000 --floats 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

from ranks import free_ports  # noqa: E402


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_job(workdir: Path, size: int, rounds: int, iterations: int, floats: int
            ) -> list[dict]:
    hostfile = workdir / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(size)]))
    records = workdir / "records"
    records.mkdir()
    procs = []
    try:
        for rank in range(size):
            env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
            env.update(PYTHONPATH=str(REPO), MLX_HOSTFILE=str(hostfile), MLX_RANK=str(rank))
            procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "ring_rank.py"), str(rounds), str(iterations),
                 str(floats), str(records)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                cwd=workdir))
        outs = [p.communicate(timeout=3600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        if p.returncode != 0:
            sys.exit(f"rank {rank} exited {p.returncode}:\n{err}")
    return [json.loads(line) for line in outs[0][0].splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="a multiple of 4 (ABBA)")
    parser.add_argument("--iterations", type=int, default=2000, help="collectives per round")
    parser.add_argument("--floats", type=int, default=16, help="float32 elements per all_sum")
    parser.add_argument("--size", type=int, default=3, help="ranks")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
          f"{os.cpu_count()} cpus", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rounds = run_job(Path(tmp), args.size, args.rounds, args.iterations, args.floats)
    load = os.getloadavg()
    plain = [r["ns"] for r in rounds if not r["instrumented"]]
    instr = [r["ns"] for r in rounds if r["instrumented"]]
    # ABBA quartets: the ratio within each quartet, where drift cancels best.
    quartets = []
    for q in range(len(rounds) // 4):
        a = rounds[4 * q: 4 * q + 4]
        quartets.append((a[1]["ns"] + a[2]["ns"]) / (a[0]["ns"] + a[3]["ns"]))
    mp, mi = statistics.median(plain), statistics.median(instr)
    print(f"{args.size} ranks, {args.floats} float32, {len(rounds)} rounds x "
          f"{args.iterations} all_sum (rank 0):")
    print(f"  plain:        median {mp / 1000:8.2f} us/collective  (min {min(plain) / 1000:.2f},"
          f" max {max(plain) / 1000:.2f})")
    print(f"  instrumented: median {mi / 1000:8.2f} us/collective  (min {min(instr) / 1000:.2f},"
          f" max {max(instr) / 1000:.2f})")
    # The least disturbed rounds: on a shared machine, other processes only add time.
    p10p, p10i = quantile(plain, 0.1), quantile(instr, 0.1)
    print(f"  10th percentile: plain {p10p / 1000:.2f}, instrumented {p10i / 1000:.2f} "
          f"us/collective, ratio {p10i / p10p:.4f}, difference {(p10i - p10p) / 1000:+.2f} us")
    print(f"  ratio instrumented/plain: {mi / mp:.4f} (medians); per-ABBA-quartet ratios: "
          f"median {statistics.median(quartets):.4f}, min {min(quartets):.4f}, "
          f"max {max(quartets):.4f}; difference {(mi - mp) / 1000:+.2f} us")
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
