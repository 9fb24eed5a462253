"""macOS: wired memory from the VM statistics; native stacks from `sample`."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import re
import struct
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psutil

from watchdog.daemon.probes import gputime, powermetrics, samplegraph
from watchdog.daemon.probes.base import Probe, ProbeError, ProcessSample, stack_tool_output
from watchdog.status import HotThread

# The tools the probe runs, by their absolute paths on macOS: never looked up on PATH.
TOOLS = {"sample": "/usr/bin/sample", "ioreg": "/usr/sbin/ioreg", "pmset": "/usr/bin/pmset",
         "powermetrics": "/usr/bin/powermetrics"}

RUSAGE_INFO_V2, RUSAGE_INFO_V4 = 2, 4
# struct rusage_info_v2 (<sys/resource.h>): a 16-byte uuid, 16 uint64 counters, then
# ri_diskio_bytesread and ri_diskio_byteswritten; 8 more uint64 follow in v2.
RUSAGE_V2_SIZE = 16 + 26 * 8
# struct rusage_info_v4 (macOS 10.15+; every Apple silicon Mac): v2's fields, v3's
# billed and serviced system time, then 8 more uint64, ri_runnable_time the last: the
# time the process's threads spent runnable, waiting for a core (mach absolute time).
RUSAGE_V4_SIZE = 16 + 35 * 8
RUNNABLE = struct.Struct("<Q")
RUNNABLE_OFFSET = 16 + 34 * 8
DISKIO = struct.Struct("<QQ")
DISKIO_OFFSET = 16 + 16 * 8
PAGEINS = struct.Struct("<Q")
PAGEINS_OFFSET = 16 + 4 * 8  # ri_pageins: after user, system time and the two wakeups
WIRED = struct.Struct("<Q")
WIRED_OFFSET = 16 + 5 * 8  # ri_wired_size: next after ri_pageins


def rusage_pageins(buffer: bytes) -> int:
    """ri_pageins (pages read back in: macOS's major faults) of a struct rusage_info_v2."""
    if len(buffer) < PAGEINS_OFFSET + PAGEINS.size:
        raise ValueError("a short rusage_info_v2")
    return int(PAGEINS.unpack_from(buffer, PAGEINS_OFFSET)[0])


def pmset_therm(text: str) -> str | None:
    """`pmset -g therm`'s output: the CPU speed limit when under 100%, and a thermal
    warning level when one was recorded; None when the node is not throttled."""
    parts = []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "CPU_Speed_Limit":
            try:
                limit = int(value.strip())
            except ValueError:
                continue
            if 0 <= limit < 100:
                parts.append(f"CPU speed limit {limit}% (thermal)")
        low = line.strip().lower()
        if low.startswith("thermal warning level") and "no thermal" not in low:
            parts.append(line.strip().rstrip("."))
    return "; ".join(parts) or None


CPU_TIMES = struct.Struct("<QQ")  # ri_user_time, ri_system_time: right after the uuid
CPU_TIMES_OFFSET = 16


def thermal_pressure(text: str) -> str | None:
    """`powermetrics --samplers thermal`'s "Current pressure level: Moderate" (Nominal,
    Moderate, Heavy, Trapping, Sleeping): said when above Nominal, else None."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "current pressure level":
            level = value.strip()
            return f"thermal pressure {level}" if level and level != "Nominal" else None
    return None


def rusage_runnable(buffer: bytes, timebase: tuple[int, int]) -> float:
    """ri_runnable_time of a struct rusage_info_v4, in seconds (`timebase`: the
    (numer, denom) of mach_timebase_info, nanoseconds per tick; 125/3 on Apple silicon)."""
    if len(buffer) < RUNNABLE_OFFSET + RUNNABLE.size:
        raise ValueError("a short rusage_info_v4")
    numer, denom = timebase
    return float(RUNNABLE.unpack_from(buffer, RUNNABLE_OFFSET)[0] * numer / denom / 1e9)


def rusage_run_queue(buffer: bytes, timebase: tuple[int, int]) -> float:
    """The process's threads' time on a run queue, waiting for a core, in seconds:
    ri_runnable_time counts running time too (xnu osfmk/kern/thread.h: "runnable
    (including running)"), so its CPU time (ri_user_time + ri_system_time, mach absolute
    time on Apple silicon, as psutil reads them) comes off it."""
    numer, denom = timebase
    user, system = CPU_TIMES.unpack_from(buffer, CPU_TIMES_OFFSET)
    return max(0.0, rusage_runnable(buffer, timebase) - float(user + system) * numer / denom / 1e9)


def rusage_io(buffer: bytes) -> tuple[int, int]:
    """(bytes read, bytes written) from a struct rusage_info_v2 as proc_pid_rusage fills it."""
    if len(buffer) < DISKIO_OFFSET + DISKIO.size:
        raise ValueError("a short rusage_info_v2")
    read, written = DISKIO.unpack_from(buffer, DISKIO_OFFSET)
    return int(read), int(written)


@functools.lru_cache(maxsize=1)
def _libproc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("proc") or "/usr/lib/libproc.dylib")
    except OSError:
        return None


PROC_PIDLISTFDS, PROC_PIDFDSOCKETINFO, PROX_FDTYPE_SOCKET = 1, 3, 2
FDINFO = struct.Struct("<iI")  # struct proc_fdinfo: proc_fd, proc_fdtype
# struct socket_fdinfo (<sys/proc_info.h>): proc_fileinfo (24 bytes), then socket_info:
# vinfo_stat (136), soi_so at 160 (the socket's opaque handle: its identity), ...,
# soi_rcv at 208 and soi_snd at 232 (struct sockbuf_info, sbi_cc first: bytes held),
# soi_kind at 256 (SOCKINFO_TCP = 2); 792 bytes in all.
SOCKET_FDINFO_SIZE = 792
SOI_SO, SOI_RCV_CC, SOI_SND_CC, SOI_KIND = 160, 208, 232, 256
SOCKINFO_TCP = 2
MAX_FDS = 4096  # descriptors listed at first; a full listing is asked again, larger
MAX_FDS_EVER = 1 << 18
# struct vnode_fdinfo: proc_fileinfo (fi_openflags, fi_status, fi_offset, ...: 24 bytes)
# then vnode_info (152); fi_offset is the descriptor's offset, which every read and
# write through it advances (xnu vn_read/vn_write: `fg_offset += count - uio_resid`),
# a FIFO's and a network mount's file's too, where ri_diskio counts no byte.
PROC_PIDFDVNODEINFO, PROX_FDTYPE_VNODE = 1, 1
VNODE_FDINFO_SIZE = 176
FILEINFO = struct.Struct("<IIq")


# struct proc_bsdinfo (proc_pidinfo PROC_PIDTBSDINFO, 136 bytes): pbi_flags first,
# pbi_ppid at 16, pbi_comm (16 bytes) at 48. PROC_FLAG_TRACED is set while a tracer holds
# the process (P_LTRACED), and xnu's ptrace(PT_ATTACH) reparents it to its tracer
# (`proc_reparentlocked`, the old parent kept in p_oppid) until the detach: pbi_ppid
# is then the tracer (lldb's debugserver; a ptrace-attaching profiler).
PROC_PIDTBSDINFO, BSDINFO_SIZE, PROC_FLAG_TRACED = 3, 136, 0x2
BSD_HEAD = struct.Struct("<5I")
BSD_COMM_OFFSET = 48


def bsd_tracer(buffer: bytes) -> tuple[int, str]:
    """(the tracer's pid, 0 when not traced; the process's pbi_comm) of a struct
    proc_bsdinfo."""
    if len(buffer) < BSDINFO_SIZE:
        raise ValueError("a short proc_bsdinfo")
    flags, _status, _xstatus, _pid, ppid = BSD_HEAD.unpack_from(buffer, 0)
    comm = buffer[BSD_COMM_OFFSET:BSD_COMM_OFFSET + 16].split(b"\0", 1)[0]
    return (int(ppid) if flags & PROC_FLAG_TRACED else 0), comm.decode("utf-8", "replace")


def read_bsdinfo(pid: int, libproc: Any = None) -> tuple[int, str] | None:
    """bsd_tracer of the process, or None when it cannot be read."""
    lib = libproc if libproc is not None else _libproc()
    if lib is None:
        return None
    info = ctypes.create_string_buffer(BSDINFO_SIZE)
    try:
        filled = lib.proc_pidinfo(ctypes.c_int(pid), ctypes.c_int(PROC_PIDTBSDINFO),
                                  ctypes.c_uint64(0), info, ctypes.c_int(BSDINFO_SIZE))
    except (AttributeError, OSError):
        return None
    if filled < BSDINFO_SIZE:
        return None
    return bsd_tracer(info.raw)


def socket_counts(buffer: bytes) -> tuple[int, int, int] | None:
    """(soi_so, soi_snd.sbi_cc, soi_rcv.sbi_cc) of a TCP socket's struct socket_fdinfo;
    None for another kind of socket."""
    if len(buffer) < SOI_KIND + 4:
        raise ValueError("a short socket_fdinfo")
    if struct.unpack_from("<i", buffer, SOI_KIND)[0] != SOCKINFO_TCP:
        return None
    (handle,) = struct.unpack_from("<Q", buffer, SOI_SO)
    (received,) = struct.unpack_from("<I", buffer, SOI_RCV_CC)
    (queued,) = struct.unpack_from("<I", buffer, SOI_SND_CC)
    return int(handle), int(queued), int(received)


def file_offset(buffer: bytes) -> int:
    """fi_offset of a struct vnode_fdinfo (its proc_fileinfo comes first)."""
    if len(buffer) < FILEINFO.size:
        raise ValueError("a short vnode_fdinfo")
    return max(0, int(FILEINFO.unpack_from(buffer, 0)[2]))


def _fdinfos(pid: int, lib: Any, kind: int, flavor: int, size: int) -> list[bytes] | None:
    """proc_pidfdinfo(`flavor`) of each descriptor of the process of type `kind`, through
    proc_pidinfo(PROC_PIDLISTFDS); None without libproc or when not permitted."""
    if lib is None:
        return None
    room = MAX_FDS
    while True:  # a process with more descriptors than the room: again, with more
        listing = ctypes.create_string_buffer(FDINFO.size * room)
        try:
            filled = lib.proc_pidinfo(ctypes.c_int(pid), ctypes.c_int(PROC_PIDLISTFDS),
                                      ctypes.c_uint64(0), listing, ctypes.c_int(len(listing)))
        except (AttributeError, OSError):
            return None
        if filled < len(listing) or room >= MAX_FDS_EVER:
            break
        room *= 4
    if filled <= 0:
        return None
    out = []
    info = ctypes.create_string_buffer(size)
    for offset in range(0, min(filled, len(listing)) - FDINFO.size + 1, FDINFO.size):
        fd, fdtype = FDINFO.unpack_from(listing.raw, offset)
        if fdtype != kind:
            continue
        if lib.proc_pidfdinfo(ctypes.c_int(pid), ctypes.c_int(fd), ctypes.c_int(flavor),
                              info, ctypes.c_int(size)) < size:
            continue  # closed meanwhile, or not ours to read
        out.append(info.raw)
    return out


def read_socket_queues(pid: int, libproc: Any = None) -> tuple[tuple[int, int, int], ...] | None:
    """Each TCP socket of the process through proc_pidfdinfo(PROC_PIDFDSOCKETINFO):
    (handle, bytes queued to send, bytes received not yet read); None without libproc
    or when not permitted."""
    infos = _fdinfos(pid, libproc if libproc is not None else _libproc(),
                     PROX_FDTYPE_SOCKET, PROC_PIDFDSOCKETINFO, SOCKET_FDINFO_SIZE)
    if infos is None:
        return None
    return tuple(c for c in map(socket_counts, infos) if c is not None)


def read_offsets(pid: int, libproc: Any = None) -> int | None:
    """The sum of the offsets of the process's open files (proc_pidfdinfo
    PROC_PIDFDVNODEINFO): it moves when the process reads or writes any of them, a
    FIFO or a file on a network mount too; None without libproc or when not permitted."""
    infos = _fdinfos(pid, libproc if libproc is not None else _libproc(),
                     PROX_FDTYPE_VNODE, PROC_PIDFDVNODEINFO, VNODE_FDINFO_SIZE)
    return None if infos is None else sum(map(file_offset, infos))


# Threads through libproc, as root reads them for any process (no task_for_pid, which a
# hardened-runtime or Apple-signed interpreter refuses even root; psutil <= 7.2 needs it):
# proc_pidinfo(PROC_PIDLISTTHREADIDS) lists the thread ids (uint64: the ids
# `threading.get_native_id()` returns), proc_pidinfo(PROC_PIDTHREADID64INFO, id) fills
# each one's struct proc_threadinfo (pth_user_time, pth_system_time in ns first; xnu
# bsd/sys/proc_info.h).
PROC_PIDLISTTHREADIDS, PROC_PIDTHREADID64INFO = 28, 15
THREADINFO_SIZE = 112
THREAD_TIMES = struct.Struct("<QQ")
MAX_THREADS = 4096


def read_threads(pid: int, libproc: Any = None) -> list[tuple[int, int, int]] | None:
    """(thread id, user ns, system ns) of each thread of the process, in the kernel's
    order (the main thread first); None without libproc or when not permitted."""
    lib = libproc if libproc is not None else _libproc()
    if lib is None:
        return None
    listing = ctypes.create_string_buffer(8 * MAX_THREADS)
    try:
        filled = lib.proc_pidinfo(ctypes.c_int(pid), ctypes.c_int(PROC_PIDLISTTHREADIDS),
                                  ctypes.c_uint64(0), listing, ctypes.c_int(len(listing)))
    except (AttributeError, OSError):
        return None
    if filled <= 0:
        return None
    ids = struct.unpack_from(f"<{min(filled, len(listing)) // 8}Q", listing.raw)
    info = ctypes.create_string_buffer(THREADINFO_SIZE)
    out = []
    for tid in ids:
        if not tid:
            continue
        if lib.proc_pidinfo(ctypes.c_int(pid), ctypes.c_int(PROC_PIDTHREADID64INFO),
                            ctypes.c_uint64(tid), info,
                            ctypes.c_int(THREADINFO_SIZE)) < THREADINFO_SIZE:
            continue  # ended meanwhile
        user, system = THREAD_TIMES.unpack_from(info.raw, 0)
        out.append((int(tid), int(user), int(system)))
    return out


def read_io(pid: int, libproc: Any = None) -> tuple[int, int] | None:
    """The process's disk I/O counters through proc_pid_rusage, or None (no libproc, or
    not permitted: another user's process without root)."""
    raw = _rusage(pid, libproc)
    return None if raw is None else rusage_io(raw)


