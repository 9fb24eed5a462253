"""Seconds from a wedged ring collective to every rank ended, at the daemon's default
settings; what each native stack sample cost; samples taken of a healthy job.

Each wedge run: a fresh daemon at its defaults (only the directories and the address
given) and 2 ring ranks of tests/support/rank_prog.py `loop` on 127.0.0.1 under the
wedge injector tests/support/wedge_shim.c (LD_PRELOAD, built here with cc); after 300
collectives rank 1's recv() answers EAGAIN forever, in user space (`user`) or through a
zero-byte recv() in the kernel (`syscall`); the clock stops when both ranks are gone.
Then the healthy job: the same loop with no wedge for `--healthy` seconds, and the
samples the daemon took of it (its debug log). The look-alike, `--lookalike S`: rank 1
computes a CPU matmul chain for S seconds while rank 0 waits; incidents counted.
`--hosts`: the wedge runs across the two-host bed instead (tests/support/netbed.py,
root only: one rank per network namespace, each its own daemon at its defaults with the
other as its peer and a shared secret); neither daemon sees the whole job, each judges
it from its rank and the one its peer publishes. `--slowlink S` (with `--hosts`): the
look-alike of a wedge across hosts, a link shaped to 1 Mbit/s (tc tbf) on which bytes
still move, both ranks inside 3 MiB all_sums (~25-30 s each) one after another for at
least S seconds (`--mib M`: each all_sum M MiB, ~8.5 s per MiB); incidents counted, and
whether either daemon ever judged the wedge.
`--blip S` (with `--hosts`): host 1's link down for S seconds under a ring loop, then up:
the job must resume (TCP's retransmission, no error) with no incident; the seconds from
the link's return to the next collective, and whether either daemon judged the wedge.
`--backend mpi` (one host): the same wedge, healthy job and look-alike on 2 Open MPI
ranks of tests/support/mpi_prog.py under `mpirun` (TCP between them, tests/support/
mpi.py): the injector answers rank 1's readv() on its TCP sockets, as its TCP transport
reads; the look-alike's rank 1 computes in Python for S seconds.

    python -m benchmarks.wedge --runs 3 --healthy 60 --lookalike 120
    python -m benchmarks.wedge --backend mpi --runs 2 --healthy 60 --lookalike 60
    python -m benchmarks.wedge --hosts --runs 3 --healthy 0
    python -m benchmarks.wedge --hosts --runs 0 --healthy 0 --slowlink 120
    python -m benchmarks.wedge --hosts --runs 0 --healthy 0 --slowlink 200 --mib 32
    python -m benchmarks.wedge --hosts --runs 0 --healthy 0 --blip 30
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.lm_server import DefaultDaemon
from tests.support.mpi import MpiJob
from tests.support.netbed import Bed, cannot_build
from tests.support.ranks import DaemonProc, RingJob, wait_for
from tests.support.wedges import armed, build_shim

# The default wedge floors: a rank's deadline once its job is wedged (wedge_floor on
# queues, wedge_floor_exact on byte counters: issue 58).
WEDGE_FLOORS = (15.0, 4.0)
SAMPLED = re.compile(r"stacks of pid \d+: (\d+) threads in ([0-9.]+)s")



def samples(daemon: DaemonProc) -> list[float]:
    return [float(m.group(2)) for m in SAMPLED.finditer(daemon.log())]


class Job:
    """Two ranks of the backend's program, as the benchmark needs them: ring ranks
    (tests/support/rank_prog.py) or one mpirun (tests/support/mpi_prog.py)."""

    def __init__(self, backend: str, base: Path, records: Path, mode: str,
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.mpi = backend == "mpi"
        self.job: MpiJob | RingJob = (
            MpiJob(base, records, mode, *args, env=env) if self.mpi
            else RingJob(base, records, 2, mode, args=args, env=env))

    def __enter__(self) -> Job:
        self.job.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.job.__exit__(*exc)

    def wait_running(self, collectives: int) -> None:
        self.job.wait_running(collectives=collectives)

    @property
    def pids(self) -> list[int]:
        job = self.job
        return [job.pids[r] for r in sorted(job.pids)] if isinstance(job, MpiJob) else job.pids

    def gone(self) -> bool:
        job = self.job
        return job.gone() if isinstance(job, MpiJob) else all(
            p.poll() is not None for p in job.procs)


def wedge_run(base: Path, shim: Path, mode: str,
              backend: str = "ring") -> tuple[float, str, object, list[float]]:
    records, state = base / "records", base / "state"
    records.mkdir(parents=True)
    trigger = base / "wedge-now"
    env = armed(shim, trigger, mode)
    with DefaultDaemon(records, state) as daemon, \
            Job(backend, base, records, "loop", env=env) as job:
        job.wait_running(collectives=300)
        trigger.touch()
        began = time.monotonic()
        wait_for(job.gone, 900, interval=0.1, what="both ranks ended")
        took = time.monotonic() - began
        inc = wait_for(lambda: [i for i in daemon.incidents() if i.get("outcome")], 60,
                       what="the incident")[-1]
        culprit = (inc.get("culprit") or {}).get("rank")
        return took, inc["cause"], culprit, samples(daemon)


def bed_run(bed: Bed, shim: Path, mode: str) -> tuple[float, str, object, list[float]]:
    """One wedge across the bed's two hosts: (seconds, causes, culprit, sample costs)."""
    trigger = bed.workdir / f"wedge-now-{bed.next_id()}"
    try:
        daemons = bed.start_daemons(fences=True, at_defaults=True)
        job = bed.ring("loop", env=armed(shim, trigger, mode))
        job.wait_running(collectives=300)
        trigger.touch()
        began = time.monotonic()
        wait_for(job.gone, 900, interval=0.1, what="both ranks ended")
        took = time.monotonic() - began
        found = [wait_for(lambda d=d: [i for i in d.incidents() if i.get("outcome")], 60,
                          what="each host's incident")[-1] for d in daemons]
        culprits = {(c.get("rank"), c.get("host")) for i in found if (c := i.get("culprit"))}
        named = ", ".join(f"rank {r} on {h}" for r, h in sorted(culprits, key=str))
        causes = "/".join(sorted({i["cause"] for i in found}))
        return took, causes, named, [c for d in daemons for c in samples(d)]
    finally:
        bed.stop_all()


