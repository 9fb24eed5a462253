"""The soak's second local user (uid 65534): the processes it runs and what they may not achieve.

Part of the chaos soak of benchmarks/soak.py (its docstring tells the whole story; run
that, not this). Each `spawn_*` forks a child that becomes OTHER_UID and never returns:

    spawn_stranger       records naming a real job: its own hung one, a forged rank, a
                         world of 2**31-1 ranks (the driver spawns these as it goes)
    spawn_crowd_member   a sleeping process with a valid record (a crowd of 40 that
                         would take the daemon's descriptors; one mints op codes)
    spawn_hung_member    a one-process job hung in a wait, ignoring its dump signal
    spawn_head_flood     the largest HTTP request heads the parser takes, over and over
    spawn_slow_client    64 HTTP connections trickling a byte a second

`Hostile` keeps the attacks on the daemon that last the whole soak (all but the
strangers), reports what they left, and ends them; `hostile_problems` says which of
those figures mean an attack succeeded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.support.ranks import DaemonProc
from tests.support.records import SyntheticWriter
from tests.support.users import become
from watchdog import record
from watchdog.daemon.probes.linux import read_start_ticks
from watchdog.states import Phase

OTHER_UID = 65534  # the second local user (nobody)

@dataclass
class Stranger:
    """A process of another uid whose records name a real job."""

    pid: int
    job: str
    wall: float
    mono: float
    code: int | None = None  # its exit status, once reaped
    cleanup: bool = False  # still alive at the end: ended by the driver


def fork_as_other(record_dir: Path | None) -> int:
    """fork(): the child's pid in the parent; 0 in the child, once it has become OTHER_UID
    (moved into `record_dir` first, where given: relative names from there, as the path
    above may be root's only). A child that cannot ends at once, with status 1."""
    # The codecs a child uses after it is OTHER_UID, loaded while it can read them (this
    # Python's files may be root's only): socket.create_connection needs idna.
    "x".encode("idna")
    pid = os.fork()
    if pid == 0:
        try:
            if record_dir is not None:
                os.chdir(record_dir)
            become(OTHER_UID)
        except BaseException:
            os._exit(1)
    return pid


def spawn_stranger(record_dir: Path, job: str, size: int, victim: int) -> int:
    """Fork a child that becomes OTHER_UID and publishes, itself, three records
    naming `job`: its own, hung in a wait since boot; one forging `victim`
    (a real rank's pid, with the stranger's uid); one with a huge world."""
    victim_start = psutil.Process(victim).create_time()
    pid = fork_as_other(record_dir)
    if pid:
        return pid
    try:
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


def own_record(host: str, job: str, dump_signal: int) -> SyntheticWriter:
    """The record of a job of one process, this one (a child that became OTHER_UID, in
    the record directory)."""
    me = os.getpid()
    return SyntheticWriter(
        f"{me}.rec", pid=me, start_time=psutil.Process().create_time(), uid=OTHER_UID,
        host=host, job=job, rank=0, world_size=1, backend="ring",
        dump_signal=dump_signal, start_ticks=read_start_ticks("self"))


def spawn_crowd_member(record_dir: Path, n: int, mint: bool) -> int:
    """A sleeping process of OTHER_UID with a valid, healthy record of its own (one of a
    crowd that would take the daemon's descriptors); with `mint`, its record waits on a
    new unknown op code every second (to grow what the auto deadline learns)."""
    pid = fork_as_other(record_dir)
    if pid:
        return pid
    try:
        writer = own_record("crowd", f"crowd-{n}", 0)
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
    pid = fork_as_other(record_dir)
    if pid:
        return pid
    try:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        writer = own_record("hung", f"hung-{n}", int(signal.SIGUSR2))
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

    pid = fork_as_other(None)
    if pid:
        return pid
    try:
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

    pid = fork_as_other(None)
    if pid:
        return pid
    try:
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


class Hostile:
    """The second user's attacks on the daemon for the whole soak: a crowd of 40
    record-publishing sleepers at a 256-descriptor limit, 64 slow HTTP clients, a flood
    of huge request heads, and batches of one-process jobs hung ignoring the dump signal
    (issue 30). The strangers, spawned by the driver as it goes, are not kept here."""

    def __init__(self, record_dir: Path, state_dir: Path, state_mounted: bool,
                 daemon: DaemonProc, bound: float, say: Callable[[str], None]) -> None:
        self.record_dir = record_dir
        self.state_dir = state_dir
        self.state_mounted = state_mounted
        self.daemon = daemon
        self.bound = bound  # a hung job not ended this long after it was spawned is missed
        self.say = say
        self.crowd: list[int] = []  # the second user's sleeping processes
        self.slow_client: int | None = None
        self.head_flood: int | None = None
        self.hung: dict[int, float] = {}  # the second user's hung one-process jobs -> spawned
        self.hung_ended: dict[int, int] = {}  # pid -> exit status (reaped before stop)

    def start(self) -> None:
        """Start the attacks that last the whole soak (see the class docstring)."""
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

    def figures(self) -> dict[str, Any]:
        """What the second user's attacks left: each must be zero or within its bound."""
        crowd_gone = [pid for pid in self.crowd if os.waitpid(pid, os.WNOHANG)[0]]
        self.reap_hung()
        journaled = {int(p) for inc in self.daemon.incidents() if inc.get("uid") == OTHER_UID
                     for p, outcome in inc.get("outcome", {}).items() if outcome == "killed"}
        now = time.monotonic()
        hung_missed = [pid for pid, spawned in self.hung.items()
                       if pid not in self.hung_ended and now - spawned > self.bound]
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

    def stop(self) -> None:
        """End every process of the attacks still alive (the hung jobs count as ended)."""
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