def read_pageins(pid: int, libproc: Any = None) -> int | None:
    """Pages the process read in from disk (its major faults) through proc_pid_rusage,
    or None."""
    raw = _rusage(pid, libproc)
    return None if raw is None else rusage_pageins(raw)


def _rusage(pid: int, libproc: Any = None, flavor: int = RUSAGE_INFO_V2) -> bytes | None:
    """The process's proc_pid_rusage (version 2, or 4) as bytes, or None (no libproc, or
    not permitted: another user's process without root)."""
    lib = libproc if libproc is not None else _libproc()
    if lib is None:
        return None
    buffer = ctypes.create_string_buffer(RUSAGE_V4_SIZE if flavor == RUSAGE_INFO_V4
                                         else RUSAGE_V2_SIZE)
    try:
        if lib.proc_pid_rusage(ctypes.c_int(pid), ctypes.c_int(flavor), buffer) != 0:
            return None
    except (AttributeError, OSError):
        return None
    return buffer.raw


class _Timebase(ctypes.Structure):
    _fields_ = [("numer", ctypes.c_uint32), ("denom", ctypes.c_uint32)]


APPLE_SILICON_TIMEBASE = (125, 3)


@functools.lru_cache(maxsize=1)
def system_timebase() -> tuple[int, int] | None:
    """mach_timebase_info's (numer, denom) from libSystem, or None where there is none.
    An x86_64 Python under Rosetta is told 1/1 while the kernel's counters it reads
    (proc_pid_rusage) stay in Apple silicon's ticks: 125/3 then."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("System") or "/usr/lib/libSystem.B.dylib")
        info = _Timebase()
        if lib.mach_timebase_info(ctypes.byref(info)) != 0 or not info.denom:
            return None
        translated = ctypes.c_int(0)
        size = ctypes.c_size_t(ctypes.sizeof(translated))
        if lib.sysctlbyname(b"sysctl.proc_translated", ctypes.byref(translated),
                            ctypes.byref(size), None, ctypes.c_size_t(0)) == 0 \
                and translated.value == 1:
            return APPLE_SILICON_TIMEBASE
    except (AttributeError, OSError):
        return None
    return int(info.numer), int(info.denom)


class MacProbe(Probe):
    """Threads through libproc (read_threads): the kernel's ids, `threading.
    get_native_id()`'s, matched against the record's table of Python threads and
    `sample`'s `Thread_<id>`. Without libproc, psutil's: positions in `task_threads`
    order, main first (the inherited `main_thread`), which match nothing."""

    name = "macos"
    gpu_clock = True  # MLX computes on the GPU: its time is read from ioreg
    # `sample PID 1` samples for a second, then symbolicates every image: on the
    # stand-in 1.7 s idle, 3.9 s at a load of 5-6 (gdb behind it), past the 3 s box a
    # Linux gdb read gets, where every sample "read nothing" and no wedge was decided.
    # A slow sampler must cost time, not the rule; a real Mac's is to be measured
    # (docs/macos.md, `doctor --mac-check`).
    stack_timeout = 5.0

    def __init__(self, ps: Any = psutil, libproc: Any = None,
                 tool: Callable[[str], list[str] | None] | None = None,
                 timebase: Callable[[], tuple[int, int] | None] = system_timebase) -> None:
        """Its sources: psutil, libproc (None: the system's), the command of a tool by
        name and mach_timebase_info; the simulated Mac (watchdog/macsim) hands in its
        stand-ins."""
        self.ps = ps
        self.libproc = libproc
        self.tool = tool or system_tool
        self.timebase = timebase

    def sample(self, pid: int) -> ProcessSample | None:
        sample = super().sample(pid)
        if sample is None:
            return None
        threads = read_threads(pid, self.libproc)
        if threads:  # the kernel's ids, whatever psutil's version gives (positions, ids)
            sample = replace(sample, threads=tuple((t, (u + s) / 1e9) for t, u, s in threads),
                             system=tuple((t, s / 1e9) for t, _, s in threads),
                             main_tid=threads[0][0], native_ids=True)
        elif not sample.threads:
            sample = replace(sample, threads_error=(
                "its threads could not be read (libproc's PROC_PIDLISTTHREADIDS refused, "
                "psutil's threads() too: task_for_pid is refused for a hardened or "
                "Apple-signed interpreter)"))
        # One proc_pid_rusage (v4) a scan: the disk bytes, the page-ins and the threads'
        # run-queue time (ri_runnable_time: macOS keeps no run-queue time per thread, so
        # a straggler's run queue is the process's, docs/limits.md).
        # The disk counters see no byte to a FIFO or a network mount: the files' offsets do.
        raw = _rusage(pid, self.libproc, RUSAGE_INFO_V4)
        offsets = read_offsets(pid, self.libproc)
        sample = self._traced(sample)
        if raw is None:
            return replace(sample, io=read_io(pid, self.libproc),
                           major_faults=read_pageins(pid, self.libproc), offsets=offsets)
        timebase = self.timebase()
        return replace(sample, io=rusage_io(raw), major_faults=rusage_pageins(raw),
                       runnable=rusage_run_queue(raw, timebase) if timebase else None,
                       offsets=offsets)

    def _traced(self, sample: ProcessSample) -> ProcessSample:
        """Its tracer (pbi_flags' PROC_FLAG_TRACED; the tracer is then its parent), named
        by the tracer's own pbi_comm."""
        read = read_bsdinfo(sample.pid, self.libproc)
        if read is None:
            return sample
        tracer = read[0]
        if not tracer:
            return replace(sample, tracer=0)
        theirs = read_bsdinfo(tracer, self.libproc)
        return replace(sample, tracer=tracer, tracer_name=theirs[1] if theirs else "",
                       tracer_own=self.descends(tracer))

    def socket_queues(self, pid: int) -> tuple[tuple[int, int, int], ...] | None:
        """Each TCP socket's (handle, bytes to send, bytes unread): soi_snd/soi_rcv."""
        return read_socket_queues(pid, self.libproc)

    def thermal(self) -> str | None:
        """The node's thermal state: `pmset -g therm`'s CPU speed limit (Intel Macs; on
        Apple silicon it prints only its notes, even while throttled), and the thermal
        pressure Apple silicon does give (`powermetrics --samplers thermal`, root)."""
        said = [self._run("pmset", "-g", "therm", parse=pmset_therm),
                self._run("powermetrics", "--samplers", "thermal", "-n", "1", "-i", "1",
                          parse=thermal_pressure)]
        return "; ".join(s for s in said if s) or None

    def _run(self, name: str, *args: str,
             parse: Callable[[str], str | None]) -> str | None:
        tool = self.tool(TOOLS[name])
        if tool is None:
            return None
        try:
            done = subprocess.run([*tool, *args], capture_output=True, text=True,
                                  timeout=2, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return None
        return parse(done.stdout[:1 << 16]) if done.returncode == 0 else None

    def wired_bytes(self) -> int | None:
        """The node's wired memory in bytes; a `ProbeError` when it cannot be read."""
        try:
            return int(self.ps.virtual_memory().wired)  # type: ignore[attr-defined]
        except (OSError, AttributeError) as err:
            raise ProbeError(f"reading wired memory: {err}") from err

    def held_wired_bytes(self, leaver: int | None = None) -> int | None:
        """Every live process's wired size (proc_pid_rusage's ri_wired_size: on Apple
        silicon a process's Metal buffers are wired in its own map), summed: what live
        processes hold is theirs, never the node's leak. None when no process could be
        read (not root). Never run on hardware (docs/macos.md)."""
        total, read = 0, False
        try:
            pids = self.ps.pids()
        except OSError:
            return None
        for pid in pids:
            raw = _rusage(pid, self.libproc, RUSAGE_INFO_V2)
            if raw is not None and len(raw) >= WIRED_OFFSET + WIRED.size:
                total += int(WIRED.unpack_from(raw, WIRED_OFFSET)[0])
                read = True
        return total if read else None

    def stack_command(self, pid: int) -> list[str] | None:
        """`sample PID 1` by its absolute path, or None where there is no `sample`."""
        sample = self.tool(TOOLS["sample"])
        # `sample PID 1`: one second of samples of every thread, to stdout.
        return [*sample, str(pid), "1"] if sample else None

    def hot_frames(self, text: str) -> list[HotThread] | None:
        """`sample`'s report parsed: each thread's hot frames ([] without a call graph)."""
        return samplegraph.parse(text)

    def gpu_time(self, pid: int, timeout: float) -> int | None:
        """`ioreg`'s AGXDeviceUserClient entries of the process, their GPU time summed;
        None without ioreg or without a Metal client. Never run on hardware."""
        return self.gpu_reading(pid, timeout)[0]

    def gpu_reading(self, pid: int, timeout: float) -> tuple[int | None, str]:
        """`gpu_time`, with why it could not be read ("" when it was): no ioreg, ioreg
        timed out or failed, no client listed for the pid, or a client whose format
        holds no `accumulatedGPUTime`."""
        ioreg = self.tool(TOOLS["ioreg"])
        if not ioreg:
            return None, "no ioreg on this node"
        try:
            done = subprocess.run([*ioreg, "-r", "-c", "AGXDeviceUserClient", "-l", "-w0"],
                                  capture_output=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return None, f"ioreg ran past its {timeout:g}s time box"
        except OSError as err:
            return None, f"ioreg did not run: {err}"
        if done.returncode != 0:
            return None, f"ioreg failed (exit {done.returncode})"
        text = done.stdout[:8 << 20].decode("utf-8", "replace")
        found = gputime.gpu_time_by_pid(text)
        names = gputime.client_names(text)
        # Every Metal client's, for the GPU shared with another job (gpu_others).
        self.gpu_table = {p: (ns, names.get(p, "")) for p, ns in found.items()}
        if pid in found:
            return found[pid], ""
        if gputime.listed(text, pid):
            return None, f"ioreg lists pid {pid} with no accumulatedGPUTime (a format not read)"
        return None, f"ioreg lists no Metal client for pid {pid}"

    def gpu_others(self, pid: int) -> dict[int, tuple[int, str]] | None:
        """The other Metal clients' GPU time and name, from the last ioreg read."""
        table = getattr(self, "gpu_table", None)
        if table is None:
            return None
        return {p: entry for p, entry in table.items() if p != pid}

    def gpu_power(self, timeout: float) -> powermetrics.GpuPower | None:
        """One half-second sample of `powermetrics --samplers gpu_power` (root only; the
        whole GPU's residency and power: judge/gpuwork.py); None without it, not root, or
        an output it cannot read. Never run on hardware."""
        tool = self.tool(TOOLS["powermetrics"])
        if not tool:
            return None
        try:
            done = subprocess.run([*tool, "--samplers", "gpu_power", "-n", "1", "-i", "500"],
                                  capture_output=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, check=False)
        except (subprocess.TimeoutExpired, OSError):
            return None
        if done.returncode != 0:
            return None
        return powermetrics.parse(done.stdout[:powermetrics.MAX_TEXT].decode("utf-8",
                                                                            "replace"))

    def native_stacks(self, pid: int, timeout: float) -> dict[int, tuple[str, ...]] | None:
        """`sample PID 1`'s heaviest path of each thread, leaf first, by position (not
        the OS's thread ids: judge/frames.py then takes every thread not parked as
        busy). Never run on hardware (docs/macos.md)."""
        command = self.stack_command(pid)
        if not command:
            return None
        # The report to a file of our own (`-file`), read back and removed: no report
        # is left behind, wherever `sample` would put one; stdout when the file is empty.
        fd, path = tempfile.mkstemp(prefix="mlx-watchdog-sample-", suffix=".txt")
        os.close(fd)
        try:
            text = stack_tool_output([*command, "-file", path], timeout, 8 << 20,
                                     f"sample on pid {pid}")
            with contextlib.suppress(OSError), open(path, "rb") as f:
                report = f.read(8 << 20).decode("utf-8", "replace")
                text = report or text
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return {} if text is None else sample_stacks(text)


def system_tool(path: str) -> list[str] | None:
    """The command of the macOS tool at `path` (one of TOOLS), if it is there: by its
    absolute path, never looked up on the caller's PATH (a root daemon started by hand
    from a shell whose PATH leads through a user's folder runs no tool of theirs)."""
    if path not in TOOLS.values() or not os.access(path, os.X_OK):
        return None
    return [path]


_THREAD_ID = re.compile(r"^Thread_(\d+)")


def sample_stacks(text: str) -> dict[int, tuple[str, ...]]:
    """Each thread of a `sample` report as its heaviest path, leaf first, by its id
    (`Thread_<id>`: the kernel's thread id, libproc's), or by position when a thread
    line names none."""
    threads = samplegraph.parse(text)
    ids = [_THREAD_ID.match(t.thread) for t in threads]
    if all(ids) and len({m.group(1) for m in ids if m}) == len(ids):
        return {int(m.group(1)): tuple(p.frame for p in reversed(t.path))
                for m, t in zip(ids, threads, strict=True) if m}
    return {i: tuple(p.frame for p in reversed(t.path)) for i, t in enumerate(threads)}
