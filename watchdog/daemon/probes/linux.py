"""Linux: wired memory is /proc/meminfo's Unevictable; a thread's demand for a core from
schedstat; stacks from py-spy or gdb."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace

import psutil

from watchdog import gdbstack
from watchdog.daemon.probes import tcpdiag
from watchdog.daemon.probes.base import (
    Probe,
    ProbeError,
    ProcessSample,
    find_tool,
    stack_tool_output,
)
from watchdog.daemon.probes.tcptables import socket_inodes, tcp_queues
from watchdog.procstat import locked_by_uid, read_start_ticks

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def schedstat_seconds(text: str) -> float:
    """/proc/<pid>/task/<tid>/schedstat ("run_ns wait_ns slices"): the seconds the
    thread ran plus those it spent runnable in a run queue, waiting for a core."""
    run, wait = text.split()[:2]
    return (int(run) + int(wait)) / 1e9


def read_demand(pid: int, tids: list[int], proc: str = "/proc") -> tuple[tuple[int, float], ...]:
    """Each thread's run + run-queue time; a thread gone meanwhile (or a kernel
    without schedstats) is left out: its share is then read from its CPU time."""
    found = []
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/schedstat") as f:
                found.append((tid, schedstat_seconds(f.read())))
        except (OSError, ValueError):
            continue
    return tuple(found)


def major_faults(stat: str) -> int:
    """/proc/<pid>/stat's majflt (field 12): counted after the command's closing
    parenthesis, which the command itself may contain."""
    return int(stat.rsplit(")", 1)[1].split()[9])


def read_major_faults(pid: int, proc: str = "/proc") -> int | None:
    """The process's major faults so far (`/proc/<pid>/stat`), None when unreadable."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return major_faults(f.read())
    except (OSError, ValueError, IndexError):
        return None


def thermal_state(zones: list[tuple[str, int, list[tuple[str, int]]]]) -> str | None:
    """The first thermal zone at or past a passive trip point (where the kernel
    throttles), from (zone type, millidegrees, [(trip type, millidegrees)]); None if none."""
    for kind, temp, trips in zones:
        passive = [t for typ, t in trips if typ == "passive" and t > 0]
        if passive and temp >= min(passive):
            return (f"thermal zone {kind} at {temp / 1000:.0f}\u00b0C "
                    f"(throttles at {min(passive) / 1000:.0f}\u00b0C)")
    return None


def read_thermal(sys_class: str = "/sys/class/thermal") -> str | None:
    """Linux thermal zones (where present: most VMs and containers have none)."""
    try:
        names = sorted(n for n in os.listdir(sys_class) if n.startswith("thermal_zone"))
    except OSError:
        return None
    zones = []
    for name in names[:32]:
        base = f"{sys_class}/{name}"
        try:
            with open(f"{base}/type") as f:
                kind = f.read().strip()
            with open(f"{base}/temp") as f:
                temp = int(f.read().strip())
            trips = []
            for i in range(16):
                try:
                    with open(f"{base}/trip_point_{i}_type") as f:
                        typ = f.read().strip()
                    with open(f"{base}/trip_point_{i}_temp") as f:
                        trips.append((typ, int(f.read().strip())))
                except FileNotFoundError:
                    break
        except (OSError, ValueError):
            continue
        zones.append((kind, temp, trips))
    return thermal_state(zones)


