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

    python -m benchmarks.soak --seconds 300 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.support.ranks import DaemonProc, RingJob
from tests.support.records import SyntheticWriter
from tests.support.users import become
from watchdog import record
from watchdog.daemon.probes.linux import read_start_ticks
from watchdog.states import Phase

INJECTED = ("short_pause", "long_pause", "sigkill", "recv")
WEIGHTS = {"short_pause": 4, "long_pause": 2, "sigkill": 2, "recv": 1}
HANGS = ("long_pause", "recv")  # faults that leave ranks waiting forever
FATAL = ("long_pause", "recv", "sigkill")  # faults after which a job may be ended
PEER_LOST = "connection to a peer was lost"
OTHER_UID = 65534  # the second local user (nobody)


@dataclass
class Config:
    seconds: float = 300.0
    seed: int = 1
    deadline: float = 3.0
    blocked_deadline: float = 6.0
    interval: float = 0.25
    grace: float = 1.0
    evidence_timeout: float = 2.0
    max_ranks: int = 6  # rank processes alive at once (2 cores)
    lifetime: tuple[float, float] = (10.0, 30.0)  # seconds a healthy job runs
    pace: float = 0.02  # sleep between a job's rounds
    fault_gap: tuple[float, float] = (1.5, 4.0)  # seconds between injections
    short_pause: tuple[float, float] = (0.3, 1.5)  # must stay well under the deadline
    bound: float = 30.0  # a hang not ended this long after its deadline is missed
    drain: float = 45.0  # after the injection window: time for the jobs to end
    strangers: bool = True  # a second local user's hostile records (needs root)
    stranger_gap: tuple[float, float] = (4.0, 8.0)  # seconds between strangers
    workdir: Path | None = None
    keep: bool = False
    verbose: bool = False


@dataclass
class Stranger:
    """A process of another uid whose records name a real job."""

    pid: int
    job: str
    wall: float
    mono: float
    code: int | None = None  # its exit status, once reaped
    cleanup: bool = False  # still alive at the end: ended by the driver


def spawn_stranger(record_dir: Path, job: str, size: int, victim: int) -> int:
    """Fork a child that becomes OTHER_UID and publishes, itself, three records
    naming `job`: its own, hung in a wait since boot; one forging `victim`
    (a real rank's pid, with the stranger's uid); one with a huge world."""
    victim_start = psutil.Process(victim).create_time()
    pid = os.fork()
    if pid:
        return pid
    try:
        os.chdir(record_dir)  # relative names from here: the path above may be root's only
        become(OTHER_UID)
        me = os.getpid()
        # Evidence that grows: the dump signal grows the dump file to a sparse GiB.
        stacks = os.open(f"{me}.stacks", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)

        def grow(_signum: int, _frame: object) -> None:
            os.write(stacks, b"Thread 0x1 (most recent call first):\n")
            os.ftruncate(stacks, 1 << 30)

        signal.signal(signal.SIGUSR2, grow)
        common = dict(uid=OTHER_UID, host="stranger", job=job, backend="ring", dump_signal=0)
        for name, fields in (
                (f"{me}.rec", dict(pid=me, start_time=psutil.Process().create_time(),
                                   start_ticks=read_start_ticks("self"), rank=size - 1,
                                   world_size=size, dump_signal=int(signal.SIGUSR2))),
                (f"{me}-forged.rec", dict(pid=victim, start_time=victim_start, rank=0,
                                          world_size=size)),
                (f"{me}-huge.rec", dict(pid=me, start_time=psutil.Process().create_time(),
                                        rank=2**31 - 2, world_size=2**31 - 1))):
            writer = SyntheticWriter(name, **{**common, **fields})  # type: ignore[arg-type]
            writer.begin()
            writer.write_hot(1, 1, 0, 0, Phase.WAIT, record.OP_CODE["all_sum"], 1, 1, 1, 0, 0)
            writer.write_expect(0.5, 1, "")
            writer.end()
            writer.close(record.STATUS_OPEN, remove=False)
        while True:
            time.sleep(1)
    finally:
        os._exit(1)


