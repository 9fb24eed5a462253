"""The stack sampler never leaves a rank stopped (issue 48, defect 2).

gdb's attach queues a SIGSTOP to every thread; a thread in uninterruptible sleep (here a
vfork: posix_spawn's child blocks opening a FIFO, a checkpoint write on slow storage in
the field) takes it only when it wakes, after the sample was cut at its time box, and
the rank then stops with nobody attached, for ever. Real gdb, a real process."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from watchdog import gdbstack
from watchdog.daemon.probes import ProbeError, stack_tool_output
from watchdog.daemon.probes.linux import (
    LinuxProbe,
    release_pending_stop,
    uninterruptible_threads,
)
from watchdog.procstat import read_start_ticks

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")]

# The main thread sits in vfork (state D) until someone opens the FIFO for writing,
# then says "ran" ten times a second for as long as it runs.
RANK = """
import os, sys, time
print("ready", flush=True)
os.posix_spawn("/bin/true", ["true"], os.environ,
               file_actions=[(os.POSIX_SPAWN_OPEN, 0, sys.argv[1], os.O_RDONLY, 0)])
while True:
    print("ran", flush=True)
    time.sleep(0.1)
"""


@pytest.fixture
def asleep(tmp_path: Path):
    """A process whose main thread is in uninterruptible sleep; (it, wake it)."""
    assert shutil.which("gdb"), "gdb is needed (apt install gdb)"
    fifo = tmp_path / "checkpoint"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(fifo)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and os.read(proc.stdout.fileno(), 6).startswith(b"ready")
    until = time.monotonic() + 10
    while not uninterruptible_threads(proc.pid) and time.monotonic() < until:
        time.sleep(0.02)
    assert uninterruptible_threads(proc.pid) == [proc.pid]

    def wake() -> None:
        os.close(os.open(fifo, os.O_WRONLY))

    try:
        yield proc, wake
    finally:
        proc.kill()
        proc.wait()


def runs_on(proc: subprocess.Popen) -> bool:
    """Does it say "ran" again within a few seconds (a stopped process says nothing)?"""
    assert proc.stdout is not None
    fd, said = proc.stdout.fileno(), b""
    until = time.monotonic() + 5
    while b"ran" not in said and time.monotonic() < until:
        if select.select([fd], [], [], 0.1)[0]:
            said += os.read(fd, 4096)
    return b"ran" in said


def test_a_rank_in_uninterruptible_sleep_is_not_sampled_and_runs_on(asleep) -> None:
    proc, wake = asleep
    with pytest.raises(ProbeError, match="uninterruptible sleep"):
        LinuxProbe().native_stacks(proc.pid, 1.0)
    wake()
    assert runs_on(proc)


@pytest.mark.parametrize("released", [False, True])
def test_a_stop_queued_by_a_cut_sample_is_discarded(asleep, released: bool) -> None:
    """A thread that went to sleep after the check: gdb's stop is queued, the sample is
    cut; without the release the rank stops for ever when it wakes (the control)."""
    proc, wake = asleep
    gdb = shutil.which("gdb")
    assert gdb
    ticks = read_start_ticks(proc.pid)
    assert stack_tool_output(gdbstack.command(gdb, proc.pid), 1.0, 1 << 20, "gdb") is None
    if released:
        assert release_pending_stop(proc.pid, ticks, cut=True)
    wake()
    assert runs_on(proc) is released


@pytest.mark.parametrize("cut", [True, False])
def test_a_stop_already_taken_when_gdb_is_gone_is_undone(cut: bool) -> None:
    """Under load gdb is killed at its time box mid-attach, and its stop may already
    have been taken when the sampler looks (the rank "T (stopped)", nothing pending):
    seen in the suite, a healthy trainer rank stopped for ever and its job ended as
    `peer_stopped`. Cut or not, a stopped rank after our sample is resumed."""
    proc = subprocess.Popen([sys.executable, "-c", RUNS], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ran\n"
        ticks = read_start_ticks(proc.pid)
        os.kill(proc.pid, 19)  # SIGSTOP, taken at once: nothing left pending
        deadline = time.monotonic() + 5
        while "T (stopped)" not in Path(f"/proc/{proc.pid}/status").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        fd = proc.stdout.fileno()
        while select.select([fd], [], [], 0.2)[0]:  # what it said before the stop
            os.read(fd, 4096)
        assert not runs_on(proc)  # the control: stopped, it says nothing
        assert release_pending_stop(proc.pid, ticks, cut=cut)
        assert runs_on(proc)
    finally:
        proc.kill()
        proc.wait()


RUNS = """
import time
while True:
    print("ran", flush=True)
    time.sleep(0.1)
"""