def io_bytes(text: str) -> tuple[int, int]:
    """/proc/<pid>/io's (rchar, wchar): the bytes passed to read- and write-like calls,
    storage, pipes and network mounts alike (read_bytes and write_bytes count only what
    reached a block device: not a FIFO, not a page cache flushed later)."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["rchar"]), int(fields["wchar"])


def read_io(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """The process's I/O counters, or None when they cannot be read (another user's
    process without CAP_SYS_PTRACE, a kernel without task I/O accounting)."""
    try:
        with open(f"{proc}/{pid}/io") as f:
            return io_bytes(f.read())
    except (OSError, ValueError, KeyError):
        return None


STACK_READ_LIMIT = 4 << 20  # a backtrace of hundreds of threads is ~1 MB; cut here
# A network namespace's TCP table read once stands for every rank in it for this long
# (one scan reads all of a job's ranks within milliseconds): each read walks the
# kernel's whole TCP hash table, ~1.2 ms of CPU per table, at every scan of a waiting job.
TABLE_FRESH = 0.25


SIGSTOP_BIT = 1 << (19 - 1)  # SIGSTOP (19 on Linux) in /proc's SigPnd/ShdPnd masks


def uninterruptible_threads(pid: int, proc: str = "/proc") -> list[int]:
    """The threads of `pid` in uninterruptible sleep ("D" in their stat); [] if none
    (or if the process is gone)."""
    found: list[int] = []
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return found
    for tid in tids[:65536]:
        try:
            with open(f"{proc}/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "D":
            found.append(int(tid))
    return found


def pending_stop(status: str) -> bool:
    """Does a /proc status text (a process's or a thread's) hold a pending SIGSTOP?"""
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            try:
                if int(line.split()[1], 16) & SIGSTOP_BIT:
                    return True
            except (IndexError, ValueError):
                continue
    return False


def release_pending_stop(pid: int, start_ticks: int, proc: str = "/proc",
                         cut: bool = False) -> bool:
    """After a sample: if a SIGSTOP is still pending in the process (ours, queued by
    gdb's attach to a thread that could not take it), send a SIGCONT, which the kernel
    makes discard every pending stop signal. A sample `cut` at its time box always
    sends one: gdb killed mid-attach leaves its stop in whichever thread it reached,
    pending or already taken (a thread "T (stopped)" while the main thread sleeps: seen
    under load, a healthy rank left stopped for ever and its job ended as
    `peer_stopped`); the sampler never samples a stopped rank, so the stop is ours.
    Only the same process (its start ticks); True when it sent one."""
    if cut:
        return _resume(pid, start_ticks, proc)
    texts = []
    try:
        with open(f"{proc}/{pid}/status") as f:
            texts.append(f.read())
        for tid in os.listdir(f"{proc}/{pid}/task")[:65536]:
            try:
                with open(f"{proc}/{pid}/task/{tid}/status") as f:
                    texts.append(f.read())
            except OSError:
                continue
    except OSError:
        return False
    if not any(pending_stop(text) or _stopped(text) for text in texts):
        return False
    return _resume(pid, start_ticks, proc)


def _stopped(status: str) -> bool:
    return any(line.startswith("State:") and "T (stopped)" in line
               for line in status.splitlines())


def _resume(pid: int, start_ticks: int, proc: str) -> bool:
    try:
        if read_start_ticks(pid, proc) != start_ticks:
            return False  # not the process sampled
        os.kill(pid, signal.SIGCONT)
    except (OSError, ValueError, IndexError):
        return False
    return True


def unevictable_bytes(meminfo: str) -> int:
    """Memory the kernel cannot reclaim: mlocked pages, SHM_LOCK'd segments, ramfs."""
    for line in meminfo.splitlines():
        if line.startswith("Unevictable:"):
            parts = line.split()
            return int(parts[1]) * 1024 if parts[2:3] == ["kB"] else int(parts[1])
    raise ProbeError("no Unevictable line in /proc/meminfo")


def runnable_per_cpu(loadavg: str, cpus: int) -> float:
    """Load per core from /proc/loadavg ("0.50 0.40 0.30 3/250 1234"), at least 1.

    The instant count includes the reader itself, which is not competing
    with the ranks it measures, so one is taken off.
    """
    fields = loadavg.split()
    minute = float(fields[0])
    now = int(fields[3].split("/")[0]) - 1
    return max(1.0, minute / cpus, now / cpus)


SHM_LOCKED = 0o2000  # <linux/shm.h>: the segment's mode bit after shmctl(SHM_LOCK)


def locked_bytes(proc: str = "/proc", leaver: int | None = None) -> int | None:
    """Bytes live processes hold locked (their VmLck) plus the resident bytes of locked
    SysV segments that are theirs: attached to a live process, or created by another uid
    than `leaver` (the owner of the job just ended). A locked segment of that owner that
    no process attaches any more is what its ranks left behind: the leak, not held.
    None when /proc cannot be listed."""
    by_uid = locked_by_uid(proc)
    if by_uid is None:
        return None
    total = sum(by_uid.values())
    try:
        with open(f"{proc}/sysvipc/shm", "rb") as f:
            lines = f.read(1 << 20).splitlines()[1:]
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        try:
            # key shmid perms size cpid lpid nattch uid gid cuid cgid atime dtime ctime rss
            left = int(fields[6]) == 0 and leaver is not None and int(fields[9]) == leaver
            if len(fields) >= 15 and int(fields[2], 8) & SHM_LOCKED and not left:
                total += int(fields[14])  # rss, bytes
        except ValueError:
            continue
    return total


class LinuxProbe(Probe):
    """The probe on Linux: /proc for identities, threads, schedstat, I/O, faults and TCP
    queues; stacks from py-spy or gdb."""
    name = "linux"
    native_ids = True  # psutil's thread ids are the kernel's tids

    def main_thread(self, pid: int, tids: list[int]) -> int | None:
        """The main thread's tid is the pid (the thread group leader)."""
        return pid if pid in tids else None

    def __init__(self, proc: str = "/proc",
                 boot_time: Callable[[], float] | None = None) -> None:
        self.proc = proc
        self.sys_class = "/sys/class/thermal" if proc == "/proc" else f"{proc}/thermal"
        # The seam for a stepped clock: the epoch start time is derived from
        # the boot time as it reads *now* (tests pass a moved one).
        self.boot_time = boot_time
        # (netns inode, table) -> (when read, its text): socket_queues, one thread (the loop)
        self.tables: dict[tuple[int, str], tuple[float, str]] = {}
        # (when dumped, inode -> row; None: the dump failed): socket_counters, the loop
        self.diag: tuple[float, dict[int, tcpdiag.TcpRow] | None] | None = None

    def deleted_holders(self, directory: str) -> dict[int, int] | None:
        """Every process's descriptors (/proc/PID/fd) on a deleted file of `directory`:
        their blocks, by the process's uid (a file's bytes counted once)."""
        prefix = os.path.abspath(directory).rstrip("/") + "/"
        held: dict[int, int] = {}
        seen: set[tuple[int, int]] = set()
        try:
            pids = [name for name in os.listdir(self.proc) if name.isdigit()]
        except OSError:
            return None
        for pid in pids:
            fds = os.path.join(self.proc, pid, "fd")
            try:
                uid = os.stat(os.path.join(self.proc, pid)).st_uid
                names = os.listdir(fds)
            except OSError:
                continue
            for fd in names:
                path = os.path.join(fds, fd)
                try:
                    target = os.readlink(path)
                    if not (target.startswith(prefix) and target.endswith(" (deleted)")):
                        continue
                    st = os.stat(path)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    held[uid] = held.get(uid, 0) + st.st_blocks * 512
        return held

    def sample(self, pid: int) -> ProcessSample | None:
        """psutil's sample and each thread's demand (schedstat), plus the start in
        ticks read before and after them: a pid recycled in between is caught
        instead of mixing two processes."""
        before = self._start_ticks(pid)
        if before is None:
            return None
        # Read first: a pid naming a thread (not its group's leader) costs this one
        # read, not a sample of every thread of its process.
        uids, dumpable, group, tracer = self._credentials(pid)
        if group and group != pid:
            return ProcessSample(pid, 0.0, uids[0] if uids else -1, "thread", (),
                                 start_ticks=before, thread_of=group)
        sample = super().sample(pid)
        if sample is None:
            return None
        # Between the two reads of the start: a pid recycled meanwhile is caught.
        demand = read_demand(pid, [tid for tid, _ in sample.threads], self.proc)
        after = self._start_ticks(pid)
        if after is None:
            return None
        if after != before:
            return None  # the pid was recycled mid-sample: ours is gone
        io = read_io(pid, self.proc)
        faults = read_major_faults(pid, self.proc)
        start_time = (sample.start_time if self.boot_time is None
                      else after / CLOCK_TICKS + self.boot_time())
        return replace(sample, start_time=start_time, start_ticks=after, demand=demand,
                       uids=uids or sample.uids, dumpable=dumpable, io=io,
                       major_faults=faults, tracer=tracer,
                       tracer_name=self._comm(tracer) if tracer else "",
                       tracer_own=self.descends(tracer) if tracer else None)

    def glance(self, pid: int) -> ProcessSample | None:
        """Start ticks and credentials (/proc/<pid>/stat and status), no thread read:
        enough to tell a record of another process, or of a thread, for two reads.
        Credentials unread leave uids () (no verdict: the caller samples)."""
        ticks = self._start_ticks(pid)
        if ticks is None:
            return None
        uids, dumpable, group, _ = self._credentials(pid)
        return ProcessSample(pid, 0.0, uids[0] if uids else -1, "", (), start_ticks=ticks,
                             uids=uids, dumpable=dumpable,
                             thread_of=group if group and group != pid else 0)

    def _start_ticks(self, pid: int) -> int | None:
        """The pid's start ticks; None when it is gone, the read included: a process
        that exits between the open and the read answers ESRCH, not ENOENT."""
        try:
            return read_start_ticks(pid, self.proc)
        except (FileNotFoundError, ProcessLookupError):
            return None
        except (OSError, ValueError, IndexError) as err:
            raise ProbeError(f"reading {self.proc}/{pid}/stat: {err}") from err

    def _comm(self, pid: int) -> str:
        try:
            with open(f"{self.proc}/{pid}/comm") as f:
                return f.read().strip()
        except OSError:
            return ""

    def _credentials(self, pid: int
                     ) -> tuple[tuple[int, ...], bool | None, int, int | None]:
        """(real, effective, saved, fs uids; dumpable; thread group id; TracerPid) from
        /proc, or ((), None, 0, None).

        The kernel gives a process that is not dumpable /proc files owned by
        root (proc(5)): for a non-root process, that owner is its dumpable flag.
        """
        group, line, tracer = 0, "", None
        try:
            with open(f"{self.proc}/{pid}/status") as f:
                owner = os.fstat(f.fileno()).st_uid  # the files', not the folder's
                for ln in f:
                    if ln.startswith("Tgid:"):
                        group = int(ln.split()[1])
                    elif ln.startswith("TracerPid:"):
                        tracer = int(ln.split()[1])
                    elif ln.startswith("Uid:"):
                        line = ln
                        break  # Tgid and TracerPid come before Uid
            uids = tuple(int(u) for u in line.split()[1:5])
        except (OSError, ValueError, IndexError):
            return (), None, 0, None
        if len(uids) != 4:
            return (), None, group, tracer
        return uids, (owner == uids[0]) if uids[0] != 0 else True, group, tracer

    def wired_bytes(self) -> int | None:
        """The node's `Unevictable` memory in bytes; a `ProbeError` when meminfo is unreadable."""
        try:
            with open(f"{self.proc}/meminfo") as f:
                return unevictable_bytes(f.read())
        except (OSError, ValueError) as err:
            raise ProbeError(f"reading {self.proc}/meminfo: {err}") from err

    def held_wired_bytes(self, leaver: int | None = None) -> int | None:
        """Every live process's VmLck (mlock, mlockall: any user's, no privilege needed
        within RLIMIT_MEMLOCK) and every SysV segment locked with SHM_LOCK (it outlives
        its processes: /proc/sysvipc/shm, mode bit SHM_LOCKED) that a live process
        attaches or another uid than `leaver` made (locked_bytes). Pages locked by several
        processes count once each: the sum may exceed what is wired (never a flag)."""
        return locked_bytes(self.proc, leaver)

    def thermal(self) -> str | None:
        """The first thermal zone past its passive trip point (throttling), else None."""
        return read_thermal(self.sys_class)

    def load_per_cpu(self) -> float:
        """The larger of the last minute's load and the threads runnable now.

        The one-minute average lags a sudden contention by tens of seconds;
        the instant count (the fourth field of /proc/loadavg) sees it at once.
        """
        try:
            with open(f"{self.proc}/loadavg") as f:
                return runnable_per_cpu(f.read(), psutil.cpu_count() or 1)
        except (OSError, ValueError):
            return super().load_per_cpu()

    def socket_queues(self, pid: int) -> tuple[tuple[int, int, int], ...] | None:
        """The process's TCP sockets' queues, from its own network namespace's tables."""
        inodes = socket_inodes(pid, self.proc)
        rows: list[tuple[int, int, int]] = []
        for table in ("tcp", "tcp6"):
            if table == "tcp6" and len(rows) == len(inodes):
                # Every socket was found: the kernel walks its whole hash table for each
                # file (~1 ms of CPU here), a cost paid at every scan of a waiting rank.
                break
            try:
                rows += tcp_queues(self.tcp_table(pid, table), inodes)
            except OSError:
                continue
        return tuple(sorted(rows))

    def socket_counters(self, pid: int) -> tuple[tuple[int, int, int], ...] | None:
        """Each TCP socket's (inode, bytes acknowledged, bytes received) from sock_diag
        (probes/tcpdiag.py), for a process in the daemon's own network namespace (the dump
        reads no other); None when any of its sockets has no counters."""
        try:
            if os.stat(f"{self.proc}/{pid}/ns/net").st_ino != os.stat(
                    f"{self.proc}/self/ns/net").st_ino:
                return None
        except OSError:
            return None
        inodes = socket_inodes(pid, self.proc)
        now = time.monotonic()
        if self.diag is None or now - self.diag[0] >= TABLE_FRESH:
            try:
                self.diag = (now, tcpdiag.dump())
            except tcpdiag.DiagError:
                self.diag = (now, None)
        rows = self.diag[1]
        if rows is None:
            return None
        out = []
        for inode in inodes:
            row = rows.get(inode)
            if row is None:
                continue  # not TCP (a unix socket), or a listener: nothing moves there
            if row.bytes_acked is None or row.bytes_received is None:
                return None
            out.append((inode, row.bytes_acked, row.bytes_received))
        return tuple(sorted(out))

    def tcp_table(self, pid: int, table: str) -> str:
        """/proc/<pid>/net/<table>, read once for all the processes of one network
        namespace within TABLE_FRESH (a namespace that cannot be told: read each time)."""
        try:
            netns = os.stat(f"{self.proc}/{pid}/ns/net").st_ino
        except OSError:
            netns = None
        now = time.monotonic()
        if netns is not None:
            known = self.tables.get((netns, table))
            if known is not None and now - known[0] < TABLE_FRESH:
                return known[1]
        with open(f"{self.proc}/{pid}/net/{table}") as f:
            text = f.read()
        if netns is not None:
            for key in [k for k, (at, _) in self.tables.items() if now - at >= TABLE_FRESH]:
                del self.tables[key]
            self.tables[(netns, table)] = (now, text)
        return text

    def native_stacks(self, pid: int, timeout: float) -> dict[int, tuple[str, ...]] | None:
        """gdb's backtrace of every thread (~0.5 s of the target's time, stopped while
        gdb reads it), parsed; None without gdb.

        gdb's attach queues a SIGSTOP to each thread; a thread in uninterruptible sleep
        (a write to slow storage, a vfork) takes it only when it wakes, after a sample
        cut at `timeout`, and the rank then stops with nobody attached, for ever. So a
        rank with such a thread is not sampled (ProbeError), and a SIGSTOP still pending
        once gdb is gone (a thread went to sleep after the check) is discarded with a
        SIGCONT: the sampler never leaves a stop behind (issue 48, defect 2)."""
        gdb = find_tool("gdb")
        if not gdb:
            return None
        asleep = uninterruptible_threads(pid, self.proc)
        if asleep:
            raise ProbeError(f"thread {asleep[0]} of pid {pid} is in uninterruptible sleep: "
                             "a stop would land after the sample")
        try:
            ticks = read_start_ticks(pid, self.proc)
        except (OSError, ValueError, IndexError) as err:
            raise ProbeError(f"reading {self.proc}/{pid}/stat: {err}") from err
        text = None
        try:
            text = stack_tool_output(gdbstack.command(gdb, pid), timeout, STACK_READ_LIMIT,
                                     f"gdb on pid {pid}")
        finally:
            release_pending_stop(pid, ticks, self.proc, cut=text is None)
        return {} if text is None else gdbstack.parse(text)

    def stack_command(self, pid: int) -> list[str] | None:
        """gdb first: evidence is taken from frozen ranks, and gdb reads a stopped
        process and leaves it stopped, where `py-spy dump` fails ("Failed to suspend
        process": unexpected waitpid result); py-spy only without gdb."""
        gdb = find_tool("gdb")
        if gdb:
            return gdbstack.command(gdb, pid)
        pyspy = find_tool("py-spy")
        if pyspy:
            return [pyspy, "dump", "--native", "--pid", str(pid)]
        return None