def spawn_crowd_member(record_dir: Path, n: int, mint: bool) -> int:
    """A sleeping process of OTHER_UID with a valid, healthy record of its own (one of a
    crowd that would take the daemon's descriptors); with `mint`, its record waits on a
    new unknown op code every second (to grow what the auto deadline learns)."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.chdir(record_dir)
        become(OTHER_UID)
        me = os.getpid()
        writer = SyntheticWriter(
            f"{me}.rec", pid=me, start_time=psutil.Process().create_time(), uid=OTHER_UID,
            host="crowd", job=f"crowd-{n}", rank=0, world_size=1, backend="ring",
            dump_signal=0, start_ticks=read_start_ticks("self"))
        code, done = len(record.OPS) + 1, 0
        while True:
            now = time.monotonic_ns()
            writer.begin()
            if mint:
                writer.write_hot(done, done + 1, done, 0, Phase.WAIT, code, now, now, now, 0, 0)
            else:
                writer.write_hot(done, done, done, 0, Phase.RUNNING, 0, now, 0, now, 0, 0)
            writer.end()
            time.sleep(0.6 if mint else 1.0)
            if mint:  # the wait returns: the daemon learns it under its op code's kind
                done, code = done + 1, code + 1 if code < 250 else len(record.OPS) + 1
                now2 = time.monotonic_ns()
                writer.begin()
                writer.write_hot(done, done, done, 0, Phase.RUNNING, 0, now2, 0, now2,
                                 now2 - now, now2 - now)
                writer.end()
                time.sleep(0.4)
    finally:
        os._exit(1)


def spawn_hung_member(record_dir: Path, n: int) -> int:
    """A one-process job of OTHER_UID hung in a wait since boot, whose record names
    SIGUSR2 for stack dumps, which it ignores: every capture waits out its time box."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.chdir(record_dir)
        become(OTHER_UID)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        me = os.getpid()
        writer = SyntheticWriter(
            f"{me}.rec", pid=me, start_time=psutil.Process().create_time(), uid=OTHER_UID,
            host="hung", job=f"hung-{n}", rank=0, world_size=1, backend="ring",
            dump_signal=int(signal.SIGUSR2), start_ticks=read_start_ticks("self"))
        writer.begin()
        writer.write_hot(1, 1, 0, 0, Phase.WAIT, record.OP_CODE["all_sum"], 1, 1, 1, 0, 0)
        writer.write_expect(0.5, 1, "")
        writer.end()
        while True:
            time.sleep(1)
    finally:
        os._exit(1)


def spawn_head_flood(host: str, port: int, threads: int = 4) -> int:
    """A process of OTHER_UID sending, from `threads` threads over and over, the
    largest request head the standard HTTP parser takes (100 headers of 64 KiB)."""
    import socket
    import threading

    pid = os.fork()
    if pid:
        return pid
    try:
        become(OTHER_UID)
        head = (b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
                + b"".join(b"X-P%02d: %s\r\n" % (k, b"a" * 65000) for k in range(100))
                + b"\r\n")

        def flood() -> None:
            while True:
                try:
                    with socket.create_connection((host, port), timeout=5) as conn:
                        conn.sendall(head)
                        conn.recv(64)
                except OSError:
                    time.sleep(0.01)

        for _ in range(threads):
            threading.Thread(target=flood, daemon=True).start()
        while True:
            time.sleep(1)
    finally:
        os._exit(1)


def spawn_slow_client(host: str, port: int, connections: int = 64) -> int:
    """A process of OTHER_UID holding `connections` HTTP connections to the daemon,
    each sending a byte a second and reopened when cut (slow clients)."""
    import socket

    pid = os.fork()
    if pid:
        return pid
    try:
        become(OTHER_UID)
        socks: list[socket.socket | None] = [None] * connections
        while True:
            for i, s in enumerate(socks):
                if s is None:
                    s = socket.socket()
                    s.settimeout(0.2)
                    try:
                        s.connect((host, port))
                    except OSError:
                        s.close()
                        continue
                    s.setblocking(False)
                    socks[i] = s
                try:
                    if s.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    socks[i] = None
                    continue
                try:
                    s.send(b"G")
                except OSError:
                    s.close()
                    socks[i] = None
            time.sleep(1.0)
    finally:
        os._exit(1)


