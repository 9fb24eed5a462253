"""Another user's ranks cannot starve a job's wedge of its stack samples (issue 48,
defect 4). Real gdb, real processes: ten ranks of uid 65534 each loaded a library and
put a FIFO in its place, so root's gdb blocks opening it for the whole time box (at no
CPU), and they are asked first at every scan; the victim's two ranks are still sampled
within a few seconds, and again and again."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.users import OTHER_UID, fork_as
from watchdog.daemon.probes.linux import LinuxProbe
from watchdog.daemon.probes.stacksampler import MAX_RUNNING, Identity, StackSampler

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")]

ATTACKERS = 10


def identity(probe: LinuxProbe, pid: int, uid: int) -> Identity:
    sample = probe.sample(pid)
    assert sample is not None
    return Identity(pid, sample.start_time, uid, sample.start_ticks)


@pytest.fixture
def fifo_ranks():
    """Ten processes of uid 65534 whose loaded library's path is now a FIFO."""
    assert shutil.which("gdb") and shutil.which("cc"), "gdb and cc are needed"
    theirs = Path(f"/tmp/mlxwd-fifo-{os.getpid()}")
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    (theirs / "l.c").write_text("int f(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(theirs / "proto.so"),
                    str(theirs / "l.c")], check=True)
    os.chmod(theirs / "proto.so", 0o644)
    pids, reads = [], []
    try:
        for n in range(ATTACKERS):
            lib = theirs / f"lib{n}.so"

            def rank(report: int, lib: Path = lib) -> None:
                shutil.copy(theirs / "proto.so", lib)
                ctypes.CDLL(str(lib))
                lib.unlink()
                os.mkfifo(lib)  # gdb opens the name it finds in the link map
                os.write(report, b"ready")
                time.sleep(60)

            pid, read = fork_as(OTHER_UID, rank)
            pids.append(pid)
            reads.append(read)
        for read in reads:
            assert os.read(read, 5) == b"ready"
        yield pids
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for read in reads:
            os.close(read)
        shutil.rmtree(theirs, ignore_errors=True)


def test_another_users_fifo_ranks_leave_the_victim_its_share(fifo_ranks) -> None:
    probe = LinuxProbe()
    victims = [subprocess.Popen([sys.executable, "-c", "import time\nwhile 1: time.sleep(1)"])
               for _ in range(2)]
    workers = ThreadPoolExecutor(max_workers=MAX_RUNNING)
    try:
        time.sleep(0.2)
        attackers = [identity(probe, pid, OTHER_UID) for pid in fifo_ranks]
        mine = [identity(probe, v.pid, os.getuid()) for v in victims]
        sampler = StackSampler(probe, workers.submit)
        began = time.monotonic()
        sampled: dict[int, list[float]] = {who.pid: [] for who in mine}
        while time.monotonic() - began < 8.0:  # scans, the attacker's ranks first
            now = time.monotonic()
            for who in [*attackers, *mine]:
                sampler.ask(who, (who.pid,), now)
            for who in mine:
                found = sampler.found.get((who.pid, who.start_time))
                if found is not None and found.stacks and found.at not in sampled[who.pid]:
                    sampled[who.pid].append(found.at)
            time.sleep(0.25)
        firsts = [min(ats) - began for ats in sampled.values() if ats]
        assert len(firsts) == 2 and max(firsts) < 4.0, sampled  # within one time box
        assert all(len(ats) >= 2 for ats in sampled.values()), sampled
        stuck = [f for k, f in sampler.found.items() if k[0] in fifo_ranks]
        assert stuck and all(not f.stacks for f in stuck)  # the attack is live: cut
    finally:
        workers.shutdown(wait=True, cancel_futures=True)
        for v in victims:
            v.kill()
            v.wait()
