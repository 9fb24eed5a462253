"""Time between the first and the last SIGTERM of one job's ranks, on the real daemon.

One daemon (`mlx-watchdog run`) watches the N ranks of a job (processes of ours named
by records, one of them hung in a wait); its verdict ends them all in the teardown
order: every rank frozen (SIGSTOP), the evidence, then SIGTERM and SIGCONT to every
rank back to back. Each run reads the incident and takes its journaled SIGTERM times
(wall clock, per rank): the spread is the last minus the first. With `--fence`, the
job is ended instead by a signed fence that holds its ranks frozen `--fence` seconds
(a peer's, carrying the moment its origin ends its own ranks).

    python -m benchmarks.term_spread --runs 10 --ranks 4
    python -m benchmarks.term_spread --runs 10 --ranks 4 --fence 0.5

Across two hosts the same figure comes from the two-host bed's test (root, network
namespaces), which prints it among its figures:

    python -m pytest -q -s tests/multihost/test_faults.py -k "stopped_rank and fences"
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


def one_run(daemon: DaemonProc, port: int, job: str, ranks: int,
            hold: float | None) -> tuple[float, float]:
    """The job's SIGTERM spread, and its first SIGSTOP to its first SIGTERM (seconds)."""
    procs = [UserProc(0) for _ in range(ranks)]
    try:
        for rank, proc in enumerate(procs):
            publish(daemon.record_dir, proc.pid, 0, job, world_size=ranks, rank=rank,
                    hung=hold is None and rank == 0)
        wait_for(lambda: all(p.pid in daemon.ranks() for p in procs), 30,
                 what="the ranks watched")
        if hold is not None:
            now = time.time()
            body, headers = fence.make(SECRET, job, "bench", "benchmark", None, now=now,
                                       term_at=now + hold)
            answer = fence.post(f"127.0.0.1:{port}", body, headers, 10.0)
            assert answer.answer is not None, answer
        wait_for(lambda: all(signal.SIGTERM in p.signals() for p in procs), 60,
                 interval=0.005, what="every rank's SIGTERM")
        incident = wait_for(lambda: next((i for i in daemon.incidents()
                                          if i["job"] == job), None), 60, what="the incident")
    finally:
        for proc in procs:
            proc.close()
    sent = [s for s in incident["signals"] if s["result"] == "sent"]
    terms = [s["time"] for s in sent if s["signal"] == "SIGTERM"]
    stops = [s["time"] for s in sent if s["signal"] == "SIGSTOP"]
    assert len(terms) == ranks and len(stops) == ranks, sent
    assert max(stops) < min(terms), sent
    return max(terms) - min(terms), min(terms) - min(stops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--fence", type=float, default=None, metavar="HOLD",
                        help="end the job by a fence holding its ranks frozen HOLD seconds")
    args = parser.parse_args()
    spreads, frozen = [], []
    with tempfile.TemporaryDirectory() as tmp:
        (port,) = free_ports(1)
        record_dir = Path(tmp) / "records"
        record_dir.mkdir(mode=0o1777)
        record_dir.chmod(0o1777)
        daemon = DaemonProc(record_dir, Path(tmp) / "state", listen=f"127.0.0.1:{port}",
                            interval=0.25, secret=SECRET, evidence_timeout=1, grace=1)
        daemon.start()
        try:
            for run in range(args.runs):
                spread, held = one_run(daemon, port, f"job-{run}", args.ranks, args.fence)
                spreads.append(spread)
                frozen.append(held)
                print(f"run {run + 1}: SIGTERMs {spread * 1000:.2f} ms apart, "
                      f"{held * 1000:.0f} ms after the freeze", flush=True)
        finally:
            daemon.stop()
    spreads.sort()
    how = "a verdict" if args.fence is None else f"a fence holding {args.fence:g}s"
    print(f"first to last SIGTERM of a job's {args.ranks} ranks, ended by {how}, "
          f"{args.runs} runs: median {statistics.median(spreads) * 1000:.2f} ms, "
          f"max {spreads[-1] * 1000:.2f} ms; freeze to first SIGTERM median "
          f"{statistics.median(frozen) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
