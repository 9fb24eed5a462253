"""Seconds from a frozen peer to every rank of a real `mlx_lm lora --train` ended, at the
daemon's default settings (only the directories and the address given).

Each run: a fresh daemon and a fresh training job (`python -m mlx_lm lora --train`, 2 ring
ranks on 127.0.0.1, MLX_WATCHDOG=1, the small random Llama of tests/support/lm_server.py and
the dataset of tests/support/lm_train.py), run until the daemon shows both ranks on the
learned deadline, then SIGSTOP of rank 1; the clock stops when both ranks are gone.
Prints one line per run, then the median. docs/performance.md has the figures.

    python -m benchmarks.train_hang --runs 3
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.lm_server import DefaultDaemon, build_model
from tests.support.lm_train import LmTrain, build_dataset
from tests.support.ranks import wait_for


def one_run(base: Path, model: Path, data: Path) -> tuple[float, float, str]:
    """(seconds to every rank ended, the deadline the daemon showed, the verdict)."""
    records, state = base / "records", base / "state"
    records.mkdir(parents=True)
    with DefaultDaemon(records, state) as daemon, \
            LmTrain(base, records, model, data, iters=100000, save_every=1000,
                    eval_every=1000) as job:
        def learned() -> float | None:
            ranks = [r for r in daemon.ranks().values() if r["pid"] in job.pids]
            shown = [r["deadline_seconds"] for r in ranks]
            return max(shown) if len(shown) == 2 and max(shown) < 600 else None
        shown = wait_for(learned, 300, interval=0.5, what="the learned deadline")
        job.signal(1, signal.SIGSTOP)
        froze = time.monotonic()
        wait_for(job.finished, 600, interval=0.1, what="both ranks ended")
        took = time.monotonic() - froze
        verdicts = {i["verdict"] for i in wait_for(daemon.incidents, 30, what="an incident")}
    return took, shown, ",".join(sorted(verdicts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model")
        data = build_dataset(Path(tmp) / "data")
        times = []
        for n in range(args.runs):
            took, shown, verdict = one_run(Path(tmp) / f"run-{n}", model, data)
            times.append(took)
            print(f"  training run {n + 1}: {took:6.1f} s  (deadline shown {shown:g} s, "
                  f"verdict {verdict})", flush=True)
        print(f"  training median {statistics.median(times):6.1f} s over {len(times)} runs "
              f"(min {min(times):.1f}, max {max(times):.1f})", flush=True)


if __name__ == "__main__":
    main()
