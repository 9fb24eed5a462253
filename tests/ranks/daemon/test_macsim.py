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

The same wedge on MPI (Open MPI's `mpirun`, TCP between the ranks: the injector answers
rank 1's readv(), as its TCP transport reads): Open MPI's own event thread, asleep in
poll(), is read with the rest (a Mac's `sample` cannot tell busy threads) and must read
as waiting, not computing. Its daemon's wedge floor is 3 s, not 15 (suite time: the
figure at the defaults is benchmarks/wedge.py's, docs/performance.md).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lm_server import DefaultDaemon
from tests.support.mpi import MpiJob
from tests.support.ranks import REPO, RingJob, torn_down, wait_for
from tests.support.wedges import armed, build_shim

pytestmark = [pytest.mark.ranks, pytest.mark.skipif(shutil.which("gdb") is None,
                                                    reason="no gdb behind the sample stand-in")]

SIMULATED = {"MLX_WATCHDOG_SIMULATE": "macos"}
WEDGE_WITHIN = 30.0


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    return build_shim(tmp_path_factory.mktemp("shim"))


@contextlib.contextmanager
def simulated(root: Path, *args: str) -> Iterator[DefaultDaemon]:
    """A daemon on the simulated Mac, at its defaults but `args`, its /proc reads audited."""
    records = root / "records"
    records.mkdir()
    audit = root / "proc-audit.log"
    daemon = DefaultDaemon(records, root / "state")
    daemon.argv = [sys.executable, str(REPO / "tests" / "support" / "proc_audit.py"),
                   *daemon.argv[3:], *args]
    daemon.extra_env = {**SIMULATED, "MLX_WATCHDOG_SIMULATE_ROOT": str(root / "macroot"),
                        "MLXWD_PROC_AUDIT": str(audit)}
    with daemon:
        daemon.audit = audit  # type: ignore[attr-defined]
        yield daemon
    assert not audit.exists(), f"the simulated daemon read /proc:\n{audit.read_text()}"


@pytest.fixture(scope="module")
def mac(tmp_path_factory):
    """One daemon on the simulated Mac, at its defaults, its /proc reads audited."""
    with simulated(tmp_path_factory.mktemp("mac")) as daemon:
        yield daemon


@pytest.fixture
def mac_mpi(tmp_path_factory):
    """The same, its wedge floor 3 s (the sockets must stand still 3 s anyway)."""
    with simulated(tmp_path_factory.mktemp("mac-mpi"), "--wedge-floor", "3") as daemon:
        yield daemon


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_a_wedge_on_the_simulated_mac_is_ended_within_30s_reading_no_proc(
        tmp_path, shim, request, backend):
    mac = request.getfixturevalue("mac" if backend == "ring" else "mac_mpi")
    status = mac.status()
    assert status["platform"] == "macos (simulated)", status.get("platform")
    assert "(platform: macos (simulated))" in mac.log()
    trigger = tmp_path / "wedge-now"
    env = {**armed(shim, trigger, "user"), **SIMULATED}
    job: RingJob | MpiJob
    with (RingJob(tmp_path, mac.record_dir, 2, "loop", env=env) if backend == "ring"
          else MpiJob(tmp_path, mac.record_dir, "loop", env=env)) as job:
        job.wait_running(collectives=200)
        pids = [job.pids[rank] for rank in (0, 1)]
        seen = wait_for(lambda: mac.ranks().get(pids[0]), 30, what="rank 0 seen")
        assert seen["backend"] == backend, seen
        if backend == "mpi":
            wedged_within(mac, job, trigger, pids, "ompi_request_default_wait")
            return
        assert isinstance(job, RingJob)
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
        wedged_within(mac, job, trigger, pids)


def wedged_within(mac: DefaultDaemon, job: RingJob | MpiJob, trigger: Path, pids: list[int],
                  named: str = "") -> None:
    """Wedge the job (its trigger touched): ended within 30 s, cause collective_wedged,
    rank 1 named, `named` in the summary, no /proc read."""
    before = len(mac.incidents())
    trigger.touch()
    wedged = time.monotonic()
    ended = job.gone if isinstance(job, MpiJob) else (
        lambda: all(p.poll() is not None for p in job.procs))
    wait_for(ended, 60, interval=0.2, what="the wedged job ended")
    took = time.monotonic() - wedged
    inc = wait_for(lambda: [i for i in mac.incidents()[before:] if i.get("outcome")], 30,
                   what="the incident's outcome")[-1]
    assert inc["cause"] == "collective_wedged", inc
    assert inc["culprit"]["rank"] == 1 and inc["culprit"]["pid"] == pids[1], inc
    assert named in inc["summary"], inc["summary"]
    assert torn_down(inc["outcome"]), inc["outcome"]
    assert took <= WEDGE_WITHIN, f"ended {took:.1f}s after the wedge: {inc}"
    print(f"simulated Mac: wedge ended {took:.1f}s after it began; {inc['summary']}")
    assert not mac.audit.exists(), mac.audit.read_text()  # type: ignore[attr-defined]
