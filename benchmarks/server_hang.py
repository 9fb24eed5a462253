"""Seconds from a frozen peer to every rank of a real `mlx_lm.server` ended, at the
daemon's default settings (only the directories and the address given).

Each run: a fresh daemon and a fresh server (`python -m mlx_lm.server`, 2 ring ranks on
127.0.0.1, MLX_WATCHDOG=1, the small random Llama of tests/support/lm_server.py), four chat
requests, then either 10 s idle (`idle`) or a 4000-token request under way for 3 s
(`generating`), then SIGSTOP of rank 1; the clock stops when both ranks are gone.
Prints one line per run, then the median per mode. docs/performance.md has the figures.

    python -m benchmarks.server_hang --runs 3
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

from tests.support.lm_server import DefaultDaemon, LmServer, build_model
from tests.support.ranks import wait_for


def one_run(base: Path, model: Path, mode: str) -> tuple[float, float, str]:
    """(seconds to every rank ended, the deadline the daemon showed, the verdict)."""
    records, state = base / "records", base / "state"
    records.mkdir(parents=True)
    with DefaultDaemon(records, state) as daemon, LmServer(base, records, model) as server:
        for n in range(4):
            server.chat(f"hello {n}", 16)
        if mode == "idle":
            time.sleep(10)
        else:
            threading.Thread(target=lambda: _quiet(server), daemon=True).start()
            time.sleep(3)
        shown = max(r["deadline_seconds"] for r in daemon.ranks().values())
        server.signal(1, signal.SIGSTOP)
        froze = time.monotonic()
        wait_for(lambda: all(p.poll() is not None for p in server.procs), 600, interval=0.1,
                 what="both ranks ended")
        took = time.monotonic() - froze
        verdicts = {i["verdict"] for i in wait_for(daemon.incidents, 30, what="an incident")}
    return took, shown, ",".join(sorted(verdicts))


def _quiet(server: LmServer) -> None:
    try:
        server.chat("tell me a long story", 4000, timeout=900)
    except Exception as err:  # the server is torn down under it
        print(f"  (the request in flight ended: {err!r})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="idle,generating")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model")
        for mode in args.modes.split(","):
            times = []
            for n in range(args.runs):
                took, shown, verdict = one_run(Path(tmp) / f"{mode}-{n}", model, mode)
                times.append(took)
                print(f"  {mode:10s} run {n + 1}: {took:6.1f} s  (deadline shown {shown:g} s, "
                      f"verdict {verdict})", flush=True)
            print(f"  {mode:10s} median {statistics.median(times):6.1f} s over {len(times)} "
                  f"runs (min {min(times):.1f}, max {max(times):.1f})", flush=True)


if __name__ == "__main__":
    main()
