"""The daemon's own CPU and memory while it watches 1, 8 and 64 rank records.

For each count N: N live `sleep` processes, each with a synthetic record
written by watchdog.SyntheticWriter that carries that process's pid,
start time (psutil create_time) and uid, in phase RUNNING (or IDLE for every
other one with --mixed) so nothing is ever judged or killed. The real daemon
(`mlx-watchdog run`, interval 1 s, log level info) watches the directory; once
it has seen all N records and settled, its CPU time (user + system, psutil on
its pid) is measured over a fixed window, and its RSS sampled every second.
Prints CPU as a percentage of one core (total and per watched rank), the RSS
(max over the window), and the mean scan duration from the daemon's own
counters. Targets: <= 0.5% of one core per watched rank, RSS < 60 MB.

    python -m benchmarks.daemon_cost --counts 1 8 64 --seconds 30
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from tests.support.ranks import DaemonProc, wait_for
from tests.support.records import SyntheticWriter
from watchdog import record
from watchdog.states import Phase


def synthetic(records: Path, count: int, mixed: bool
              ) -> tuple[list[subprocess.Popen[bytes]], list[SyntheticWriter]]:
    sleepers, writers = [], []
    host = socket.gethostname()
    for i in range(count):
        p = subprocess.Popen(["sleep", "3600"])
        sleepers.append(p)
        w = SyntheticWriter(
            str(records / f"{p.pid}{record.SUFFIX}"), pid=p.pid,
            start_time=psutil.Process(p.pid).create_time(), uid=os.getuid(), host=host,
            job=f"synthetic-{count}", rank=i, world_size=count, backend="ring", dump_signal=0)
        now = time.monotonic_ns()
        phase = Phase.IDLE if mixed and i % 2 else Phase.RUNNING
        w.begin()
        w.write_hot(17, 40, 40, 3, int(phase), 0, now, 0, now, 1000, 5000)
        for n in range(1, 18):
            w.write_entry(n, now, 64, record.OP_CODE["all_sum"], record.DTYPE_CODE["float32"])
        w.end()
        writers.append(w)
    return sleepers, writers


def measure(workdir: Path, count: int, seconds: float, settle: float, mixed: bool
            ) -> dict[str, float]:
    records, state = workdir / "records", workdir / "state"
    records.mkdir()
    sleepers, writers = synthetic(records, count, mixed)
    daemon = DaemonProc(records, state, "--log-level", "info", interval=1, deadline=30,
                        blocked_deadline=60, listen="127.0.0.1:0")
    try:
        daemon.start()
        wait_for(lambda: len(daemon.ranks()) == count, 60, what=f"daemon sees {count} ranks")
        time.sleep(settle)
        assert daemon.proc is not None
        proc = psutil.Process(daemon.proc.pid)
        load_before = os.getloadavg()[0]
        scans_before = daemon.status()["counters"]
        cpu_before = proc.cpu_times()
        began = time.monotonic()
        rss = []
        while time.monotonic() - began < seconds:
            rss.append(proc.memory_info().rss)
            time.sleep(1.0)
        cpu_after = proc.cpu_times()
        took = time.monotonic() - began
        scans_after = daemon.status()["counters"]
        rss.append(proc.memory_info().rss)
        states = {r["state"] for r in daemon.ranks().values()}
        assert states <= {"running", "idle"}, states
        assert not daemon.incidents(), "the daemon acted on a synthetic record"
        cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
        scans = scans_after["scan_count"] - scans_before["scan_count"]
        scan_time = scans_after["scan_sum"] - scans_before["scan_sum"]
        return {"count": count, "cpu_pct": 100 * cpu / took, "rss_mb": max(rss) / 2**20,
                "rss_end_mb": rss[-1] / 2**20, "scans": scans,
                "scan_ms": 1000 * scan_time / scans if scans else float("nan"),
                "load_before": load_before, "load_after": os.getloadavg()[0]}
    finally:
        daemon.stop()
        for w in writers:
            w.close(record.STATUS_CLOSED, remove=False)
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds after the daemon has seen every record")
    parser.add_argument("--mixed", action="store_true", help="every other record IDLE")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cpus; window {args.seconds:g}s at interval 1s", flush=True)
    print(f"  {'records':>7} {'cpu %':>7} {'% / rank':>8} {'rss MB':>7} {'scans':>5} "
          f"{'scan ms':>7}  load before/after")
    for count in args.counts:
        with tempfile.TemporaryDirectory() as tmp:
            r = measure(Path(tmp), count, args.seconds, args.settle, args.mixed)
        per = r["cpu_pct"] / count if count else float("nan")
        print(f"  {count:7d} {r['cpu_pct']:7.2f} {per:8.3f} {r['rss_mb']:7.1f} "
              f"{r['scans']:5d} {r['scan_ms']:7.2f}  {r['load_before']:.2f}/"
              f"{r['load_after']:.2f}", flush=True)


if __name__ == "__main__":
    main()