def slowlink_run(bed: Bed, seconds: float, mib: int = 3) -> tuple[list[float], int, int,
                                                                   float, int]:
    """All_sums of `mib` MiB over a 1 Mbit/s link for `seconds` and more: (each one's
    seconds, incidents, wedge deadlines seen, the longest quiet seen, samples)."""
    each = 8.5 * mib  # seconds one all_sum takes at 1 Mbit/s (3 MiB: ~25 s)
    rounds = max(1, math.ceil(seconds / each))
    try:
        for host in bed.hosts:
            host.throttle("1mbit")
        daemons = bed.start_daemons(fences=True, at_defaults=True)
        job = bed.ring("bigsum", str(mib), "200", str(rounds))
        wedged, quiet = 0, 0.0
        until = time.monotonic() + 60 + 2.4 * each * rounds
        while not job.gone() and time.monotonic() < until:
            for daemon, pid in zip(daemons, job.pids, strict=True):
                r = daemon.ranks().get(pid) or {}
                quiet = max(quiet, r.get("quiet_seconds") or 0.0)
                wedged += r.get("deadline_seconds") in WEDGE_FLOORS
            time.sleep(0.5)
        took = [float(t) for t in re.findall(r"bigsum done ([0-9.]+)", job.log(0))]
        for inc in (i for d in daemons for i in d.incidents()):
            print(f"  slowlink incident: {inc.get('cause')}: {inc.get('summary')}")
        if not took:
            print("  rank 0's log ends:", job.log(0)[-600:])
        return (took, sum(len(d.incidents()) for d in daemons), wedged, quiet,
                sum(len(samples(d)) for d in daemons))
    finally:
        bed.stop_all()
        bed.heal()


def blip_run(bed: Bed, seconds: float, watch: float = 60.0) -> dict[str, object]:
    """Host 1's link down `seconds` under a ring loop, then up; watched `watch` s more."""
    try:
        daemons = bed.start_daemons(fences=True, at_defaults=True)
        job = bed.ring("loop")
        job.wait_running(collectives=300)
        host = bed.hosts[1]
        wedged, longest = 0, 0.0

        def look() -> list[int]:
            nonlocal wedged, longest
            shown = [daemon.ranks().get(pid) or {}
                     for daemon, pid in zip(daemons, job.pids, strict=True)]
            wedged += sum(r.get("deadline_seconds") in WEDGE_FLOORS for r in shown)
            longest = max([longest, *(r.get("seconds_in_wait") or 0.0 for r in shown)])
            return [r.get("collectives", 0) for r in shown]
        host.link(False)
        down = time.monotonic()
        while time.monotonic() < down + seconds:
            look()
            time.sleep(0.5)
        host.link(True)
        healed = time.monotonic()
        at_heal = look()
        wait_for(lambda: all(now > then for now, then in zip(look(), at_heal, strict=True))
                 or job.gone(), 120, interval=0.5, what="the job resumed or ended")
        resumed = time.monotonic() - healed
        while time.monotonic() < healed + watch and not job.gone():
            look()
            time.sleep(0.5)
        return {"resumed": resumed, "alive": not job.gone(),
                "incidents": sum(len(d.incidents()) for d in daemons), "wedged": wedged,
                "longest_wait": longest, "samples": sum(len(samples(d)) for d in daemons)}
    finally:
        bed.stop_all()
        bed.heal()


def healthy_run(base: Path, seconds: float, backend: str = "ring") -> tuple[int, int]:
    records, state = base / "records", base / "state"
    records.mkdir(parents=True)
    with DefaultDaemon(records, state) as daemon, Job(backend, base, records, "loop") as job:
        job.wait_running(collectives=10)
        time.sleep(seconds)
        return len(samples(daemon)), len(daemon.incidents())


