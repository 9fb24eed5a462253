"""Chaos soak: small real MLX ring jobs under one real daemon, faults injected at random.

Jobs of 2 or 3 ranks (tests/support/rank_prog.py mode `soak`: checked all_sum rounds
that end together, exit 0) come and go under one `mlx-watchdog run` with a
short deadline. A driver with a seeded random generator injects:

    short_pause  SIGSTOP a rank, SIGCONT it before the deadline: the job must
                 not be touched and must still end with exit 0 (a wrong
                 all_sum result exits 3)
    long_pause   SIGSTOP a rank for good: its job must be ended by the
                 watchdog and the incident must name the paused rank
    sigkill      SIGKILL a rank: the survivors must end, by MLX's own
                 "connection to a peer was lost" error or by the watchdog
    recv         a 2-rank job whose rank 0 waits on a recv nobody sends: ended
    clean_exit   (not injected: every healthy job ends on its own, exit 0)
    new_job      (not injected: jobs start whenever ranks are free)

When run as root, a second local user (uid 65534) joins: every few seconds a
process of that uid publishes, into the sticky record directory, a record of
its own hung in a wait since boot that names a running job (its job id, a
rank, its world size), a record forging one of that job's ranks (its pid, the
stranger's uid) and one claiming a world of 2**31-1 ranks. The stranger's own
hang must be ended (it is a hang of the stranger's job); no real rank may be
touched for any of it. The same user also attacks the daemon for the
whole soak: its hung record names SIGUSR2 for stack dumps and grows its dump
file to a sparse GiB on it (the state dir is a 64 MiB tmpfs); a process of it
keeps 64 HTTP connections to the daemon open, trickling a byte a second; a
crowd of 40 sleeping processes of it publish valid records (the daemon runs at
a 256-descriptor limit); one of them waits on ever-new unknown op codes. None
of the crowd may be signalled, the state disk must keep room, no response may
be left unfinished, and the learned kinds of that user stay bounded. And (issue
30): batches of one-process jobs of that user hang ignoring the dump signal (each
capture waits out its time box: they once starved every worker), and a process of
it sends the largest request heads the HTTP parser takes, over and over. Each of
those hangs must be ended and journaled, and the real jobs' hangs still caught
within their slack.

An oracle then checks every incident of `incidents.jsonl` and every process
exit against what was injected, and prints the figures. Exit status 1 when
anything was killed wrongly, a hang was missed, a culprit was misnamed or a
healthy rank did not exit 0.

This module is the driver (it starts the jobs and injects the faults on its schedule);
the settings and the ledger of jobs and faults are in benchmarks/soak_jobs.py, the
second user's processes in benchmarks/soak_hostile.py, the oracle and the report in
benchmarks/soak_oracle.py.

    python -m benchmarks.soak --seconds 300 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.soak_hostile import (
    OTHER_UID,
    Hostile,
    Stranger,
    hostile_problems,
    spawn_stranger,
)
from benchmarks.soak_jobs import INJECTED, WEIGHTS, Config, Fault, Job
from benchmarks.soak_oracle import failed, oracle, report
from tests.support.ranks import DaemonProc, RingJob
from watchdog.states import Phase


class Soak:
    """The driver: starts jobs while ranks are free, injects faults on a seeded schedule,
    lets the second user in (as root), drains, then hands everything to the oracle."""

    def __init__(self, config: Config) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.jobs: dict[str, Job] = {}
        self.owner: dict[int, str] = {}  # pid -> job
        self.injected: dict[str, int] = dict.fromkeys(INJECTED, 0)
        self.started_jobs = 0
        self.recv_queued = 0
        self.next_kind: str | None = None
        self.coverage = list(INJECTED)
        self.rng.shuffle(self.coverage)  # the first faults cover every kind
        self.workdir = Path(config.workdir or tempfile.mkdtemp(prefix="mlxwd-soak-"))
        self.record_dir = self.workdir / "records"
        self.record_dir.mkdir(parents=True, exist_ok=True)
        self.strangers: dict[int, Stranger] = {}
        self.use_strangers = config.strangers and os.geteuid() == 0
        self.state_dir = self.workdir / "state"
        self.state_mounted = False
        if self.use_strangers:
            os.chmod(self.workdir, 0o711)
            os.chmod(self.record_dir, 0o1777)  # as under the service: sticky, anyone writes
            # A small state disk, so a dump file grown without end would fill it.
            self.state_dir.mkdir(exist_ok=True)
            self.state_mounted = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs",
                 str(self.state_dir)], capture_output=True).returncode == 0
        self.daemon = DaemonProc(
            self.record_dir, self.state_dir, deadline=config.deadline,
            blocked_deadline=config.blocked_deadline, interval=config.interval,
            grace=config.grace, evidence_timeout=config.evidence_timeout, kill_timeout=3,
            retention=30)
        self.hostile = Hostile(self.record_dir, self.state_dir, self.state_mounted,
                               self.daemon, config.bound, self.say)

    def say(self, text: str) -> None:
        if self.cfg.verbose:
            print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    # -- processes ------------------------------------------------------------------

    def alive_ranks(self) -> int:
        return sum(len(j.alive()) for j in self.jobs.values())

    def launch(self, mode: str, size: int, args: tuple[str, ...], lifetime: float) -> Job:
        name = f"soak-{self.started_jobs:03d}-{mode}"
        self.started_jobs += 1
        ring = RingJob(self.workdir / "jobs" / name, self.record_dir, size, mode, args=args,
                       env={"MLX_WATCHDOG_JOB": name}).start()
        job = Job(name, ring, mode, lifetime, time.monotonic())
        self.jobs[name] = job
        for p in ring.procs:
            self.owner[p.pid] = name
        self.say(f"start {name} ({size} ranks) pids {ring.pids}")
        return job

    def reap(self) -> None:
        for stranger in self.strangers.values():
            if stranger.code is None:
                pid, status = os.waitpid(stranger.pid, os.WNOHANG)
                if pid:
                    stranger.code = os.waitstatus_to_exitcode(status)
                    self.say(f"stranger {pid} exited {stranger.code}")
        for job in self.jobs.values():
            for p in job.ring.procs:
                if p.pid not in job.exits and p.poll() is not None:
                    job.exits[p.pid] = (p.returncode, time.time())
                    self.say(f"{job.name} pid {p.pid} exited {p.returncode}")

    def refresh(self) -> None:
        """Mark jobs running once every rank has published and done some rounds."""
        for job in self.jobs.values():
            if job.running or job.exits:
                continue
            recs = job.ring.records()
            if len(recs) == job.ring.size and all(r.collectives >= 2 for r in recs.values()):
                job.running = True
        for job in self.jobs.values():
            for fault in job.faults:
                if not fault.located:
                    self.locate_recv(job, fault)

    def locate_recv(self, job: Job, fault: Fault) -> None:
        """The recv fault begins when rank 0 enters the wait that never returns."""
        rec = job.ring.records().get(0)
        if rec is not None and rec.phase == Phase.WAIT and rec.collectives >= 2 \
                and rec.wait_since_ns > 0:
            fault.mono = rec.wait_since_ns / 1e9  # CLOCK_MONOTONIC, like time.monotonic
            fault.wall = time.time() - (time.monotonic() - fault.mono)
            fault.located = True

    # -- the driver -----------------------------------------------------------------

    def fill(self) -> None:
        while True:
            free = self.cfg.max_ranks - self.alive_ranks()
            if free < 2:
                return
            if self.recv_queued:  # a queued recv fault gets the first free pair of ranks
                self.recv_queued -= 1
                self.injected["recv"] += 1
                job = self.launch("recv", 2, (), 0.0)
                job.faults.append(Fault("recv", job.name, 0, job.ring.pids[0], located=False))
                continue
            size = self.rng.choice([2, 3]) if free >= 3 else 2
            lifetime = self.rng.uniform(*self.cfg.lifetime)
            self.launch("soak", size, (f"{lifetime:.1f}", str(self.cfg.pace)), lifetime)

    def eligible(self) -> list[Job]:
        margin = self.cfg.short_pause[1] + 2.0
        now = time.monotonic()
        return [j for j in self.jobs.values()
                if j.mode == "soak" and j.running and not j.exits and j.fatal() is None
                and not j.pausing() and now - j.launched < j.lifetime - margin]

    def inject(self) -> bool:
        if self.next_kind is None:
            self.next_kind = (self.coverage.pop(0) if self.coverage else
                              self.rng.choice([k for k in INJECTED for _ in range(WEIGHTS[k])]))
        kind = self.next_kind
        jobs = self.eligible()
        if kind != "recv" and not jobs:
            return False  # no job to hurt right now: the same kind next time
        self.next_kind = None
        if kind == "recv":
            self.recv_queued += 1  # launched by fill() as soon as two ranks are free
            return True
        self.injected[kind] += 1
        job = self.rng.choice(jobs)
        rank = self.rng.randrange(job.ring.size)
        pid = job.ring.pids[rank]
        fault = Fault(kind, job.name, rank, pid)
        os.kill(pid, signal.SIGKILL if kind == "sigkill" else signal.SIGSTOP)
        fault.wall, fault.mono = time.time(), time.monotonic()
        if kind == "short_pause":
            fault.resume_at = fault.mono + self.rng.uniform(*self.cfg.short_pause)
        job.faults.append(fault)
        self.say(f"{kind} {job.name} rank {rank} pid {pid}")
        return True

    def stranger(self) -> bool:
        """A second user's hostile records naming a running job."""
        jobs = [j for j in self.jobs.values() if j.mode == "soak" and j.running and not j.exits]
        if not jobs or sum(s.code is None for s in self.strangers.values()) >= 2:
            return False
        job = self.rng.choice(jobs)
        pid = spawn_stranger(self.record_dir, job.name, job.ring.size, job.ring.pids[0])
        self.strangers[pid] = Stranger(pid, job.name, time.time(), time.monotonic())
        self.say(f"stranger {pid} (uid {OTHER_UID}) names {job.name}")
        return True

    def resume(self) -> None:
        now = time.monotonic()
        for job in self.jobs.values():
            for fault in job.faults:
                if fault.resume_at is not None and now >= fault.resume_at:
                    try:
                        os.kill(fault.pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                    self.say(f"resume {job.name} pid {fault.pid} after "
                             f"{now - fault.mono:.2f}s")
                    fault.resume_at = None

    def tick(self) -> None:
        self.reap()
        self.resume()
        self.refresh()
        self.daemon.alive()

    def settled(self) -> bool:
        """Nothing left to watch: every job has ended, or is a hang past its bound."""
        now = time.monotonic()
        for stranger in self.strangers.values():
            if stranger.code is None and now < stranger.mono + self.cfg.bound:
                return False
        for job in self.jobs.values():
            if not job.alive():
                continue
            fault = job.fatal()
            if fault is None or not fault.located:
                return False
            if now < fault.mono + self.cfg.blocked_deadline + self.cfg.bound:
                return False
        return True

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.daemon.start()
        began = time.monotonic()
        try:
            if self.use_strangers:
                self.hostile.start()
            next_fault = began + self.rng.uniform(*cfg.fault_gap)
            next_stranger = began + self.rng.uniform(*cfg.stranger_gap)
            next_batch = began + 15.0
            while time.monotonic() < began + cfg.seconds:
                self.tick()
                self.fill()
                if time.monotonic() >= next_fault and self.inject():
                    next_fault = time.monotonic() + self.rng.uniform(*cfg.fault_gap)
                if self.use_strangers and time.monotonic() >= next_stranger \
                        and self.stranger():
                    next_stranger = time.monotonic() + self.rng.uniform(*cfg.stranger_gap)
                if self.use_strangers and time.monotonic() >= next_batch:
                    self.hostile.hung_batch(8)
                    next_batch = time.monotonic() + 15.0
                time.sleep(0.05)
            drain_until = time.monotonic() + cfg.drain
            while time.monotonic() < drain_until and not self.settled():
                self.tick()
                time.sleep(0.05)
            self.tick()
            time.sleep(1.0)  # the last incidents' journal lines
            hostile = self.hostile.figures() if self.use_strangers else None
            self.cleanup()
            figures = oracle(self)
            figures["hostile"] = hostile
            if hostile is not None:
                figures["problems"] += hostile_problems(hostile)
            figures["wall_seconds"] = round(time.monotonic() - began, 1)
            figures["daemon_alive"] = self.daemon.alive()
            if failed(figures):  # the daemon's log and the ranks' logs say why
                cfg.keep = True
                figures["kept"] = str(self.workdir)
            return figures
        finally:
            self.cleanup()
            self.daemon.stop()
            if self.state_mounted:
                subprocess.run(["umount", "-l", str(self.state_dir)], check=False)
            if not cfg.keep and cfg.workdir is None:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def cleanup(self) -> None:
        self.hostile.stop()
        for stranger in self.strangers.values():
            if stranger.code is None:
                stranger.cleanup = True
                os.kill(stranger.pid, signal.SIGKILL)
                os.waitpid(stranger.pid, 0)
                stranger.code = -signal.SIGKILL
        for job in self.jobs.values():
            for pid in job.alive():
                job.cleanup.add(pid)
            job.ring.stop()
        self.reap()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0,
                        help="how long faults are injected (the drain comes on top)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=3.0)
    parser.add_argument("--max-ranks", type=int, default=6)
    parser.add_argument("--workdir", type=Path, help="keep everything here (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each event")
    args = parser.parse_args(argv)
    cfg = Config(seconds=args.seconds, seed=args.seed, deadline=args.deadline,
                 max_ranks=args.max_ranks, workdir=args.workdir, keep=args.keep,
                 verbose=args.verbose)
    figures = Soak(cfg).run()
    print(report(figures))
    if args.json:
        print(json.dumps(figures, indent=1))
    return 1 if failed(figures) else 0


if __name__ == "__main__":
    sys.exit(main())
