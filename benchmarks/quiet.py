"""Seconds from a quiet hang to every rank ended, at the daemon's default settings
(issue 45), and the daemon's CPU per rank while it judges one.

Each run: a fresh daemon at its defaults (only the directories and the address given)
and 2 ring ranks of tests/support/rank_prog.py `loop` on 127.0.0.1 under the wedge
injector (tests/support/wedge_shim.c, mode "park", every rank armed): after 300
collectives every rank's recv() sleeps in poll() for ever, nothing spinning and nothing
moving. Before issue 45 such a job was `blocked` and ended at `blocked_deadline` (900 s);
the clock stops when both ranks are gone. The incident's cause and summary are printed,
and the daemon's CPU per rank from the park to the end: its own process's, and with the
children it ran (gdb's stack samples, the evidence), with the samples it took; and its
own CPU over the 20 s of the healthy job before the park, for comparison.

`--hosts`: across the two-host bed instead (tests/support/netbed.py, root only): one
rank per network namespace, each host's daemon at its defaults with the other as its
peer and a shared secret; the CPU is both daemons' over both ranks.

    python -m benchmarks.quiet --runs 3
    python -m benchmarks.quiet --hosts --runs 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.wedge import samples
from tests.support.lm_server import DefaultDaemon
from tests.support.netbed import Bed, cannot_build
from tests.support.ranks import DaemonProc, RingJob, wait_for
from tests.support.wedges import armed, build_shim

HEALTHY = 20.0  # seconds of the healthy job measured before the park


def cpu(me: psutil.Process) -> tuple[float, float]:
    """(its own, with its reaped children) CPU seconds, user and system."""
    t = me.cpu_times()
    return t.user + t.system, t.user + t.system + t.children_user + t.children_system


@dataclass
class Run:
    took: float  # seconds from the park to both ranks gone
    causes: str  # every daemon's incident's cause, "/"-joined
    summary: str  # the first daemon's incident's one line
    healthy: float  # the daemons' own CPU over HEALTHY s before the park, % per rank
    own: float  # the daemons' own CPU, % of a core per rank
    whole: float  # with the children they ran (gdb)
    sampled: int  # stack samples taken from the park on


def measure(daemons: list[DaemonProc], procs: list, trigger: Path) -> Run:
    """Park every rank (touch the trigger) and time it to both ranks gone."""
    mes = [psutil.Process(d.proc.pid) for d in daemons if d.proc is not None]
    before = [cpu(me) for me in mes]
    time.sleep(HEALTHY)  # the job healthy: what watching it costs, for comparison
    healthy = sum(cpu(me)[0] - b[0] for me, b in zip(mes, before, strict=True)) / HEALTHY \
        / len(procs) * 100
    before = [cpu(me) for me in mes]
    sampled0 = sum(len(samples(d)) for d in daemons)
    trigger.touch()
    began = time.monotonic()
    wait_for(lambda: all(p.poll() is not None for p in procs), 1200, interval=0.1,
             what="both ranks ended")
    took = time.monotonic() - began
    after = [cpu(me) for me in mes]
    own, whole = (sum(a[i] - b[i] for a, b in zip(after, before, strict=True)) / took
                  / len(procs) * 100 for i in (0, 1))
    found = [wait_for(lambda d=d: [i for i in d.incidents() if i.get("outcome")], 60,
                      what="each daemon's incident")[-1] for d in daemons]
    return Run(took, "/".join(sorted({i["cause"] for i in found})), found[0]["summary"],
               healthy, own, whole, sum(len(samples(d)) for d in daemons) - sampled0)


def quiet_run(base: Path, shim: Path) -> Run:
    records, state = base / "records", base / "state"
    records.mkdir(parents=True)
    trigger = base / "park-now"
    with DefaultDaemon(records, state) as daemon, \
            RingJob(base, records, 2, "loop", env=armed(shim, trigger, "park", "*")) as job:
        job.wait_running(collectives=300)
        return measure([daemon], job.procs, trigger)


def bed_run(bed: Bed, shim: Path) -> Run:
    """One rank on each host of the bed, each host's daemon at its defaults with the
    other as its peer and the shared secret."""
    trigger = bed.workdir / f"park-now-{bed.next_id()}"
    try:
        daemons = bed.start_daemons(fences=True, at_defaults=True)
        job = bed.ring("loop", env=armed(shim, trigger, "park", "*"))
        job.wait_running(collectives=300)
        return measure(daemons, job.procs, trigger)
    finally:
        bed.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hosts", action="store_true",
                        help="across the two-host bed (root): one rank per host")
    args = parser.parse_args()
    if args.hosts and cannot_build():
        raise SystemExit(f"--hosts: {cannot_build()}")
    with tempfile.TemporaryDirectory(prefix="mlxwd-quiet-") as tmp:
        shim = build_shim(Path(tmp))
        bed = Bed(Path(tmp) / "bed").build() if args.hosts else None
        took = []
        try:
            for n in range(args.runs):
                run = (bed_run(bed, shim) if bed is not None
                       else quiet_run(Path(tmp) / f"run{n}", shim))
                took.append(run.took)
                print(f"run {n}: ended {run.took:.1f}s after the park, cause {run.causes}; "
                      f"daemon {run.own:.2f}% of a core per rank ({run.whole:.1f}% with "
                      f"gdb, {run.sampled} samples; {run.healthy:.2f}% while healthy)\n"
                      f"  {run.summary}", flush=True)
        finally:
            if bed is not None:
                bed.close()
        if took:
            print(f"quiet hang: median {statistics.median(took):.1f}s, "
                  f"max {max(took):.1f}s over {len(took)} runs")


if __name__ == "__main__":
    main()
