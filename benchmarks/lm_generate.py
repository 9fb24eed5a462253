"""Tokens per second of a real mlx-lm client, plain and with MLX_WATCHDOG=1.

Each job is 2 ranks (by default) of tests/support/lm_prog.py in `bench` mode on
127.0.0.1: a small random Llama built with mlx-lm's own classes, sharded with
`model.shard(group)` (two all_sum per layer per token), generating with
mlx-lm's own `generate_step` (one `mx.async_eval` and one `.item()` per
token); one warm-up round, then ROUNDS rounds of TOKENS tokens each, timed on
rank 0. A plain job has no MLX_WATCHDOG; an instrumented one has
MLX_WATCHDOG=1 (zero-code activation, the way an mlx-lm user would run it)
and a record directory of its own, with no daemon reading it. Jobs cycle
plain, hook, hook, plain, which cancels drift of the machine. Prints the
tokens per second of each kind (median, min, max over jobs) and the ratio
hook/plain per cycle (median, min, max).

    python -m benchmarks.lm_generate --cycles 8 --tokens 128 --rounds 3

With `--inprocess`, one job instead, whose ranks install and uninstall the
hook between rounds (plain, hook, hook, plain per cycle, every rank alike):
the same code as MLX_WATCHDOG=1 runs, and the large differences between one
job and the next on a shared machine (which of the other processes the ranks
share cores with) drop out of the ratio.

    python -m benchmarks.lm_generate --inprocess --cycles 12 --tokens 256
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.launch import run_ranks
from tests.support.ranks import LM_PROG


def run_job(workdir: Path, size: int, tokens: int, rounds: int, hook: bool,
            pin: bool = False) -> tuple[float, float]:
    """One job; rank 0's tokens per second, and its main thread's CPU us per token."""
    records = workdir / "records"
    records.mkdir(exist_ok=True)
    env = {"MLX_WATCHDOG": "1", "MLX_WATCHDOG_DIR": str(records)} if hook else {}
    outs = run_ranks(workdir, size, [str(LM_PROG), "bench", str(tokens), str(rounds)], env,
                     timeout=600, pin=pin)
    timed = [json.loads(line) for line in outs[0][0].splitlines() if line.startswith("{")]
    if len(timed) != rounds or any(t["tokens"] != tokens for t in timed):
        sys.exit(f"rank 0 reported {timed}")
    count = sum(t["tokens"] for t in timed)
    return count / sum(t["seconds"] for t in timed), sum(t["main_cpu"] for t in timed) / count * 1e6


def run_toggle(workdir: Path, size: int, tokens: int, cycles: int, pin: bool = False
               ) -> list[dict]:
    """One job toggling the hook between rounds; rank 0's rounds in order."""
    records = workdir / "records"
    records.mkdir(exist_ok=True)
    outs = run_ranks(workdir, size, [str(LM_PROG), "toggle", str(tokens), str(cycles),
                                     str(records)], pin=pin)
    rounds = [json.loads(line) for line in outs[0][0].splitlines() if line.startswith("{")]
    if len(rounds) != 4 * cycles or any(r["tokens"] != tokens for r in rounds):
        sys.exit(f"rank 0 reported {rounds}")
    return rounds


def report_toggle(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rounds = run_toggle(Path(tmp), args.size, args.tokens, args.cycles, args.pin)
    rates = {kind: [r["tokens"] / r["seconds"] for r in rounds if r["kind"] == kind]
             for kind in ("plain", "hook")}
    ratios = []
    for c in range(args.cycles):
        cycle = rounds[4 * c: 4 * c + 4]
        seconds = {kind: sum(r["seconds"] for r in cycle if r["kind"] == kind)
                   for kind in rates}
        ratios.append(seconds["plain"] / seconds["hook"])  # tokens/s hook over plain
    print(f"{args.size} ranks, mlx-lm generate_step, one job, {args.cycles} cycles "
          f"(plain, hook, hook, plain) x {args.tokens} tokens, tokens/s (rank 0):")
    for kind, values in rates.items():
        print(f"  {kind:<6} median {statistics.median(values):8.1f}  min {min(values):8.1f}  "
              f"max {max(values):8.1f}")
    medians = statistics.median(rates["hook"]) / statistics.median(rates["plain"])
    print(f"  ratio hook/plain: {medians:.4f} (medians); per cycle: median "
          f"{statistics.median(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}")
    print_cpu({kind: [r["main_cpu"] / r["tokens"] * 1e6 for r in rounds if r["kind"] == kind]
               for kind in rates})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=8, help="cycles of 4 jobs (ABBA)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per job")
    parser.add_argument("--size", type=int, default=2, help="ranks")
    parser.add_argument("--pin", action="store_true",
                        help="each rank on a core of its own (rank %% cores), Linux only")
    parser.add_argument("--inprocess", action="store_true",
                        help="one job, the hook installed and uninstalled between rounds")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
          f"{os.cpu_count()} cpus", flush=True)
    if args.inprocess:
        report_toggle(args)
        load = os.getloadavg()
        print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        return
    rates: dict[str, list[float]] = {"plain": [], "hook": []}
    cpus: dict[str, list[float]] = {"plain": [], "hook": []}
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for cycle in range(args.cycles):
            got: dict[str, list[float]] = {"plain": [], "hook": []}
            for n, kind in enumerate(("plain", "hook", "hook", "plain")):
                workdir = Path(tmp) / f"c{cycle}-{n}"
                workdir.mkdir()
                rate, cpu = run_job(workdir, args.size, args.tokens, args.rounds,
                                    kind == "hook", args.pin)
                got[kind].append(rate)
                cpus[kind].append(cpu)
            for kind, values in got.items():
                rates[kind] += values
            ratios.append(statistics.mean(got["hook"]) / statistics.mean(got["plain"]))
            print(f"  cycle {cycle + 1}: plain {' '.join(f'{r:.1f}' for r in got['plain'])}, "
                  f"hook {' '.join(f'{r:.1f}' for r in got['hook'])} tokens/s; "
                  f"ratio {ratios[-1]:.4f}", flush=True)
    load = os.getloadavg()
    print(f"{args.size} ranks, mlx-lm generate_step, {args.cycles * 2} jobs of each kind x "
          f"{args.rounds} rounds x {args.tokens} tokens, tokens/s (rank 0):")
    for kind, values in rates.items():
        print(f"  {kind:<6} median {statistics.median(values):8.1f}  min {min(values):8.1f}  "
              f"max {max(values):8.1f}")
    medians = statistics.median(rates["hook"]) / statistics.median(rates["plain"])
    print(f"  ratio hook/plain: {medians:.4f} (medians); per cycle: median "
          f"{statistics.median(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}")
    print_cpu(cpus)
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def print_cpu(cpus: dict[str, list[float]]) -> None:
    plain, hook = statistics.median(cpus["plain"]), statistics.median(cpus["hook"])
    print(f"  rank 0's main thread, CPU per token (median): plain {plain:.1f}, hook "
          f"{hook:.1f} us ({hook - plain:+.1f} us)")


if __name__ == "__main__":
    main()
