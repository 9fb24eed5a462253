"""A quiet hang (issue 45): every rank of a ring job parked for ever inside the same
all_sum, its socket reads never returning, every thread asleep, nothing spinning and
nothing moving (tests/support/wedge_shim.c, mode "park"). Before, such a rank was
`blocked` and ended only at `blocked_deadline` (900 s at the defaults); now its threads'
frames (asleep in the ring worker's read and in eval), its still I/O counters and its
still sockets make it a quiet hang, ended at its deadline with cause `quiet_hang`.

The daemon here runs a 2 s deadline and a long blocked deadline (a mechanism, proven
apart from the figure at the defaults: benchmarks/quiet.py, docs/performance.md).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.support.ranks import DaemonProc, RingJob, torn_down, wait_for
from tests.support.wedges import armed, build_shim

pytestmark = [pytest.mark.ranks, pytest.mark.skipif(shutil.which("gdb") is None,
                                                    reason="no gdb to sample stacks")]

BLOCKED = 120.0  # the daemon's blocked deadline: a quiet hang must be ended well before


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    return build_shim(tmp_path_factory.mktemp("shim"))


def test_every_rank_parked_in_an_all_sum_is_a_quiet_hang_ended_at_its_deadline(
        tmp_path, shim):
    records = tmp_path / "records"
    records.mkdir()
    trigger = tmp_path / "park-now"
    with DaemonProc(records, tmp_path / "state", blocked_deadline=BLOCKED) as daemon, \
            RingJob(tmp_path, records, 2, "loop", env=armed(shim, trigger, "park", "*")) as job:
        job.wait_running(collectives=50)
        trigger.touch()
        parked = time.monotonic()
        said = []  # what status said of rank 0 while it waited toward its end
        while any(p.poll() is None for p in job.procs):
            reason = (daemon.ranks().get(job.pids[0]) or {}).get("reason") or ""
            if "quiet:" in reason:
                said.append(reason)
            assert time.monotonic() - parked < BLOCKED - 30, "not ended before the blocked " \
                                                             "deadline"
            time.sleep(0.25)
        took = time.monotonic() - parked
        inc = wait_for(lambda: [i for i in daemon.incidents() if i.get("outcome")], 30,
                       what="the incident's outcome")[-1]
        assert inc["cause"] == "quiet_hang", inc
        assert "waits in" in inc["summary"] and "nothing read, written or sent" in \
            inc["summary"], inc["summary"]
        assert torn_down(inc["outcome"]), inc["outcome"]
        assert sorted(inc["pids"]) == sorted(job.pids)
        assert said, "status never said the rank was quiet before it was ended"
        print(f"quiet hang ended {took:.1f}s after the park: {inc['summary']}")
