"""Blocking entry points other than mx.eval, hung on a frozen peer, with real ring ranks.

Each rank consumes its all_sum only through one entry point (tests/support/rank_prog.py
`consume HOW`); rank 1 is frozen with SIGSTOP, so rank 0 blocks inside that entry
point. The wrappable ones are waits: the record says which, and the real daemon
ends the job. The buffer protocol (numpy.array(a)) is a C slot the hook cannot
wrap: its record stays `running` (docs/coverage.md says what covers it instead).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support.ranks import DaemonProc, RingJob, wait_for
from watchdog.states import Phase

pytestmark = pytest.mark.ranks


@pytest.mark.parametrize(("how", "op", "frame"), [
    ("print", "repr", "__repr__"), ("fstring", "format", "__format__"),
    ("format", "format", "__format__"), ("async_eval", "async_eval", "async_eval")])
def test_a_hang_inside_the_entry_point_is_judged(tmp_path: Path, record_dir: Path,
                                                  state_dir: Path, how: str, op: str,
                                                  frame: str) -> None:
    with DaemonProc(record_dir, state_dir, deadline=2) as daemon, \
            RingJob(tmp_path, record_dir, 2, "consume", (how,)) as job:
        job.wait_running(collectives=20)
        job.signal(1, signal.SIGSTOP)
        survivor = wait_for(lambda: next((r for r in job.records().values()
                                          if r.rank == 0 and r.phase is Phase.WAIT), None),
                            20, what="rank 0 in a wait")
        assert survivor.op == op
        wait_for(lambda: all(p.poll() is not None for p in job.procs), 40,
                 what="the hung job to be ended")
        inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
        assert inc["verdict"] == "stalled"
        assert inc["culprit"]["rank"] == 1 and inc["culprit"]["state"] == "stopped"
        waiting = next(r for r in inc["ranks"] if r["rank"] == 0)
        assert waiting["phase"] == "wait" and waiting["op"] == op
        python = [p for p in inc["evidence"] if p.endswith("-python.txt") and "rank0" in p]
        assert python, inc["evidence"]
        # The main thread's stack names the entry point it is stuck in.
        assert f"in {frame}\n" in Path(python[0]).read_text()


def test_numpy_conversion_is_invisible_to_the_hook(tmp_path: Path, record_dir: Path) -> None:
    with RingJob(tmp_path, record_dir, 2, "consume", ("numpy",)) as job:
        job.wait_running(collectives=20)
        job.signal(1, signal.SIGSTOP)
        # Rank 0 is now blocked in numpy.array(a) (the buffer protocol) for good:
        # nothing it issues moves, yet the hook sees no wait open.
        time.sleep(1)
        before = job.records()[0]
        time.sleep(2)
        after = job.records()[0]
        assert after.collectives == before.collectives
        assert after.phase is Phase.RUNNING and after.op == ""
        assert after.waits_entered == after.waits_completed
