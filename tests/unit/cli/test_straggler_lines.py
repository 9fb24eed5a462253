"""The straggler where people look: `status` prints the daemon's line per job held
back by one rank, `cluster status` the cluster's (judge/stragglers.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from click.testing import CliRunner

from watchdog.cli.commands import cli
from watchdog.cli.look.cluster import render_text
from watchdog.status import ClusterView, JobView, NodeStatus, Straggler

LINE = ("rank 2 on mac-3 is the straggler: the others wait 38% of each step for it; "
        "run queue 45% (CPU contention)")
SLOW = Straggler(job="train", uid=501, rank=2, host="mac-3", pid=77, score=0.55,
                 slowdown=1.61, others_wait=0.38, why="run queue 45% (CPU contention)",
                 summary=LINE)


def publish(tmp_path: Path, stragglers: tuple[Straggler, ...]) -> tuple[Path, Path]:
    records, state = tmp_path / "records", tmp_path / "state"
    records.mkdir(parents=True)
    state.mkdir(parents=True)
    snap = NodeStatus(host="mac-3", daemon_pid=os.getpid(), version="1", mode="enforce",
                      interval=1.0, time=time.time(), scan_monotonic=time.monotonic(),
                      dir=str(records.resolve()), state_dir=str(state), started=time.time(),
                      scanned=True, stragglers=stragglers)
    (state / "status.json").write_text(json.dumps(snap.to_json()))
    return records, state


def test_status_prints_a_line_per_job_held_back(tmp_path: Path) -> None:
    records, state = publish(tmp_path, (SLOW,))
    out = CliRunner().invoke(cli, ["status", "--dir", str(records), "--state-dir", str(state)])
    assert out.exit_code == 0, out.output
    assert (f"job train: {LINE}; the job would run 1.61x faster at the others' pace (its "
            "score 0.55: the others' share of time working over its own)") in out.output
    assert ") (" not in out.output  # never one parenthesis after another
    records, state = publish(tmp_path / "b", ())
    out = CliRunner().invoke(cli, ["status", "--dir", str(records), "--state-dir", str(state)])
    assert "straggler" not in out.output


def test_cluster_status_prints_the_jobs_straggler() -> None:
    text = render_text(ClusterView(jobs=(JobView(job="train", world_size=4, straggler=SLOW),)))
    assert (f"  straggler: {LINE}; the job would run 1.61x faster at the others' pace (its "
            "score 0.55: the others' share of time working over its own)") in text
    assert "straggler" not in render_text(ClusterView(jobs=(JobView(job="train"),)))


def test_status_and_cluster_say_each_ranks_pace_or_why_not() -> None:
    """Issue 47: the figures in text, and why a rank is not judged, in words."""
    from watchdog.cli.look.status import pace_line
    from watchdog.status import RankStatus, ReportedRank

    base = RankStatus(pid=77, host="mac-3", job="train", rank=1, world_size=2,
                      backend="ring", state="running")
    judged = dataclasses.replace(base, pace=4.5, wait_share=0.25, pace_score=1.0)
    assert pace_line(judged) == ("rank 1 (pid 77) of train: 4.50 collectives/s, waits on its "
                                 "peers 25%, score 1.00")
    note = "not judged: the mpi backend polls in user space, so no wait share (docs/limits.md)"
    mpi = dataclasses.replace(base, backend="mpi", pace_note=note,
                              pace_unjudged="user_space_wait")
    assert pace_line(mpi) == f"rank 1 (pid 77) of train: {note}"
    assert pace_line(base) is None  # nothing said of it: no line
    text = render_text(ClusterView(jobs=(JobView(
        job="train", world_size=2, ranks=(ReportedRank("mac-3", mpi),)),)))
    assert f"  pace: rank 1 (pid 77) of train: {note}" in text
