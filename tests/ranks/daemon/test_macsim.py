"""The real daemon on the simulated Mac (MLX_WATCHDOG_SIMULATE=macos, docs/macos.md)
against real ring ranks, the ranks simulated too: the macOS path taken whole, every
macOS source a stand-in of watchdog/macsim reading the live process.

One daemon at its defaults, run under an audit hook (tests/support/proc_audit.py) that
logs every /proc file or directory the daemon opens outside the stand-ins: there must
be none. Its /status says "macos (simulated)". The wedge of test_wedge.py (rank 1's
ring worker spinning in user space on a socket that never delivers) is ended within the
same 30 s, cause collective_wedged, its culprit named from `sample`'s frames and the
sockets' soi_snd/soi_rcv counts, with no /proc and no Linux thread ids; before it, the
straggler judge shows every rank's pace from the macOS probe's samples.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.support.lm_server import DefaultDaemon
from tests.support.ranks import REPO, RingJob, torn_down, wait_for
from tests.support.wedges import armed, build_shim

pytestmark = [pytest.mark.ranks, pytest.mark.skipif(shutil.which("gdb") is None,
                                                    reason="no gdb behind the sample stand-in")]

SIMULATED = {"MLX_WATCHDOG_SIMULATE": "macos"}
WEDGE_WITHIN = 30.0


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    return build_shim(tmp_path_factory.mktemp("shim"))


@pytest.fixture(scope="module")
def mac(tmp_path_factory):
    """One daemon on the simulated Mac, at its defaults, its /proc reads audited."""
    root = tmp_path_factory.mktemp("mac")
    records = root / "records"
    records.mkdir()
    audit = root / "proc-audit.log"
    daemon = DefaultDaemon(records, root / "state")
    daemon.argv = [sys.executable, str(REPO / "tests" / "support" / "proc_audit.py"),
                   *daemon.argv[3:]]
    daemon.extra_env = {**SIMULATED, "MLX_WATCHDOG_SIMULATE_ROOT": str(root / "macroot"),
                        "MLXWD_PROC_AUDIT": str(audit)}
    with daemon:
        daemon.audit = audit  # type: ignore[attr-defined]
        yield daemon
    assert not audit.exists(), f"the simulated daemon read /proc:\n{audit.read_text()}"


def test_a_wedge_on_the_simulated_mac_is_ended_within_30s_reading_no_proc(
        tmp_path, shim, mac):
    status = mac.status()
    assert status["platform"] == "macos (simulated)", status.get("platform")
    assert "(platform: macos (simulated))" in mac.log()
    trigger = tmp_path / "wedge-now"
    with RingJob(tmp_path, mac.record_dir, 2, "loop",
                 env={**armed(shim, trigger, "user"), **SIMULATED}) as job:
        job.wait_running(collectives=200)
        seen = wait_for(lambda: mac.ranks().get(job.pids[0]), 30, what="rank 0 seen")
        assert seen["backend"] == "ring", seen
        looked = time.monotonic()
        # The straggler judge on the macOS probe's samples alone (no schedstat, no
        # /proc): every rank's pace, wait share (task_threads' user and system time)
        # and run queue (ri_runnable_time) shown.
        shown = wait_for(lambda: (rs if len(rs := [r for r in mac.status()["ranks"]
                                                   if r["pid"] in job.pids
                                                   and r.get("pace") is not None]) == 2
                                  else None), 30, what="every rank's pace shown")
        assert all(r["pace"] > 0 and r["wait_share"] is not None
                   and r["run_queue"] is not None for r in shown), shown
        print(f"simulated Mac: every rank's pace shown {time.monotonic() - looked:.1f}s after "
              "rank 0 was seen")
        before = len(mac.incidents())
        trigger.touch()
        wedged = time.monotonic()
        wait_for(lambda: all(p.poll() is not None for p in job.procs), 60,
                 interval=0.2, what="the wedged job ended")
        took = time.monotonic() - wedged
        inc = wait_for(lambda: [i for i in mac.incidents()[before:] if i.get("outcome")], 30,
                       what="the incident's outcome")[-1]
        assert inc["cause"] == "collective_wedged", inc
        assert inc["culprit"]["rank"] == 1 and inc["culprit"]["pid"] == job.pids[1], inc
        assert torn_down(inc["outcome"]), inc["outcome"]
        assert took <= WEDGE_WITHIN, f"ended {took:.1f}s after the wedge: {inc}"
        print(f"simulated Mac: wedge ended {took:.1f}s after it began; {inc['summary']}")
    assert not mac.audit.exists(), mac.audit.read_text()
