"""Stragglers by cause, and every rank's pace on a busy machine (issue 47).

Real ring ranks (tests/support/rank_prog.py `work`: matmuls and an all_sum in one eval)
and the real daemon at its defaults (interval 1 s). Each run:

- `busy`: the healthy job with a busy process pinned to each core (`taskset`), for
  `--healthy` seconds: when every rank first shows a score (target <= 60 s), how many of
  the daemon's looks named anyone (target: none);
- `stop-bursts`: rank 1 stopped 0.3 s of every 0.6 s (SIGSTOP/SIGCONT from here);
- `mostly-stopped`: rank 1 stopped 0.5 s of every 0.6 s (83%);
- `compute`: rank 1 computes in Python a healthy step's time before each step (uneven
  work: its core flat out);
- `memory`: each rank reads 2048 random pages of its own memory-mapped dataset before
  each step (from the fault on; rank 0's 4 MiB, rank 1's 128 MiB), rank 1 squeezed into
  a 16 MiB memory cgroup (tests/support/squeeze.py; root): its pages are read back
  from storage at every step (major faults: memory pressure).

For each cause: how long until the daemon names rank 1 (target <= 60 s), its why, and
its slowdown against the job's true one (rank 0's pace over the last 20 s of the
`--before` seconds of health, over its pace once the daemon's window holds only the
slowed steps; target within 20%); a rank not named in 90 s is reported with the job's true
slowdown (right when the job kept its healthy pace). Nothing is ever ended (checked).

    python -m benchmarks.straggler_causes --runs 1 --causes busy,stop-bursts,compute
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tests.support import squeeze
from tests.support.ranks import DaemonProc, RingJob, wait_for

MATMULS = "4"


def pace(job: RingJob, seconds: float) -> float:
    before, began = job.records()[0].collectives, time.monotonic()
    time.sleep(seconds)
    return (job.records()[0].collectives - before) / (time.monotonic() - began)


class Stopper(threading.Thread):
    """SIGSTOP `pid` for `stopped` s of every `period` s until told to end."""

    def __init__(self, pid: int, stopped: float, period: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.stopped, self.period = pid, stopped, period
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            time.sleep(self.stopped)
            os.kill(self.pid, signal.SIGCONT)
            time.sleep(self.period - self.stopped)
        os.kill(self.pid, signal.SIGCONT)


def hogs() -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"])
            for cpu in sorted(os.sched_getaffinity(0))]


def watch_healthy(daemon: Any, job: RingJob, seconds: float) -> tuple[float | None, int, int]:
    """A healthy job watched `seconds`, a look a second: the seconds until every rank
    showed a score (None: never), the looks, and how many named a straggler."""
    began, scored, looks, named = time.monotonic(), None, 0, 0
    while time.monotonic() < began + seconds:
        st = daemon.status()
        looks += 1
        named += bool(st["stragglers"])
        ranks = [r for r in st["ranks"] if r["pid"] in job.pids]
        if scored is None and len(ranks) == 2 and all(
                r.get("pace_score") is not None for r in ranks):
            scored = time.monotonic() - began
        time.sleep(1.0)
    return scored, looks, named


def busy_run(base: Path, healthy: float) -> str:
    records, state = base / "records", base / "state"
    records.mkdir(parents=True)
    burners = hogs()
    try:
        with DaemonProc(records, state, interval=1.0, deadline=60) as daemon, \
                RingJob(base, records, 2, "work", args=(MATMULS,)) as job:
            job.wait_running(collectives=5)
            scored, looks, named = watch_healthy(daemon, job, healthy)
            notes = [r.get("pace_note") for r in daemon.status()["ranks"]]
            ended = any(p.poll() is not None for p in job.procs) or daemon.incidents()
    finally:
        for b in burners:
            b.kill()
            b.wait()
    return (f"busy: every rank scored after {scored if scored is None else round(scored, 1)} s;"
            f" named in {named} of {looks} looks; notes {notes}; ended {bool(ended)}")


def cause_run(base: Path, cause: str, before: float) -> str:
    records, state, flag, data = base / "records", base / "state", base / "slow", base / "data"
    records.mkdir(parents=True)
    env = {}
    if cause == "memory":
        data.mkdir()
        squeeze.dataset(data, [4, 128])
        env["MLX_TEST_DATASET"] = f"{data},2048"
    with ExitStack() as stack:
        daemon = stack.enter_context(DaemonProc(records, state, interval=1.0, deadline=60))
        job = stack.enter_context(RingJob(base, records, 2, "work", args=(MATMULS, str(flag)),
                                          env=env))
        job.wait_running(collectives=5)
        time.sleep(max(0.0, before - 20.0))  # the daemon sees the job healthy first
        healthy = pace(job, 20.0)
        stopper = None
        if cause == "compute":
            flag.touch()
        elif cause == "memory":
            stack.enter_context(squeeze.Squeeze(job.pids[1], 16 << 20, data / "data-1.bin",
                                                f"mlxwd-bench-{job.pids[1]}"))
            (data / "go").touch()
        else:
            stopper = Stopper(job.pids[1], 0.3 if cause == "stop-bursts" else 0.5, 0.6)
            stopper.start()
        slowed = time.monotonic()
        try:
            try:
                wait_for(lambda: daemon.status()["stragglers"], 90, interval=0.5,
                         what="the straggler named")
            except AssertionError:
                # Not named: right when the job keeps its healthy pace (a rank off its
                # core whose peers took it), wrong otherwise; the true slowdown says.
                slow = pace(job, 15.0)
                return (f"{cause}: not named in 90 s; true slowdown {healthy / slow:.2f}; "
                        f"ended {any(p.poll() is not None for p in job.procs)}")
            took = time.monotonic() - slowed
            time.sleep(max(0.0, slowed + 32 - time.monotonic()))
            slow = pace(job, 15.0)
            looks = [daemon.status()["stragglers"] for _ in range(10) if not time.sleep(0.5)]
            named = [x[0] for x in looks if x]
            if not named:
                return (f"{cause}: rank 1 named after {took:.1f} s, then cleared; true "
                        f"slowdown {healthy / slow:.2f}")
            found = named[-1]
        finally:
            if stopper is not None:
                stopper.done.set()
                stopper.join()
        ended = any(p.poll() is not None for p in job.procs) or daemon.incidents()
    true = healthy / slow
    err = (found["slowdown"] - true) / true
    return (f"{cause}: rank {found['rank']} named after {took:.1f} s, slowdown "
            f"{found['slowdown']:.2f} vs true {true:.2f} ({err:+.0%}); why "
            f"{found['why']!r}; ended {bool(ended)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--causes",
                        default="busy,stop-bursts,mostly-stopped,compute,memory")
    parser.add_argument("--healthy", type=float, default=90.0,
                        help="seconds of the busy machine's healthy job")
    parser.add_argument("--before", type=float, default=40.0,
                        help="seconds of health before the fault (the pace: the last 20)")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for n in range(args.runs):
        for cause in args.causes.split(","):
            with tempfile.TemporaryDirectory(prefix="mlxwd-causes-") as tmp:
                line = (busy_run(Path(tmp), args.healthy) if cause == "busy"
                        else cause_run(Path(tmp), cause, args.before))
            print(f"run {n + 1}: {line}; load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
