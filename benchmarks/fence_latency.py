"""Time from a rank's death to the end of the last rank on the other nodes, via fences.

Three daemons on 127.0.0.1, each with its own record directory (one simulated
node each), watch one rank of a real 3-rank MLX ring job. The ranks sit idle
(no collective in flight, so nothing but the fence can end them). Rank 1 gets
SIGKILL; we time until ranks 0 and 2 are gone.

    python -m benchmarks.fence_latency --runs 10 --interval 0.1
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.ranks import DaemonProc, RingJob, free_ports, wait_for

SECRET = "benchmark secret, long enough"


def one_run(workdir: Path, interval: float) -> float:
    ports = free_ports(3)
    peers = [f"127.0.0.1:{p}" for p in ports]
    daemons = []
    try:
        for i, port in enumerate(ports):
            args = [a for peer in peers if peer != peers[i] for a in ("--peers", peer)]
            d = DaemonProc(workdir / f"node{i}" / "records", workdir / f"node{i}" / "state",
                           *args, listen=f"127.0.0.1:{port}", interval=interval, deadline=600,
                           blocked_deadline=600, secret=SECRET)
            d.record_dir.mkdir(parents=True)
            daemons.append(d.start())
        with RingJob(workdir, [d.record_dir for d in daemons], 3, "idle") as job:
            wait_for(lambda: all(len(d.ranks()) == 1 for d in daemons), 60)
            time.sleep(2 * interval)
            died = time.monotonic()
            job.signal(1, signal.SIGKILL)
            wait_for(lambda: job.procs[0].poll() is not None and job.procs[2].poll() is not None,
                     30, interval=0.002)
            return time.monotonic() - died
    finally:
        for d in daemons:
            d.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args()
    times = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            took = one_run(Path(tmp), args.interval)
        times.append(took)
        print(f"run {run + 1}: {took * 1000:.0f} ms", flush=True)
    times.sort()
    print(f"death to last peer rank ended, {args.runs} runs, interval {args.interval}s: "
          f"median {statistics.median(times) * 1000:.0f} ms, "
          f"p90 {times[int(0.9 * (len(times) - 1))] * 1000:.0f} ms, "
          f"max {times[-1] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