@dataclass
class Fault:
    kind: str
    job: str
    rank: int | None = None
    pid: int | None = None
    wall: float = 0.0  # when the fault took effect
    mono: float = 0.0
    resume_at: float | None = None  # short pause: when to SIGCONT (monotonic)
    located: bool = True  # recv: False until rank 0 is seen inside its hung wait


@dataclass
class Job:
    name: str
    ring: RingJob
    mode: str
    lifetime: float
    launched: float  # monotonic
    running: bool = False
    faults: list[Fault] = field(default_factory=list)
    exits: dict[int, tuple[int, float]] = field(default_factory=dict)  # pid -> (code, wall)
    cleanup: set[int] = field(default_factory=set)  # pids the driver ended at the end

    def alive(self) -> list[int]:
        return [p.pid for p in self.ring.procs if p.pid not in self.exits]

    def fatal(self) -> Fault | None:
        return next((f for f in self.faults if f.kind in FATAL), None)

    def pausing(self) -> bool:
        return any(f.kind == "short_pause" and f.resume_at is not None for f in self.faults)


class Soak:
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
        self.crowd: list[int] = []  # the second user's sleeping processes
        self.slow_client: int | None = None
        self.head_flood: int | None = None
        self.hung: dict[int, float] = {}  # the second user's hung one-process jobs -> spawned
        self.hung_ended: dict[int, int] = {}  # pid -> exit status (reaped before cleanup)
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

    def hostile_start(self) -> None:
        """The second user's attacks on the daemon, for the whole soak (see the docstring)."""
        assert self.daemon.proc is not None
        import resource

        resource.prlimit(self.daemon.proc.pid, resource.RLIMIT_NOFILE, (256, 256))
        for n in range(40):
            self.crowd.append(spawn_crowd_member(self.record_dir, n, mint=n == 0))
        host, port = self.daemon.url().removeprefix("http://").rsplit(":", 1)  # type: ignore[attr-defined]
        self.slow_client = spawn_slow_client(host, int(port))
        self.head_flood = spawn_head_flood(host, int(port))
        self.hung_batch(16)
        self.say(f"hostile user: crowd {len(self.crowd)}, slow client {self.slow_client}, "
                 f"head flood {self.head_flood}, hung {len(self.hung)}")

    def hung_batch(self, count: int) -> None:
        """`count` more hung one-process jobs of the second user (issue 30, attack 1)."""
        for _ in range(count):
            pid = spawn_hung_member(self.record_dir, len(self.hung))
            self.hung[pid] = time.monotonic()

    def reap_hung(self) -> None:
        for pid in self.hung:
            if pid in self.hung_ended:
                continue
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if done:
                self.hung_ended[pid] = os.waitstatus_to_exitcode(status)

    def hostile_figures(self) -> dict[str, Any]:
        """What the second user's attacks left: each must be zero or within its bound."""
        crowd_gone = [pid for pid in self.crowd if os.waitpid(pid, os.WNOHANG)[0]]
        self.reap_hung()
        journaled = {int(p) for inc in self.daemon.incidents() if inc.get("uid") == OTHER_UID
                     for p, outcome in inc.get("outcome", {}).items() if outcome == "killed"}
        now = time.monotonic()
        hung_missed = [pid for pid, spawned in self.hung.items()
                       if pid not in self.hung_ended and now - spawned > self.cfg.bound]
        pending = list((self.state_dir / "pending").glob("*.json"))
        unwritten = self.daemon.status().get("unwritten") or {}
        dumps = [f.stat().st_size for f in (self.state_dir / "evidence").glob("*/*-python.txt")]
        try:
            learned = json.loads((self.state_dir / "learned.json").read_text())["jobs"]
        except (OSError, ValueError, KeyError):
            learned = {}
        kinds = {k for job, entry in learned.items() if job.startswith(f"{OTHER_UID}:")
                 for k in entry.get("kinds", {})}
        stats = os.statvfs(self.state_dir)
        return {"crowd": len(self.crowd), "crowd_ended": len(crowd_gone),
                "pending_left": len(pending),
                "unwritten": len(unwritten.get("incidents_unwritten", []))
                + len(unwritten.get("reboot_flags_unwritten", [])),
                "largest_dump_bytes": max(dumps, default=0),
                "state_free_bytes": stats.f_bavail * stats.f_frsize,
                "state_disk": "tmpfs 64 MiB" if self.state_mounted else "the work dir",
                "learned_kinds_of_user": sorted(kinds),
                "too_many_open_files": self.daemon.log().count("Too many open files"),
                "hung": len(self.hung), "hung_ended": len(self.hung_ended),
                "hung_missed": len(hung_missed),
                "hung_unjournaled": len(set(self.hung_ended) - journaled)}

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.daemon.start()
        began = time.monotonic()
        try:
            if self.use_strangers:
                self.hostile_start()
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
                    self.hung_batch(8)
                    next_batch = time.monotonic() + 15.0
                time.sleep(0.05)
            drain_until = time.monotonic() + cfg.drain
            while time.monotonic() < drain_until and not self.settled():
                self.tick()
                time.sleep(0.05)
            self.tick()
            time.sleep(1.0)  # the last incidents' journal lines
            hostile = self.hostile_figures() if self.use_strangers else None
            self.cleanup()
            figures = self.oracle()
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
        self.reap_hung()
        extra = [p for p in (self.slow_client, self.head_flood) if p]
        for pid in [*self.crowd, *extra, *(p for p in self.hung if p not in self.hung_ended)]:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass  # reaped already
            except ProcessLookupError:
                pass
        self.crowd, self.slow_client, self.head_flood = [], None, None
        self.hung_ended.update({p: -signal.SIGKILL for p in self.hung
                                if p not in self.hung_ended})
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

    # -- the oracle -----------------------------------------------------------------

    def oracle(self) -> dict[str, Any]:
        cfg = self.cfg
        incidents = self.daemon.incidents()  # raises on a malformed line
        by_job: dict[str, list[dict[str, Any]]] = {}
        wrong: list[str] = []
        killed_by_watchdog: dict[int, dict[str, Any]] = {}
        strangers_ended: set[int] = set()
        for inc in incidents:
            # A job is (uid, job id): the stranger's incidents name a real job id
            # but may only ever hold the stranger's own processes.
            stranger = inc.get("uid") == OTHER_UID
            allowed = {**self.strangers, **self.hung} if stranger else self.owner
            if not stranger:
                by_job.setdefault(inc["job"], []).append(inc)
            for pid_text, outcome in inc.get("outcome", {}).items():
                pid = int(pid_text)
                if outcome == "killed":
                    killed_by_watchdog[pid] = inc
                    if stranger and pid in self.strangers:
                        strangers_ended.add(pid)
            for pid in inc["pids"]:
                if pid not in allowed:
                    wrong.append(f"pid {pid} is not a {'stranger' if stranger else 'rank'} "
                                 f"of the soak (incident {inc['id']} of uid {inc.get('uid')})")
        stranger_missed = [s.pid for s in self.strangers.values()
                           if s.pid not in strangers_ended and s.cleanup]
        missed_strangers = len(stranger_missed)
        for pid, inc in killed_by_watchdog.items():
            job = self.jobs.get(self.owner.get(pid, ""))
            if job is None:
                continue
            fault = job.fatal()
            first = min((s["time"] for s in inc["signals"]), default=inc["time"])
            if fault is None or fault.wall > first:
                wrong.append(f"{job.name} pid {pid}: killed with no hang injected "
                             f"({inc['reason']})")

        caught = missed = 0
        blame_errors: list[str] = []
        slack: list[float] = []
        ended: list[float] = []
        bad_exits: list[str] = []
        wrong_results = 0
        peer_lost = {"mlx_error": 0, "other_exit": 0, "watchdog": 0, "not_ended": 0}
        short_ok = clean_jobs = 0
        for job in self.jobs.values():
            for rank, p in enumerate(job.ring.procs):
                code = job.exits.get(p.pid, (None, 0.0))[0]
                if code == 3:
                    wrong_results += 1
                    bad_exits.append(f"{job.name} rank {rank}: wrong all_sum result")
            fault = job.fatal()
            if fault is None:
                if any(pid in job.cleanup for pid in job.ring.pids):
                    continue  # still running when the soak ended: no verdict on it
                codes = [job.exits[pid][0] for pid in job.ring.pids]
                if codes != [0] * len(codes):
                    bad_exits.append(f"{job.name}: healthy job exited {codes}")
                    continue
                clean_jobs += 1
                short_ok += sum(f.kind == "short_pause" for f in job.faults)
                continue
            if fault.kind == "sigkill":
                survivors = [pid for pid in job.ring.pids if pid != fault.pid]
                for pid in survivors:
                    if pid in killed_by_watchdog:
                        peer_lost["watchdog"] += 1
                    elif pid in job.exits and pid not in job.cleanup:
                        rank = job.ring.pids.index(pid)
                        peer_lost["mlx_error" if PEER_LOST in job.ring.log(rank)
                                  else "other_exit"] += 1
                    else:
                        peer_lost["not_ended"] += 1
                        missed += 1
                continue
            # A hang: every rank must have been ended by the watchdog in time.
            incs = by_job.get(job.name, [])
            victims = {int(pid) for inc in incs for pid, outcome in inc["outcome"].items()
                       if outcome == "killed"}
            if not fault.located or not incs or set(job.ring.pids) - victims:
                missed += 1
                why = ("never reached its hung wait" if not fault.located
                       else f"not ended (killed {sorted(victims)} of {job.ring.pids})")
                bad_exits.append(f"{job.name}: {fault.kind} missed: {why}")
                continue
            inc = incs[0]
            deadline = cfg.blocked_deadline if inc["verdict"] == "blocked" else cfg.deadline
            term = min(s["time"] for s in inc["signals"] if s["signal"] == "SIGTERM")
            late = term - fault.wall - deadline
            if late > cfg.bound:
                missed += 1
                bad_exits.append(f"{job.name}: ended {late:.1f}s after its deadline")
                continue
            caught += 1
            slack.append(late)
            ended.append(max(job.exits[pid][1] for pid in job.ring.pids) - fault.wall)
            if fault.kind == "long_pause":
                culprit = inc.get("culprit") or {}
                if culprit.get("pid") != fault.pid:
                    blame_errors.append(f"{job.name}: paused pid {fault.pid}, culprit {culprit}")

        def stat(values: list[float], how: Any) -> float | None:
            return round(how(values), 2) if values else None

        return {
            "seed": cfg.seed,
            "seconds": cfg.seconds,
            "deadline": cfg.deadline,
            "blocked_deadline": cfg.blocked_deadline,
            "interval": cfg.interval,
            "jobs_started": self.started_jobs,
            "rank_processes": len(self.owner),
            "faults_injected": {**self.injected, "clean_exit": clean_jobs,
                                "new_job": self.started_jobs},
            "clean_exits": clean_jobs,
            "short_pauses_survived": short_ok,
            "hangs_caught": caught,
            "hangs_missed": missed + missed_strangers,
            "strangers": {"uid": OTHER_UID, "started": len(self.strangers),
                          "own_hang_ended": len(strangers_ended),
                          "own_hang_missed": missed_strangers},
            "wrong_kills": len(wrong),
            "culprit_errors": len(blame_errors),
            "bad_exits": len(bad_exits),
            "wrong_results": wrong_results,
            "peer_killed_survivors": peer_lost,
            "incidents": len(incidents),
            "slack_median_s": stat(slack, statistics.median),
            "slack_worst_s": stat(slack, max),
            "hang_to_end_median_s": stat(ended, statistics.median),
            "hang_to_end_worst_s": stat(ended, max),
            "problems": wrong + blame_errors + bad_exits
            + [f"stranger {pid}: its own hung record was never acted on"
               for pid in stranger_missed],
        }


