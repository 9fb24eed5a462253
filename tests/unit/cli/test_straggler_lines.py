"""The straggler where people look: `status` prints the daemon's line per job held
back by one rank, `cluster status` the cluster's (judge/stragglers.py)."""

from __future__ import annotations

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
    assert f"job train: {LINE} (the job would run 1.61x faster at the others' pace)" \
        in out.output
    records, state = publish(tmp_path / "b", ())
    out = CliRunner().invoke(cli, ["status", "--dir", str(records), "--state-dir", str(state)])
    assert "straggler" not in out.output


def test_cluster_status_prints_the_jobs_straggler() -> None:
    text = render_text(ClusterView(jobs=(JobView(job="train", world_size=4, straggler=SLOW),)))
    assert f"  straggler: {LINE} (the job would run 1.61x faster at the others' pace)" in text
    assert "straggler" not in render_text(ClusterView(jobs=(JobView(job="train"),)))