def lookalike_run(base: Path, seconds: float, backend: str = "ring") -> tuple[int, int, str]:
    records, state = base / "records", base / "state"
    records.mkdir(parents=True)
    # Ring: a CPU matmul chain of 100 steps; MPI: Python's own loop (mpi_prog.py).
    args = (str(seconds),) if backend == "mpi" else (str(seconds), "100")
    with DefaultDaemon(records, state) as daemon, \
            Job(backend, base, records, "slowpeer", args=args) as job:
        job.wait_running(collectives=1)
        seen = ""
        while not job.gone():
            seen = (daemon.ranks().get(job.pids[1]) or {}).get("frames") or seen
            time.sleep(0.5)
        found = daemon.incidents()
        for inc in found:  # what a false incident was taken for, to find why
            print(f"  lookalike incident: {inc.get('cause')}: {inc.get('summary')}")
        return len(found), len(samples(daemon)), seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="user,syscall")
    parser.add_argument("--backend", choices=("ring", "mpi"), default="ring",
                        help="the ranks' backend on one host (mpi: Open MPI's mpirun)")
    parser.add_argument("--healthy", type=float, default=60.0)
    parser.add_argument("--lookalike", type=float, default=0.0)
    parser.add_argument("--hosts", action="store_true",
                        help="the wedge across the two-host bed (root)")
    parser.add_argument("--mib", type=int, default=3,
                        help="the size of each all_sum over the slow link, MiB")
    parser.add_argument("--slowlink", type=float, default=0.0,
                        help="with --hosts: S seconds of all_sums over a 1 Mbit/s link")
    parser.add_argument("--blip", type=float, default=0.0,
                        help="with --hosts: host 1's link down S seconds under a ring loop")
    args = parser.parse_args()
    if args.hosts and args.backend != "ring":
        raise SystemExit("--hosts runs ring ranks only")
    if args.hosts and cannot_build():
        raise SystemExit(f"--hosts: {cannot_build()}")
    print(f"  {args.backend} ranks; load average before: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mlxwd-wedge-") as tmp:
        base = Path(tmp)
        shim = build_shim(base)
        costs: list[float] = []
        bed = Bed(base / "bed").build() if args.hosts else None
        try:
            for mode in args.modes.split(","):
                took = []
                for n in range(args.runs):
                    seconds, cause, culprit, cost = (
                        bed_run(bed, shim, mode) if bed is not None else
                        wedge_run(base / f"{mode}{n}", shim, mode, args.backend))
                    took.append(seconds)
                    costs += cost
                    named = culprit if bed is not None else f"rank {culprit}"
                    print(f"  {mode:8} run {n + 1}: {seconds:5.1f} s  (cause {cause}, culprit "
                          f"{named}, {len(cost)} samples; load {os.getloadavg()[0]:.1f})",
                          flush=True)
                if not took:
                    continue
                print(f"  {mode:8} median {statistics.median(took):5.1f} s over {len(took)} "
                      f"runs (min {min(took):.1f}, max {max(took):.1f})", flush=True)
            if bed is not None and args.slowlink > 0:
                took, incidents, wedged, quiet, taken = slowlink_run(bed, args.slowlink,
                                                                  args.mib)
                print(f"  slowlink {sum(took):.0f} s of all_sums over 1 Mbit/s "
                      f"({', '.join(f'{t:.1f}' for t in took)} s each): {incidents} "
                      f"incidents, wedge judged {wedged} times, quiet at most {quiet:.1f} s, "
                      f"{taken} samples", flush=True)
            if bed is not None and args.blip > 0:
                got = blip_run(bed, args.blip)
                print(f"  blip {args.blip:.0f} s (host 1's link down): resumed "
                      f"{got['resumed']:.1f} s after the link returned, job alive "
                      f"{got['alive']}, {got['incidents']} incidents, wedge judged "
                      f"{got['wedged']} times, longest wait seen {got['longest_wait']:.1f} s, "
                      f"{got['samples']} samples", flush=True)
        finally:
            if bed is not None:
                bed.close()
        if costs:
            print(f"  per sample: median {statistics.median(costs):.2f} s, max "
                  f"{max(costs):.2f} s of the target stopped under gdb ({len(costs)} samples)")
        if args.healthy > 0:
            taken, incidents = healthy_run(base / "healthy", args.healthy, args.backend)
            print(f"  healthy  {args.healthy:.0f} s: {taken} samples, {incidents} incidents")
        if args.lookalike > 0:
            incidents, taken, seen = lookalike_run(base / "lookalike", args.lookalike,
                                                   args.backend)
            work = "Python" if args.backend == "mpi" else "matmuls"
            print(f"  lookalike {args.lookalike:.0f} s of {work}: {incidents} incidents, "
                  f"{taken} samples; rank 1: {seen}")


if __name__ == "__main__":
    main()
