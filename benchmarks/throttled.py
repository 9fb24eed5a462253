"""A throttled rank (its core shared with a busy loop) named the straggler, and the same
job healthy never named: the daemon at its defaults (only the directories and the address
given), on Linux or, through benchmarks.macsim, on the simulated Mac.

Two ring ranks of tests/support/rank_prog.py `work 4` (matmuls and an all_sum in one eval
a step), each pinned with every thread to a core of its own (`taskset -a`), as ranks on
two Macs run. For `--healthy` seconds the job runs in step: how many of the daemon's looks
(one a second) name anyone (target: none over 150 s). Then a busy loop is pinned to rank
1's core, which now gets about half of it: seconds until the daemon names rank 1 (target
<= 60 s), its why (a run queue: per thread from schedstat on Linux, the process's
`ri_runnable_time` on a Mac), and its slowdown against the true one (rank 0's pace before
the loop over its pace once the daemon's window holds only the throttled steps). Nothing
is ever ended (checked).

    python -m benchmarks.throttled --healthy 150
    python -m benchmarks.macsim throttled --healthy 150
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.straggler_causes import watch_healthy
from tests.support.lm_server import DefaultDaemon
from tests.support.ranks import RingJob
from watchdog.record import SUFFIX

MATMULS = "4"


def pace(job: RingJob, seconds: float) -> float:
    before, began = job.records()[0].collectives, time.monotonic()
    time.sleep(seconds)
    return (job.records()[0].collectives - before) / (time.monotonic() - began)


def pin(pid: int, cpu: int) -> None:
    subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True,
                   capture_output=True)


def figures(daemon: DefaultDaemon, pids: list[int]) -> str:
    return "; ".join(f"rank {r['rank']} pace {r.get('pace')} wait {r.get('wait_share')} "
                     f"queue {r.get('run_queue')} score {r.get('pace_score')} "
                     f"{r.get('pace_note') or ''}"
                     for r in daemon.status()["ranks"] if r["pid"] in pids)


def one_run(base: Path, healthy: float, hogs: int, beside: bool) -> dict[str, Any]:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        raise SystemExit("needs two cores")
    records, state = base / "records", base / "state"
    records.mkdir(parents=True)
    # Beside the simulated Mac's daemon (benchmarks.macsim), one on Linux's path reading
    # the same records (hard links: one daemon to a directory): the same ranks, the same
    # load, judged from each platform's signals.
    (base / "records-linux").mkdir()
    linux = DefaultDaemon(base / "records-linux", base / "state-linux")
    linux.extra_env = {"MLX_WATCHDOG_SIMULATE": ""}
    with contextlib.ExitStack() as stack:
        daemon = stack.enter_context(DefaultDaemon(records, state))
        if beside:
            stack.enter_context(linux)
        job = stack.enter_context(RingJob(base, records, 2, "work", args=(MATMULS,)))
        job.wait_running(collectives=5)
        if beside:
            for path in records.glob(f"*{SUFFIX}"):
                os.link(path, base / "records-linux" / path.name)
        for pid, cpu in zip(job.pids, cpus, strict=True):
            pin(pid, cpu)
        scored, looks, named = watch_healthy(daemon, job, healthy)
        platform = daemon.status().get("platform")
        before = pace(job, 20.0)
        loops = [subprocess.Popen(["taskset", "-c", str(cpus[1]), "sh", "-c",
                                   "while :; do :; done"]) for _ in range(hogs)]
        try:
            shared = time.monotonic()
            shown = 0.0
            took_linux, first, first_linux = None, None, None
            while time.monotonic() < shared + 120:
                if (named_now := daemon.status()["stragglers"]):
                    first = named_now[0]
                    break
                if beside and took_linux is None and (seen := linux.status()["stragglers"]):
                    took_linux, first_linux = time.monotonic() - shared, seen[0]
                if time.monotonic() >= shown + 10:
                    shown = time.monotonic()
                    print(f"    {shown - shared:5.1f} s: {figures(daemon, job.pids)}",
                          flush=True)
                    if beside:
                        print(f"      linux: {figures(linux, job.pids)}", flush=True)
                time.sleep(0.5)
            took = time.monotonic() - shared
            if beside and took_linux is None:
                for _ in range(60):
                    if (seen := linux.status()["stragglers"]):
                        took_linux, first_linux = time.monotonic() - shared, seen[0]
                        break
                    time.sleep(0.5)
            time.sleep(max(0.0, shared + 32 - time.monotonic()))
            after = pace(job, 15.0)
            looks_after = [daemon.status()["stragglers"] for _ in range(10)
                           if not time.sleep(0.5)]
            found = [x[0] for x in looks_after if x]
            ranks = {r["rank"]: r for r in daemon.status()["ranks"] if r["pid"] in job.pids}
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
        ended = any(p.poll() is not None for p in job.procs) or bool(daemon.incidents())
    if first is not None:
        print(f"  first named after {took:.1f} s: rank {first['rank']}, slowdown "
              f"{first['slowdown']:.2f}, why {first['why']!r}", flush=True)
    if beside:
        print("  beside it, Linux's daemon named "
              + ("none" if first_linux is None else
                 f"rank {first_linux['rank']} after {took_linux:.1f} s, slowdown "
                 f"{first_linux['slowdown']:.2f}, why {first_linux['why']!r}"), flush=True)
    return {"platform": platform, "healthy_looks": looks, "healthy_named": named,
            "scored": scored, "took": took, "found": found[-1] if found else None,
            "true": before / after if after else float("inf"), "ranks": ranks,
            "ended": ended}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--healthy", type=float, default=150.0,
                        help="seconds of the job in step before rank 1's core is shared")
    parser.add_argument("--hogs", type=int, default=3,
                        help="busy loops pinned to rank 1's core")
    parser.add_argument("--beside-linux", action="store_true",
                        help="a daemon on Linux's path beside, reading the same records")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for n in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="mlxwd-throttled-") as tmp:
            got = one_run(Path(tmp), args.healthy, args.hogs, args.beside_linux)
        found = got["found"]
        print(f"run {n + 1} ({got['platform']}): healthy {args.healthy:.0f} s: named in "
              f"{got['healthy_named']} of {got['healthy_looks']} looks, every rank scored "
              f"after {got['scored'] if got['scored'] is None else round(got['scored'], 1)} s",
              flush=True)
        if found is None:
            print(f"  throttled ({args.hogs} loops on its core): not named, or cleared, "
                  f"{got['took']:.1f} s after", flush=True)
        else:
            err = (found["slowdown"] - got["true"]) / got["true"]
            print(f"  throttled ({args.hogs} loops on its core): rank {found['rank']} named "
                  f"after {got['took']:.1f} s, "
                  f"slowdown {found['slowdown']:.2f} vs true {got['true']:.2f} ({err:+.0%});"
                  f" why {found['why']!r}", flush=True)
        for rank, r in sorted(got["ranks"].items()):
            print(f"  rank {rank}: pace {r.get('pace')}, wait share {r.get('wait_share')}, "
                  f"run queue {r.get('run_queue')}, score {r.get('pace_score')}", flush=True)
        print(f"  ended {got['ended']}; load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
