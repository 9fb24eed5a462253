"""Seconds from a quiet hang to every rank ended, at the daemon's default settings
(issue 45), and the daemon's CPU per rank while it judges one.

Each run: a fresh daemon at its defaults (only the directories and the address given)
and 2 ring ranks of tests/support/rank_prog.py `loop` on 127.0.0.1 under the wedge
injector (tests/support/wedge_shim.c, mode "park", every rank armed): after 300
collectives every rank's recv() sleeps in poll() for ever, nothing spinning and nothing
moving. Before issue 45 such a job was `blocked` and ended at `blocked_deadline` (900 s);
the clock stops when both ranks are gone. The incident's cause and summary are printed.

    python -m benchmarks.quiet --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from tests.support.lm_server import DefaultDaemon
from tests.support.ranks import RingJob, wait_for
from tests.support.wedges import armed, build_shim


def quiet_run(base: Path, shim: Path) -> tuple[float, str, str, float]:
    records, state = base / "records", base / "state"
    records.mkdir(parents=True)
    trigger = base / "park-now"
    with DefaultDaemon(records, state) as daemon, \
            RingJob(base, records, 2, "loop", env=armed(shim, trigger, "park", "*")) as job:
        job.wait_running(collectives=300)
        assert daemon.proc is not None
        me = psutil.Process(daemon.proc.pid)
        cpu0 = sum(me.cpu_times()[:2])
        trigger.touch()
        began = time.monotonic()
        wait_for(lambda: all(p.poll() is not None for p in job.procs), 1200, interval=0.1,
                 what="both ranks ended")
        took = time.monotonic() - began
        per_rank = (sum(me.cpu_times()[:2]) - cpu0) / took / 2 * 100
        inc = wait_for(lambda: [i for i in daemon.incidents() if i.get("outcome")], 60,
                       what="the incident")[-1]
        return took, inc["cause"], inc["summary"], per_rank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shim = build_shim(Path(tmp))
        took = []
        for n in range(args.runs):
            seconds, cause, summary, cpu = quiet_run(Path(tmp) / f"run{n}", shim)
            took.append(seconds)
            print(f"run {n}: ended {seconds:.1f}s after the park, cause {cause}, daemon "
                  f"{cpu:.2f}% of a core per rank\n  {summary}", flush=True)
        if took:
            print(f"quiet hang: median {statistics.median(took):.1f}s, "
                  f"max {max(took):.1f}s over {len(took)} runs")


if __name__ == "__main__":
    main()