def hostile_problems(h: dict[str, Any]) -> list[str]:
    """What the second user's attacks must not achieve."""
    problems = []
    if h["crowd_ended"]:
        problems.append(f"{h['crowd_ended']} of the crowd's healthy processes ended")
    if h["pending_left"] or h["unwritten"]:
        problems.append(f"responses left unfinished ({h['pending_left']}) or unwritten "
                        f"({h['unwritten']})")
    if h["largest_dump_bytes"] > (1 << 20) + 200:
        problems.append(f"a dump copy of {h['largest_dump_bytes']} bytes")
    if h["state_free_bytes"] < 8 << 20:
        problems.append(f"the state disk has {h['state_free_bytes']} bytes left")
    if any(k.startswith("?") for k in h["learned_kinds_of_user"]):
        problems.append(f"unknown op codes became kinds: {h['learned_kinds_of_user']}")
    if h.get("hung_missed") or h.get("hung_unjournaled"):
        problems.append(f"the second user's hung jobs: {h['hung_missed']} not ended, "
                        f"{h['hung_unjournaled']} ended with no incident")
    if h["too_many_open_files"]:
        problems.append(f"{h['too_many_open_files']} 'Too many open files' in the daemon's log")
    return problems


def failed(figures: dict[str, Any]) -> bool:
    return bool(figures["wrong_kills"] or figures["hangs_missed"] or figures["culprit_errors"]
                or figures["bad_exits"] or figures["wrong_results"]
                or (figures.get("hostile") and hostile_problems(figures["hostile"])))


