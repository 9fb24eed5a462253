"""Stragglers across nodes (issue 56): one ring rank per host of the two-host bed
(tests/support/netbed.py, root), each daemon at the defaults but its directories, its
address, the other host as its peer and (unless --no-peers) the shared secret.

    python -m benchmarks.across_nodes slow       # rank 1 at half pace: time to name it
    python -m benchmarks.across_nodes healthy    # 150 s in step: none named; daemon CPU
    python -m benchmarks.across_nodes healthy --no-peers   # the CPU without any peer

`slow` times from the slowdown until the slow rank's daemon names it in /status and
exports `mlx_watchdog_job_slowdown_ratio` (target <= 60 s); `healthy` reads both daemons'
/status every second for 150 s (target: none named) and prints each daemon's CPU over
the window as a share of a core (target <= 0.5 % per rank; each watches one rank).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.netbed import Bed
from tests.support.ranks import REPO, DaemonProc, base_env, wait_for


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daemons(bed: Bed, peers: bool) -> list[DaemonProc]:
    if peers:
        return bed.start_daemons(True, at_defaults=True)
    started = []
    for host in bed.hosts:
        d = host.new_daemon(False, at_defaults=True)
        argv = list(d.argv)
        while "--peers" in argv:
            at = argv.index("--peers")
            del argv[at:at + 2]
        d.argv = argv
        d.state_dir.mkdir(parents=True, exist_ok=True)
        with open(d.log_path, "ab") as log:
            d.proc = subprocess.Popen(d.argv, stdout=log, stderr=subprocess.STDOUT,
                                      env=base_env(d.record_dir), cwd=REPO)
        bed.procs.append(d.proc)
        started.append(d)
    wait_for(lambda: all((d.state_dir / "status.json").exists() for d in started), 30,
             what="the daemons' first scans")
    return started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("slow", "healthy"))
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--seconds", type=float, default=150.0)
    args = parser.parse_args()
    bed = Bed(Path(tempfile.mkdtemp(prefix="across-")))
    bed.build()
    try:
        d0, d1 = started = daemons(bed, not args.no_peers)
        flag = bed.workdir / "slow"
        job = bed.ring("work", "4", str(flag))
        job.wait_running(timeout=120)
        time.sleep(5)
        if args.what == "slow":
            flag.touch()
            began = time.monotonic()
            found = wait_for(lambda: d1.status().get("stragglers"), 120, interval=0.25,
                             what="the slow rank's daemon naming it")
            took = time.monotonic() - began
            _, metrics = bed.hosts[1].get("/metrics")
            exported = [line for line in metrics.splitlines()
                        if line.startswith("mlx_watchdog_job_slowdown_ratio{")]
            print(f"named after {took:.1f}s: {found[0]['summary']} slowdown "
                  f"{found[0]['slowdown']}; metric {exported}")
        else:
            before = [cpu_seconds(d.proc.pid) for d in started if d.proc]
            began = time.monotonic()
            named: set[tuple[int, str]] = set()
            scores: list[float] = []
            while time.monotonic() - began < args.seconds:
                for n, d in enumerate(started):
                    status = d.status()
                    named |= {(n, s["summary"]) for s in status.get("stragglers", [])}
                    scores += [r["pace_score"] for r in status["ranks"]
                               if r.get("pace_score") is not None]
                time.sleep(1)
            took = time.monotonic() - began
            after = [cpu_seconds(d.proc.pid) for d in started if d.proc]
            print(f"named over {took:.0f} s: {sorted(named)}; scores "
                  f"{min(scores, default=None)}-{max(scores, default=None)}")
            shares = [round(100 * (b - a) / took, 2)
                      for a, b in zip(before, after, strict=True)]
            print(f"daemon CPU % of a core: {shares}")
        print("load", os.getloadavg())
    finally:
        bed.close()


if __name__ == "__main__":
    main()
