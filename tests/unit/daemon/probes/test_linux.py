"""The Linux probe, on this machine's real /proc, and its two parsers."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from watchdog.daemon.probes import ProbeError, same_process
from watchdog.daemon.probes.linux import (
    LinuxProbe,
    runnable_per_cpu,
    schedstat_seconds,
    unevictable_bytes,
)

MEMINFO = "MemTotal:       16384 kB\nUnevictable:        2048 kB\nMlocked:  0 kB\n"


def test_unevictable_bytes_parses_kilobytes() -> None:
    assert unevictable_bytes(MEMINFO) == 2048 * 1024


def test_unevictable_missing_is_a_probe_error() -> None:
    with pytest.raises(ProbeError):
        unevictable_bytes("MemTotal: 1 kB\n")


@pytest.mark.parametrize(("text", "cpus", "expected"), [
    ("0.10 0.20 0.30 1/200 99", 2, 1.0),  # quiet: never under one
    ("6.00 2.00 1.00 1/200 99", 2, 3.0),  # a minute of load
    ("0.50 0.20 0.10 7/200 99", 2, 3.0),  # sudden: 6 runnable besides the reader
    ("9.00 0.20 0.10 7/200 99", 2, 4.5),  # the larger of the two
])
def test_runnable_per_cpu(text: str, cpus: int, expected: float) -> None:
    assert runnable_per_cpu(text, cpus) == expected


def test_load_sees_sudden_contention_at_once() -> None:
    """Three busy loops started a moment ago: the minute average has barely
    moved, but the probe already reports the machine oversubscribed."""
    probe = LinuxProbe()
    cpus = psutil.cpu_count() or 1
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(cpus + 2)]
    try:
        deadline = time.monotonic() + 10
        seen = 1.0
        while time.monotonic() < deadline and seen <= 1.0:
            seen = max(seen, probe.load_per_cpu())
            time.sleep(0.05)
        assert seen > 1.0
    finally:
        for b in burners:
            b.kill()
            b.wait()


def test_wired_bytes_follows_mlocked_memory() -> None:
    """Locked pages are what a leaked GPU wiring looks like on Linux."""
    probe = LinuxProbe()
    size = 4 << 20
    before = probe.wired_bytes()
    assert isinstance(before, int) and before >= 0
    buf = mmap.mmap(-1, size)
    libc = ctypes.CDLL(None, use_errno=True)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size)) != 0:
        pytest.fail(f"mlock failed: {os.strerror(ctypes.get_errno())} (RLIMIT_MEMLOCK?)")
    try:
        during = probe.wired_bytes()
        assert during is not None and during - before >= size // 2
    finally:
        libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        buf.close()


def test_sample_of_this_process() -> None:
    probe = LinuxProbe()
    me = psutil.Process()
    sample = probe.sample(os.getpid())
    assert sample.pid == os.getpid()
    assert same_process(sample, me.create_time(), os.getuid())
    assert not same_process(sample, me.create_time() + 5, os.getuid())
    assert {tid for tid, _ in sample.threads} == {t.id for t in me.threads()}


def test_schedstat_is_run_plus_run_queue_time() -> None:
    assert schedstat_seconds("1500000000 500000000 42\n") == 2.0
    me = os.getpid()
    demand = dict(LinuxProbe().sample(me).demand)
    assert demand and set(demand) <= {t.id for t in psutil.Process().threads()}
    assert all(seconds >= 0 for seconds in demand.values())


def _tools(folder, names: tuple[str, ...]) -> str:
    """A PATH of stand-ins for `names` (each prints its name and argv, exit 0)."""
    for name in names:
        tool = folder / name
        tool.write_text(f"#!/bin/sh\necho {name} \"$@\"\n")
        tool.chmod(0o755)
    return str(folder)


@pytest.mark.parametrize("have, picked", [
    (("gdb", "py-spy"), "gdb"), (("py-spy",), "py-spy"), (("gdb",), "gdb"), ((), None)])
def test_native_evidence_takes_gdb_before_py_spy(tmp_path, monkeypatch, have, picked):
    """Evidence is taken from frozen ranks: gdb reads a stopped process, py-spy cannot.
    Each is looked for in the daemon's own tool folders (host.TOOL_PATH), never on the
    caller's PATH (issue 57)."""
    from watchdog import host

    monkeypatch.setattr(host, "TOOL_PATH", _tools(tmp_path, have))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    command = LinuxProbe().stack_command(4242)
    assert (None if command is None else os.path.basename(command[0])) == picked
    if command is not None:
        assert "4242" in command


