"""Issue 55: who traces a rank, as each probe reads it from a real tracer (gdb).

Linux reads /proc's TracerPid; the macOS probe reads proc_bsdinfo's PROC_FLAG_TRACED
and pbi_ppid (xnu reparents a traced process to its tracer), here from the simulated
Mac's libproc stand-in. A tracer the reading process started (the daemon's own stack
sampler) is its own; one started elsewhere (a person's debugger) is not.
"""

from __future__ import annotations

import os
import shlex
import shutil
import struct
import subprocess
import time

import pytest

from watchdog.daemon.probes import macos
from watchdog.daemon.probes.linux import LinuxProbe
from watchdog.macsim import libproc, psutil_mac

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None or not os.path.exists("/proc"),
                                reason="needs gdb and Linux /proc")


def _traced_by(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("TracerPid:")).split()[1])


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        return next(ln for ln in f if ln.startswith("State:")).split()[1] == "t"


def _wait_traced(pid: int, timeout: float = 15.0) -> int:
    """The tracer's pid once it holds `pid` stopped: TracerPid is set at the attach, the
    stop lands a moment later (a read between the two sees the rank running)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        tracer = _traced_by(pid)
        if tracer and _stopped(pid):
            return tracer
        time.sleep(0.05)
    raise AssertionError("gdb never attached")


@pytest.fixture
def target():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _gdb(pid: int, hold: float) -> list[str]:
    return ["gdb", "-q", "-nx", "-batch", "-p", str(pid), "-ex", f"shell sleep {hold}"]


def test_a_tracer_the_reader_started_is_its_own(target):
    gdb = subprocess.Popen(_gdb(target.pid, 3), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        tracer = _wait_traced(target.pid)
        seen = LinuxProbe().sample(target.pid)
        assert seen is not None
        assert (seen.tracer, seen.tracer_name, seen.tracer_own) == (tracer, "gdb", True)
        assert tracer == gdb.pid
    finally:
        gdb.kill()
        gdb.wait()


def test_a_persons_debugger_is_read_by_both_probes_and_gone_at_the_detach(target):
    # Started through a shell that exits: gdb is no descendant of ours (a person's).
    subprocess.run(["sh", "-c", shlex.join(_gdb(target.pid, 3)) + " >/dev/null 2>&1 &"],
                   check=True)
    tracer = _wait_traced(target.pid)
    linux = LinuxProbe().sample(target.pid)
    assert linux is not None
    assert (linux.tracer, linux.tracer_name, linux.tracer_own) == (tracer, "gdb", False)
    assert linux.status == "tracing-stop"
    mac = macos.MacProbe(ps=psutil_mac, libproc=libproc.LibProc()).sample(target.pid)
    assert mac is not None
    assert (mac.tracer, mac.tracer_name, mac.tracer_own) == (tracer, "gdb", False)
    # The raw struct: PROC_FLAG_TRACED set, pbi_ppid the tracer, as xnu reparents it.
    raw = libproc.LibProc().bsdinfo(target.pid)
    flags, ppid = struct.unpack_from("<I", raw, 0)[0], struct.unpack_from("<I", raw, 16)[0]
    assert flags & macos.PROC_FLAG_TRACED and ppid == tracer and len(raw) == 136
    end = time.monotonic() + 15
    while _traced_by(target.pid) and time.monotonic() < end:
        time.sleep(0.05)
    linux = LinuxProbe().sample(target.pid)
    mac = macos.MacProbe(ps=psutil_mac, libproc=libproc.LibProc()).sample(target.pid)
    assert linux is not None and mac is not None
    assert (linux.tracer, mac.tracer) == (0, 0)
    assert macos.bsd_tracer(libproc.LibProc().bsdinfo(target.pid)) == (0, "sleep")


def test_a_short_bsdinfo_is_refused():
    with pytest.raises(ValueError):
        macos.bsd_tracer(b"\0" * 20)
