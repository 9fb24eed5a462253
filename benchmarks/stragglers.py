"""A straggler: how fast the daemon names it, how close its slowdown is, what it costs.

Two parts.

1. The judge's own cost (in process, no ranks): `Stragglers.observe` and `judge_job`
   over synthetic samples of N ranks, per rank and scan, and the one read the Linux
   probe adds per rank and scan for it (major faults, `/proc/<pid>/stat`). At a 1 s
   interval a rank's share of a core is that time per second. Target (issue 39): the
   daemon's CPU per rank stays <= 0.5% of a core.

2. A real job (unless --no-ranks): 2 ring ranks of tests/support/rank_prog.py `work`
   (matmuls and an all_sum in one eval), the real daemon (interval 1 s, the default).
   `--healthy S` seconds of the job in step, counting the scans that name a straggler
   (target: none); then rank 1 computes in Python a healthy step's time before each step
   (half pace) and the script times how long until the daemon names it (target <= 60 s), and,
   once the window holds only slow steps, the named slowdown against the true one
   (how much faster rank 1's steps were without that extra; target within 20%). The
   daemon's CPU (psutil) over the run, per rank, is printed too.

    python -m benchmarks.stragglers --healthy 120 --runs 3
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

import psutil

from tests.support.ranks import DaemonProc, RingJob, wait_for
from watchdog.daemon.judge import stragglers
from watchdog.daemon.probes import ProcessSample
from watchdog.daemon.probes.linux import read_major_faults
from watchdog.record import Record
from watchdog.states import Phase

RECORD = Record(
    pid=1, start_time=1.7e9, uid=0, rank=0, world_size=8, dump_signal=0, status=0,
    host="bench", job="bench", backend="ring", seq=2, collectives=0, waits_entered=0,
    waits_completed=0, steps=0, phase=Phase.WAIT, op="eval", phase_since_ns=0,
    wait_since_ns=1, last_progress_ns=0, last_wait_ns=0, max_wait_ns=0,
    expect_seconds=0.0, expect_since_ns=0, expect_reason="", flight=())


def judge_cost(ranks: int, scans: int) -> tuple[float, float]:
    """(µs of the judge per rank and scan, µs of the faults read per rank and scan)."""
    judge = stragglers.Stragglers()
    threads = 12  # an MLX rank: the main thread, the stream, a pool, the ring's
    records = [dataclasses.replace(RECORD, pid=i, rank=i) for i in range(ranks)]
    began = time.perf_counter()
    for scan in range(scans):
        for i, rec in enumerate(records):
            t = scan * 1.0
            sample = ProcessSample(
                i, 1.7e9, 0, "running",
                tuple((k, t * (0.1 + 0.01 * k)) for k in range(threads)),
                tuple((k, t * 0.05) for k in range(threads)),
                demand=tuple((k, t * (0.12 + 0.01 * k)) for k in range(threads)),
                major_faults=scan)
            judge.observe(i, dataclasses.replace(rec, collectives=scan * 40), sample, t)
        judge.judge_job("bench", list(range(ranks)), scan * 1.0)
    per = (time.perf_counter() - began) / scans / ranks * 1e6
    pid = os.getpid()
    began = time.perf_counter()
    for _ in range(2000):
        read_major_faults(pid)
    return per, (time.perf_counter() - began) / 2000 * 1e6


def real_run(base: Path, healthy: float) -> dict[str, float]:
    records, state, flag = base / "records", base / "state", base / "slow"
    records.mkdir(parents=True)
    with DaemonProc(records, state, interval=1.0, deadline=60) as daemon, \
            RingJob(base, records, 2, "work", args=("4", str(flag))) as job:
        job.wait_running(collectives=5)
        proc = psutil.Process(daemon.proc.pid)  # type: ignore[union-attr]
        cpu0, wall0 = sum(proc.cpu_times()[:2]), time.monotonic()
        looks = named = 0
        end = time.monotonic() + healthy
        while time.monotonic() < end:
            looks += 1
            named += bool(daemon.status()["stragglers"])
            time.sleep(1.0)
        flag.touch()
        slowed = time.monotonic()
        wait_for(lambda: daemon.status()["stragglers"], 120, interval=0.5,
                 what="the straggler named")
        took = time.monotonic() - slowed
        time.sleep(max(0.0, slowed + stragglers.WINDOW + 2 - time.monotonic()))
        found = daemon.status()["stragglers"][0]
        now = time.monotonic()
        steps = [tuple(map(float, line.split()[2:5])) for line in job.log(1).splitlines()
                 if line.startswith("slow step ")]
        recent = [(t, s) for t, s, at in steps if at >= now - stragglers.WINDOW]
        true = sum(t for t, _ in recent) / sum(t - s for t, s in recent)
        cpu = (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - wall0)
        return {"healthy_scans": looks, "healthy_named": named, "took": took,
                "slowdown": found["slowdown"], "true": true, "rank": found["rank"],
                "daemon_cpu_per_rank": cpu / 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="ranks of the judge's cost")
    parser.add_argument("--scans", type=int, default=2000)
    parser.add_argument("--healthy", type=float, default=60.0,
                        help="seconds of the job in step before rank 1 is slowed")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--no-ranks", action="store_true", help="only the judge's cost")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    per, faults = judge_cost(args.ranks, args.scans)
    print(f"judge: {per:.1f} µs per rank and scan ({per / 1e4:.4f}% of a core at 1 s); "
          f"major faults read: {faults:.1f} µs")
    for n in range(0 if args.no_ranks else args.runs):
        with tempfile.TemporaryDirectory(prefix="mlxwd-stragglers-") as tmp:
            got = real_run(Path(tmp), args.healthy)
        err = (got["slowdown"] - got["true"]) / got["true"]
        print(f"run {n + 1}: healthy {got['healthy_named']:.0f} of "
              f"{got['healthy_scans']:.0f} looks named; slowed: rank {got['rank']:.0f} named "
              f"after {got['took']:.1f} s, slowdown {got['slowdown']:.2f} vs true "
              f"{got['true']:.2f} ({err:+.0%}); daemon CPU per rank "
              f"{got['daemon_cpu_per_rank']:.2%} of a core; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
