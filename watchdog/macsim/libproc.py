"""libproc as macOS answers it, built from the live Linux process.

Called as the macOS probe calls `ctypes.CDLL("libproc.dylib")`: each function fills
a caller's buffer with the bytes of xnu's structures (layouts from the public
headers, apple-oss-distributions/xnu bsd/sys/proc_info.h and bsd/sys/resource.h,
little-endian arm64) and returns what the real one returns.

    proc_pid_rusage(pid, RUSAGE_INFO_V4, buf)  struct rusage_info_v4 (296 bytes)
    proc_pidinfo(pid, PROC_PIDLISTTHREADS, 0, buf, size)  uint64 thread handles
    proc_pidinfo(pid, PROC_PIDTHREADINFO, handle, buf, size)  struct proc_threadinfo (112)
    proc_pidinfo(pid, PROC_PIDLISTTHREADIDS, 0, buf, size)  uint64 thread ids
    proc_pidinfo(pid, PROC_PIDTHREADID64INFO, id, buf, size)  struct proc_threadinfo
    proc_pidinfo(pid, PROC_PIDLISTFDS, 0, buf, size)  struct proc_fdinfo {int32 fd; uint32 type}
    proc_pidinfo(pid, PROC_PIDTBSDINFO, 0, buf, size)  struct proc_bsdinfo (136)
    proc_pidfdinfo(pid, fd, PROC_PIDFDSOCKETINFO, buf, size)  struct socket_fdinfo (792)
    proc_pidfdinfo(pid, fd, PROC_PIDFDVNODEINFO, buf, size)  struct vnode_fdinfo (176)
    mach_timebase_info()  (numer, denom) of mach absolute time: Apple silicon's 125/3

Where Linux keeps no such count the stand-in guesses, and says so: ri_runnable_time is
the threads' schedstat run + wait (xnu counts running time as runnable); the disk bytes are /proc's
read_bytes/write_bytes; a socket's `soi_so` (an opaque kernel address on a Mac) is
its inode here; a file's fi_offset is /proc's fdinfo `pos`, but for a FIFO, where Linux
keeps 0 and a Mac advances it with every byte (xnu's vn_write), the process's bytes read
or written (/proc's rchar, wchar), which move with the FIFO's bytes (and its others).
Fields a Mac fills and the daemon does not read are left zero. A process traced (Linux's
TracerPid) has PROC_FLAG_TRACED in pbi_flags and its tracer as pbi_ppid: xnu's
ptrace(PT_ATTACH) reparents the traced process to its tracer (`proc_reparentlocked`)
until the detach.
Failures return -1 or 0 as the real calls do (errno is not set: no caller reads it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import stat
import struct
from typing import Any

from watchdog.macsim import gpu

RUSAGE_INFO_V2, RUSAGE_INFO_V4 = 2, 4
PROC_PIDLISTFDS, PROC_PIDTHREADINFO, PROC_PIDLISTTHREADS = 1, 5, 6
PROC_PIDTHREADID64INFO, PROC_PIDLISTTHREADIDS = 15, 28
PROC_PIDTBSDINFO = 3
# struct proc_bsdinfo: pbi_flags, pbi_status, pbi_xstatus, pbi_pid, pbi_ppid, the uids
# and gids, rfu_1; pbi_comm[16], pbi_name[32]; nfiles, pgid, pjobc, e_tdev, e_tpgid;
# pbi_nice; the start (tv_sec, tv_usec).
BSDINFO = struct.Struct("<12I16s32s5Ii2Q")
PROC_FLAG_TRACED = 0x2  # pbi_flags: P_LTRACED (xnu proc_info.c fill_bsdinfo)
PROC_PIDFDSOCKETINFO, PROC_PIDFDVNODEINFO = 3, 1
# struct vnode_fdinfo: proc_fileinfo (fi_openflags, fi_status, fi_offset, fi_type,
# fi_guardflags: 24 bytes), then vnode_info (152).
VNODE_FDINFO_SIZE = 176
FILEINFO = struct.Struct("<IIq")
PROX_FDTYPE_VNODE, PROX_FDTYPE_SOCKET, PROX_FDTYPE_PIPE = 1, 2, 6
SOCKINFO_TCP = 2
AF_INET_MAC, AF_INET6_MAC = 2, 30  # <sys/socket.h> on a Mac
TSI_S_ESTABLISHED = 4
TIMEBASE = (125, 3)  # Apple silicon: one mach tick is 125/3 ns

# struct rusage_info_v4: a 16-byte uuid then 35 uint64, ri_runnable_time the last.
RUSAGE_V4 = struct.Struct("<16s35Q")
RUSAGE_FIELDS = ("user_time", "system_time", "pkg_idle_wkups", "interrupt_wkups", "pageins",
                 "wired_size", "resident_size", "phys_footprint", "proc_start_abstime",
                 "proc_exit_abstime", "child_user_time", "child_system_time",
                 "child_pkg_idle_wkups", "child_interrupt_wkups", "child_pageins",
                 "child_elapsed_abstime", "diskio_bytesread", "diskio_byteswritten",
                 "cpu_time_qos_default", "cpu_time_qos_maintenance",
                 "cpu_time_qos_background", "cpu_time_qos_utility", "cpu_time_qos_legacy",
                 "cpu_time_qos_user_initiated", "cpu_time_qos_user_interactive",
                 "billed_system_time", "serviced_system_time", "logical_writes",
                 "lifetime_max_phys_footprint", "instructions", "cycles", "billed_energy",
                 "serviced_energy", "interval_max_phys_footprint", "runnable_time")
# struct proc_threadinfo: user and system time (ns), 8 int32, a 64-byte name.
THREADINFO = struct.Struct("<QQ8i64s")
TH_STATE = {"R": 1, "T": 2, "t": 2, "S": 3, "I": 3, "D": 4}  # TH_STATE_* of proc_info.h
FDINFO = struct.Struct("<iI")
# struct socket_fdinfo: proc_fileinfo (24), then socket_info: vinfo_stat (136),
# soi_so, soi_pcb, type, protocol, family, 7 shorts and an u_short, oobmark, soi_rcv and
# soi_snd (sockbuf_info: 5 uint32 and 2 shorts), soi_kind, rfu_1, the 528-byte union.
SOCKET_FDINFO_SIZE = 792
SOI_SO = 24 + 136
SOI_HEAD = struct.Struct("<QQiii7hHI")  # soi_so .. soi_oobmark
SOCKBUF = struct.Struct("<5I2h")
SOI_RCV = SOI_SO + SOI_HEAD.size  # 208
SOI_SND = SOI_RCV + SOCKBUF.size  # 232
SOI_KIND = SOI_SND + SOCKBUF.size  # 256
SOI_PROTO = SOI_KIND + 8  # 264
# in_sockinfo's head (fport, lport, gencnt, flags, flow, vflag, ttl, rfu) then, past
# the two 16-byte addresses and the v4/v6 tails (40 bytes in all), tcpsi_state.
IN_SOCKINFO_HEAD = struct.Struct("<iiQIIBB2xI")
TCPSI_STATE = SOI_PROTO + 80


def _value(arg: Any) -> int:
    return int(getattr(arg, "value", arg))


def _fill(buffer: Any, data: bytes, size: int | None = None) -> int:
    room = len(buffer) if size is None else min(size, len(buffer))
    data = data[:room]
    ctypes.memmove(buffer, data, len(data))
    return len(data)


def abstime(nanoseconds: float) -> int:
    """`nanoseconds` in mach absolute time units (the timebase's ticks)."""
    numer, denom = TIMEBASE
    return int(nanoseconds * denom / numer)


class LibProc:
    """The four libproc calls the macOS probe makes, plus the timebase."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.tick = os.sysconf("SC_CLK_TCK")

    # -- rusage -----------------------------------------------------------

    def proc_pid_rusage(self, pid: Any, flavor: Any, buffer: Any) -> int:
        """libproc's call: `rusage_info_v2`/`v4` of `pid` into `buffer`; 0, or -1
        for another flavor or a process gone."""
        pid, flavor = _value(pid), _value(flavor)
        if flavor not in (RUSAGE_INFO_V2, RUSAGE_INFO_V4):
            return -1
        try:
            values = self.rusage(pid)
        except OSError:
            return -1
        _fill(buffer, RUSAGE_V4.pack(b"\0" * 16, *(values.get(n, 0) for n in RUSAGE_FIELDS)))
        return 0

    def rusage(self, pid: int) -> dict[str, int]:
        fields = self._stat(f"{self.proc}/{pid}/stat")
        io = self._keyed(f"{self.proc}/{pid}/io")
        ns = 1e9 / self.tick
        user, system = int(fields[11]), int(fields[12])
        for tid in gpu.hidden(pid, self.proc):  # the Mac's GPU time is not its CPU time
            with contextlib.suppress(OSError, ValueError, IndexError):
                task = self._stat(f"{self.proc}/{pid}/task/{tid}/stat")
                user, system = user - int(task[11]), system - int(task[12])
        return {"user_time": abstime(max(0, user) * ns),
                "system_time": abstime(max(0, system) * ns),
                "pageins": int(fields[9]),
                "resident_size": int(fields[21]) * os.sysconf("SC_PAGE_SIZE"),
                "diskio_bytesread": io.get("read_bytes", 0),
                "diskio_byteswritten": io.get("write_bytes", 0),
                # A Mac's ri_runnable_time: runnable including running (xnu thread.h).
                "runnable_time": abstime(sum(sum(self._schedstat(pid, tid))
                                             for tid in self.tids(pid)))}

    # -- threads ----------------------------------------------------------

    def tids(self, pid: int) -> list[int]:
        """Kernel thread ids in task order, main first (psutil_mac's positions)."""
        gpu_threads = gpu.hidden(pid, self.proc)  # MLX's compute: the Mac's GPU (gpu.py)
        ids = sorted(int(t) for t in os.listdir(f"{self.proc}/{pid}/task")
                     if int(t) not in gpu_threads)
        return [t for t in ids if t == pid] + [t for t in ids if t != pid]

    def proc_pidinfo(self, pid: Any, flavor: Any, arg: Any, buffer: Any, size: Any) -> int:
        """libproc's call: the `flavor` asked of `pid` (its threads, a thread's info,
        its file descriptors, its BSD info) into `buffer`; the bytes written, 0 when
        nothing could be read."""
        pid, flavor, arg, size = _value(pid), _value(flavor), _value(arg), _value(size)
        try:
            if flavor == PROC_PIDLISTTHREADS:
                return _fill(buffer, b"".join(struct.pack("<Q", t) for t in self.tids(pid)),
                             size)
            if flavor == PROC_PIDTHREADINFO or flavor == PROC_PIDTHREADID64INFO:
                return _fill(buffer, self.threadinfo(pid, arg), size)
            if flavor == PROC_PIDLISTTHREADIDS:  # thread ids: the kernel's tids here
                return _fill(buffer, b"".join(struct.pack("<Q", t) for t in self.tids(pid)),
                             size)
            if flavor == PROC_PIDTBSDINFO:
                return _fill(buffer, self.bsdinfo(pid), size)
            if flavor == PROC_PIDLISTFDS:
                return _fill(buffer, b"".join(FDINFO.pack(fd, kind)
                                              for fd, kind in self.fds(pid)), size)
        except (OSError, ValueError, IndexError):
            return 0
        return 0

    def bsdinfo(self, pid: int) -> bytes:
        """struct proc_bsdinfo: the flags (traced), pid, parent (the tracer while traced),
        uids and name; the rest zero."""
        status = {k: v for k, _, v in (line.partition(":") for line in
                                       open(f"{self.proc}/{pid}/status"))}
        tracer = int(status.get("TracerPid", "0").split()[0] or 0)
        ppid = int(status.get("PPid", "0").split()[0] or 0)
        uid = [int(u) for u in status.get("Uid", "0 0 0").split()[:3]]
        gid = [int(g) for g in status.get("Gid", "0 0 0").split()[:3]]
        with open(f"{self.proc}/{pid}/comm", "rb") as f:
            comm = f.read().strip()[:15]
        return BSDINFO.pack(PROC_FLAG_TRACED if tracer else 0, 2, 0, pid, tracer or ppid,
                            uid[1], gid[1], uid[0], gid[0], uid[2], gid[2], 0, comm, comm,
                            0, 0, 0, 0, 0, 0, 0, 0)

    def threadinfo(self, pid: int, tid: int) -> bytes:
        fields = self._stat(f"{self.proc}/{pid}/task/{tid}/stat")
        ns = 1e9 / self.tick
        with open(f"{self.proc}/{pid}/task/{tid}/comm", "rb") as f:
            name = f.read().strip()[:63]
        return THREADINFO.pack(int(int(fields[11]) * ns), int(int(fields[12]) * ns),
                               0, 0, TH_STATE.get(fields[0], 3), 0, 0, 31, 31, 63, name)

    # -- descriptors and sockets ------------------------------------------

    def fds(self, pid: int) -> list[tuple[int, int]]:
        out = []
        for name in sorted(os.listdir(f"{self.proc}/{pid}/fd"), key=int):
            try:
                target = os.readlink(f"{self.proc}/{pid}/fd/{name}")
            except OSError:
                continue
            kind = (PROX_FDTYPE_SOCKET if target.startswith("socket:")
                    else PROX_FDTYPE_PIPE if target.startswith("pipe:") else PROX_FDTYPE_VNODE)
            out.append((int(name), kind))
        return out

    def proc_pidfdinfo(self, pid: Any, fd: Any, flavor: Any, buffer: Any, size: Any) -> int:
        """libproc's call: a socket's or a vnode's info of `pid`'s `fd` into
        `buffer`; the bytes written, 0 for another kind or nothing read."""
        pid, fd, flavor, size = _value(pid), _value(fd), _value(flavor), _value(size)
        if flavor == PROC_PIDFDVNODEINFO and size >= VNODE_FDINFO_SIZE:
            return self._vnode_fdinfo(pid, fd, buffer, size)
        if flavor != PROC_PIDFDSOCKETINFO or size < SOCKET_FDINFO_SIZE:
            return 0
        try:
            target = os.readlink(f"{self.proc}/{pid}/fd/{fd}")
        except OSError:
            return 0
        if not target.startswith("socket:["):
            return 0
        inode = int(target[8:-1])
        row = self.tcp_rows(pid).get(inode)
        data = bytearray(SOCKET_FDINFO_SIZE)
        if row is None:  # not TCP: a generic socket, no buffer counts read
            SOI_HEAD.pack_into(data, SOI_SO, inode, 0, socket.SOCK_STREAM, 0, 1,
                               0, 0, 0, 0, 0, 0, 0, 0, 0)
            return _fill(buffer, bytes(data), size)
        family, lport, fport, state, tx_queue, rx_queue = row
        SOI_HEAD.pack_into(data, SOI_SO, inode, 0, socket.SOCK_STREAM, 6, family,
                           0, 0, 0, 0, 0, 0, 0, 0, 0)
        SOCKBUF.pack_into(data, SOI_RCV, rx_queue, 0, 0, 0, 1, 0, 0)
        SOCKBUF.pack_into(data, SOI_SND, tx_queue, 0, 0, 0, 2048, 0, 0)
        struct.pack_into("<i", data, SOI_KIND, SOCKINFO_TCP)
        IN_SOCKINFO_HEAD.pack_into(data, SOI_PROTO, fport, lport, 0, 0, 0,
                                   1 if family == AF_INET_MAC else 2, 64, 0)
        struct.pack_into("<i", data, TCPSI_STATE, state)
        return _fill(buffer, bytes(data), size)

    def _vnode_fdinfo(self, pid: int, fd: int, buffer: Any, size: int) -> int:
        """struct vnode_fdinfo of a file: its proc_fileinfo (open flags as FREAD/FWRITE,
        the offset) from /proc's fdinfo; the vnode_info after it left zero."""
        try:
            target = os.readlink(f"{self.proc}/{pid}/fd/{fd}")
            with open(f"{self.proc}/{pid}/fdinfo/{fd}") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            return 0
        if target.startswith(("socket:", "pipe:", "anon_inode:")):
            return 0
        try:
            pos, flags = int(fields["pos"]), int(fields["flags"], 8)
        except (KeyError, ValueError):
            return 0
        with contextlib.suppress(OSError):
            if stat.S_ISFIFO(os.stat(f"{self.proc}/{pid}/fd/{fd}").st_mode):
                pos = self._fifo_offset(pid, flags & os.O_ACCMODE)
        data = bytearray(VNODE_FDINFO_SIZE)
        FILEINFO.pack_into(data, 0, (flags & os.O_ACCMODE) + 1, 0, pos)  # FFLAGS(oflags)
        return _fill(buffer, bytes(data), size)

    def _fifo_offset(self, pid: int, mode: int) -> int:
        """A FIFO's fi_offset as a Mac advances it (xnu vn_read/vn_write move it by every
        byte through the descriptor), where Linux keeps 0: the process's bytes read
        (rchar) or written (wchar) through any call, a guess that moves with the FIFO's
        bytes and with the process's other reads and writes too."""
        io = self._keyed(f"{self.proc}/{pid}/io")
        read, written = io.get("rchar", 0), io.get("wchar", 0)
        return {os.O_RDONLY: read, os.O_WRONLY: written}.get(mode, read + written)

    def tcp_rows(self, pid: int) -> dict[int, tuple[int, int, int, int, int, int]]:
        """inode -> (family, local port, foreign port, TSI_S state, tx, rx) from the
        process's network namespace's tcp tables."""
        rows = {}
        for name, family in (("tcp", AF_INET_MAC), ("tcp6", AF_INET6_MAC)):
            try:
                with open(f"{self.proc}/{pid}/net/{name}") as f:
                    lines = f.read().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                parts = line.split()
                if len(parts) < 10:
                    continue
                tx, rx = (int(x, 16) for x in parts[4].split(":"))
                state = TSI_S_ESTABLISHED if parts[3] == "01" else 0
                rows[int(parts[9])] = (family, int(parts[1].split(":")[1], 16),
                                       int(parts[2].split(":")[1], 16), state, tx, rx)
        return rows

    @staticmethod
    def mach_timebase_info() -> tuple[int, int]:
        """The mach timebase (numer, denom): Apple silicon's 125/3."""
        return TIMEBASE

    # -- /proc --------------------------------------------------------------

    @staticmethod
    def _stat(path: str) -> list[str]:
        """Fields from the state letter on (field 3 of stat is index 0)."""
        with open(path) as f:
            text = f.read()
        return text[text.rindex(")") + 2:].split()

    @staticmethod
    def _keyed(path: str) -> dict[str, int]:
        try:
            with open(path) as f:
                return {k: int(v) for k, _, v in (line.partition(": ") for line in f) if v}
        except (OSError, ValueError):
            return {}

    def _schedstat(self, pid: int, tid: int) -> tuple[int, int]:
        try:
            with open(f"{self.proc}/{pid}/task/{tid}/schedstat") as f:
                run, wait = f.read().split()[:2]
            return int(run), int(wait)
        except (OSError, ValueError):
            return 0, 0