@pytest.mark.slow
def test_the_native_evidence_command_reads_a_stopped_process_and_leaves_it_stopped():
    """What the ladder does: the rank frozen first (SIGSTOP), its native stacks after."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        os.kill(sleeper.pid, signal.SIGSTOP)
        command = LinuxProbe().stack_command(sleeper.pid)
        assert command is not None, "no gdb: .ci/run installs it"
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "time_sleep" in done.stdout or "clock_nanosleep" in done.stdout, done.stdout
        assert psutil.Process(sleeper.pid).status() == psutil.STATUS_STOPPED
    finally:
        sleeper.kill()
        sleeper.wait()


def test_held_wired_memory_is_every_processs_locked_and_locked_segments(tmp_path) -> None:
    """Issue 57, item 3: what live processes lock (VmLck, any uid) and SysV segments
    locked with SHM_LOCK (mode bit 02000; they outlive their processes) are theirs."""
    from watchdog.daemon.act.wired import HELD, wired_check
    from watchdog.daemon.probes.linux import locked_bytes

    for pid, kib in (("10", 8192), ("11", 0), ("12", 4096)):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "status").write_text(f"Name:\tx\nUid:\t1\t1\t1\t1\nVmLck:\t{kib} kB\n")
    (tmp_path / "sysvipc").mkdir()
    head = "key shmid perms size cpid lpid nattch uid gid cuid cgid atime dtime ctime rss swap\n"
    locked = "0 1 3600 4194304 5 5 0 1 1 1 1 0 0 0 4194304 0\n"  # 02000 | 0600
    unlocked = "0 2 600 4194304 5 5 0 1 1 1 1 0 0 0 4194304 0\n"
    (tmp_path / "sysvipc" / "shm").write_text(head + locked + unlocked)
    assert locked_bytes(str(tmp_path)) == (8 + 4 + 4) << 20
    # The ended job's owner (uid 1) made it and no process attaches it: left behind, the
    # leak (tests/ranks/daemon/test_hangs.py's); another uid's is theirs, held.
    assert locked_bytes(str(tmp_path), leaver=1) == (8 + 4) << 20
    assert locked_bytes(str(tmp_path), leaver=2) == (8 + 4 + 4) << 20
    attached = locked.replace(" 5 5 0 1 ", " 5 5 1 1 ")  # nattch 1: a live process's
    (tmp_path / "sysvipc" / "shm").write_text(head + attached + unlocked)
    assert locked_bytes(str(tmp_path), leaver=1) == (8 + 4 + 4) << 20
    assert locked_bytes(str(tmp_path / "none")) is None
    gib = 1 << 30
    # 1.5 GiB above the baseline, 1 GiB threshold: 600 MiB held leaves 900 MiB: theirs.
    said = wired_check(10 * gib, 10 * gib + 1536 * 2**20, gib, lambda: False,
                       lambda: 600 << 20)
    assert said.wired_check == HELD
    assert wired_check(10 * gib, 10 * gib + 1536 * 2**20, gib, lambda: False,
                       lambda: 100 << 20).wired_check == "leaked"
    assert wired_check(10 * gib, 10 * gib + 1536 * 2**20, gib, lambda: False,
                       lambda: None).wired_check == "leaked"  # unknown: as before


def test_a_tool_on_the_callers_path_is_never_run(tmp_path, monkeypatch):
    """Issue 57: root's daemon started from a shell whose PATH leads through a user's
    folder with a `gdb` in it runs the system's gdb (or none), never that one."""
    monkeypatch.setenv("PATH", _tools(tmp_path, ("gdb", "py-spy")) + os.pathsep
                       + os.environ["PATH"])
    command = LinuxProbe().stack_command(4242)
    assert command is None or not command[0].startswith(str(tmp_path)), command


