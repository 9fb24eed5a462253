"""The Linux probe on real ring ranks: a frozen peer's survivor wants a whole core, under
any load of the machine (the probe's parsers are in tests/unit/daemon/probes/test_linux.py).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from watchdog.daemon.probes.linux import (
    LinuxProbe,
)


@pytest.mark.ranks
def test_a_frozen_peers_survivor_wants_a_whole_core_under_any_load(tmp_path) -> None:
    """The spin reading that decides stalled (acted on at the deadline) from blocked
    (900 s): on a machine loaded four busy processes per core, the survivor's polling
    thread gets a fraction of a core, but its run + run-queue time is a whole one."""
    from tests.support.ranks import RingJob

    records = tmp_path / "records"
    records.mkdir()
    probe = LinuxProbe()
    burners: list[subprocess.Popen[bytes]] = []
    with RingJob(tmp_path, records, 2, "loop") as job:
        job.wait_running(60, 10)
        job.signal(1, signal.SIGSTOP)
        try:
            burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                       for _ in range(4 * (psutil.cpu_count() or 1))]
            time.sleep(1)  # the burners reach the run queue
            survivor = job.procs[0].pid
            # A thread's wait in a run queue is added when it next gets a core, in one
            # lump: measured over seconds, as the detector takes the median of its scans.
            before, began = probe.sample(survivor), time.monotonic()
            time.sleep(3.0)
            after, seconds = probe.sample(survivor), time.monotonic() - began
            grew = {t: d - dict(before.demand).get(t, d) for t, d in after.demand}
            tid = max(grew, key=lambda t: grew[t])
            wanted = grew[tid] / seconds
            got = (dict(after.threads)[tid] - dict(before.threads)[tid]) / seconds
        finally:
            for b in burners:
                b.kill()
                b.wait()
    assert wanted >= 0.9, (wanted, got)
    assert got < 0.6, f"the machine was not loaded enough to tell: {got}"
