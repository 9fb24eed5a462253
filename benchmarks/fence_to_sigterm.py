"""Time from a peer's `POST /fence` to the local rank's SIGTERM, on the real daemon.

One daemon (`mlx-watchdog run`, a 1 s interval, a secret) watches one process of
ours named by a record (a healthy rank of a 2-rank job, which nothing but the fence
can end); each run posts a signed fence for its job and times until the process
reports SIGTERM (its handler writes to a pipe). What it measures is the daemon's path
from the request to the first signal: authenticate, pick the ranks, queue them for
the loop's thread, wake it, begin the ladder (write-ahead entry, SIGCONT, SIGTERM).

    python -m benchmarks.fence_to_sigterm --runs 20
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.ranks import DaemonProc, free_ports, wait_for
from tests.support.users import UserProc, publish
from watchdog.net import fence

SECRET = "benchmark secret, long enough"


def one_run(daemon: DaemonProc, port: int, job: str) -> float:
    with UserProc(0) as rank:
        publish(daemon.record_dir, rank.pid, 0, job, hung=False, world_size=2)
        wait_for(lambda: rank.pid in daemon.ranks(), 30, what="the rank watched")
        body, headers = fence.make(SECRET, job, "bench", "benchmark", None)
        posted = time.monotonic()
        answer = fence.post(f"127.0.0.1:{port}", body, headers, 10.0)
        assert answer.answer is not None and answer.answer.ending == (rank.pid,), answer
        wait_for(lambda: signal.SIGTERM in rank.signals(), 30, interval=0.0005)
        return time.monotonic() - posted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        (port,) = free_ports(1)
        record_dir = Path(tmp) / "records"
        record_dir.mkdir(mode=0o1777)
        record_dir.chmod(0o1777)
        daemon = DaemonProc(record_dir, Path(tmp) / "state", listen=f"127.0.0.1:{port}",
                            interval=args.interval, secret=SECRET, evidence_timeout=1)
        daemon.start()
        try:
            for run in range(args.runs):
                took = one_run(daemon, port, f"job-{run}")
                times.append(took)
                print(f"run {run + 1}: {took * 1000:.1f} ms", flush=True)
        finally:
            daemon.stop()
    times.sort()
    print(f"POST /fence to the rank's SIGTERM, {args.runs} runs, interval "
          f"{args.interval:g}s: median {statistics.median(times) * 1000:.1f} ms, "
          f"p90 {times[int(0.9 * (len(times) - 1))] * 1000:.1f} ms, "
          f"max {times[-1] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