def test_the_settle_takes_off_only_what_live_processes_locked_since_the_node_was_at_rest():
    """What live processes held at rest stands in the baseline too: taken off again it
    would hide a leak that size (on a Mac every Metal process's wired memory); only what
    they locked since is theirs. Not read at rest: all they hold (never a false flag)."""
    from watchdog.daemon.act.wired import HELD, held_since, wired_check

    mib = 1 << 20
    assert held_since(100 * mib, 60 * mib) == 40 * mib
    assert held_since(50 * mib, 60 * mib) == 0  # they let go meanwhile: nothing theirs
    assert held_since(None, 60 * mib) is None and held_since(70 * mib, None) == 70 * mib
    # 64 MiB left by the ended job, 48 MiB another user held all along: a leak.
    said = wired_check(1000 * mib, 1112 * mib, 16 * mib, lambda: False,
                       lambda: held_since(48 * mib, 48 * mib))
    assert said.wired_check == "leaked"
    # 48 MiB locked by another user since the node was at rest, nothing left: theirs.
    said = wired_check(1000 * mib, 1048 * mib, 16 * mib, lambda: False,
                       lambda: held_since(48 * mib, 0))
    assert said.wired_check == HELD


@pytest.mark.parametrize("read", ["sample", "glance"])
def test_a_process_that_ends_between_the_open_and_the_read_is_gone_not_a_failure(
        monkeypatch, read):
    # CI saw it: a rank exiting while sampled answers ESRCH on its open stat file; that
    # is "gone" (a quiet exit), not a probe failure logged as a WARNING for a person.
    from watchdog import procstat
    from watchdog.daemon.probes import linux

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ended = []

    def ends_mid_read(pid, proc="/proc"):
        with open(f"{proc}/{pid}/stat") as f:
            child.kill()
            child.wait()
            try:
                return procstat.start_ticks(f.read())
            except ProcessLookupError:
                ended.append(pid)  # the kernel's own ESRCH, not a made-up one
                raise

    monkeypatch.setattr(linux, "read_start_ticks", ends_mid_read)
    try:
        assert getattr(LinuxProbe(), read)(child.pid) is None
        assert ended == [child.pid]
    finally:
        child.kill()
        child.wait()


def test_locked_memory_by_owner_is_one_walk_for_the_node_and_the_launch_gate(tmp_path):
    # The daemon's settle (locked_bytes: every owner) and the launch's gate
    # (locked_by_others: every owner but the caller) read the same walk.
    from watchdog.launch.health import locked_by_others
    from watchdog.procstat import locked_by_uid

    for pid, uid, kib in (("10", 1, 8192), ("11", 2, 1024), ("12", 1, 0), ("13", 2, 2048)):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "status").write_text(
            f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nVmLck:\t{kib} kB\n")
    (tmp_path / "14").mkdir()  # a kernel thread's: no VmLck line
    (tmp_path / "14" / "status").write_text("Name:\tkthreadd\nUid:\t0\t0\t0\t0\n")
    assert locked_by_uid(str(tmp_path)) == {1: 8 << 20, 2: 3 << 20}
    assert locked_by_others(1, str(tmp_path)) == 3 << 20
    assert locked_by_others(2, str(tmp_path)) == 8 << 20
    assert locked_by_uid(str(tmp_path / "none")) is None
    assert locked_by_others(1, str(tmp_path / "none")) is None