def report(figures: dict[str, Any]) -> str:
    f = figures
    lines = [
        f"soak: seed {f['seed']}, {f['seconds']:g}s of injection ({f['wall_seconds']}s in all), "
        f"deadline {f['deadline']:g}s (blocked {f['blocked_deadline']:g}s), "
        f"interval {f['interval']:g}s",
        f"jobs started        {f['jobs_started']} ({f['rank_processes']} rank processes)",
        "faults injected     " + ", ".join(f"{k} {v}" for k, v in f["faults_injected"].items()),
        f"clean job exits     {f['clean_exits']} (short pauses survived: "
        f"{f['short_pauses_survived']})",
        f"hangs caught        {f['hangs_caught']}",
        f"hangs missed        {f['hangs_missed']}",
        f"wrong kills         {f['wrong_kills']}",
        f"culprit errors      {f['culprit_errors']}",
        f"bad exits           {f['bad_exits']} (wrong all_sum results: {f['wrong_results']})",
        "peer SIGKILLed      survivors ended by MLX error "
        f"{f['peer_killed_survivors']['mlx_error']}, otherwise "
        f"{f['peer_killed_survivors']['other_exit']}, by the watchdog "
        f"{f['peer_killed_survivors']['watchdog']}, not ended "
        f"{f['peer_killed_survivors']['not_ended']}",
        f"detection slack     median {f['slack_median_s']}s, worst {f['slack_worst_s']}s "
        "(first SIGTERM - fault - deadline)",
        f"hang to job gone    median {f['hang_to_end_median_s']}s, "
        f"worst {f['hang_to_end_worst_s']}s",
        f"second user         uid {f['strangers']['uid']}: {f['strangers']['started']} "
        "processes publishing hung, forged and huge records naming real jobs; their own "
        f"hangs ended {f['strangers']['own_hang_ended']}, missed "
        f"{f['strangers']['own_hang_missed']}",
        f"incidents           {f['incidents']}; daemon alive at the end: {f['daemon_alive']}",
    ]
    if f.get("hostile"):
        h = f["hostile"]
        lines.append(
            f"hostile user        crowd {h['crowd']} (ended {h['crowd_ended']}), 64 slow HTTP "
            f"connections, daemon at 256 descriptors (EMFILE {h['too_many_open_files']}); "
            f"largest dump {h['largest_dump_bytes']} B, state free "
            f"{h['state_free_bytes'] >> 20} MiB ({h['state_disk']}); pending "
            f"{h['pending_left']}, unwritten {h['unwritten']}; learned kinds "
            f"{h['learned_kinds_of_user']}")
        lines.append(
            f"hung crowd          {h['hung']} one-process jobs ignoring the dump signal: "
            f"ended {h['hung_ended']}, not ended {h['hung_missed']}, ended unjournaled "
            f"{h['hung_unjournaled']}; huge request heads under way the whole soak")
    lines += [f"PROBLEM: {p}" for p in f["problems"]]
    if f.get("kept"):
        lines.append(f"logs kept in {f['kept']} (daemon-*.log, jobs/*/rank*.log)")
    return "\n".join(lines)


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
