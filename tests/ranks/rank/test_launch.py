"""Launchers are not ranks: the real `mlx.launch` with MLX_WATCHDOG=1 in its own
environment imports mlx.core itself, yet only the ranks it starts are published."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.ranks import REPO, base_env, wait_for

pytestmark = pytest.mark.ranks

# Each rank: join the group, run a checked all_sum, then report what the record
# directory holds while every rank is still alive (a second all_sum keeps them in step).
RANK = textwrap.dedent("""
    import json, os, sys
    import mlx.core as mx
    from watchdog import record

    group = mx.distributed.init()
    total = mx.distributed.all_sum(mx.ones(4))
    assert total.tolist() == [float(group.size())] * 4
    folder = os.environ["MLX_WATCHDOG_DIR"]
    seen = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(record.SUFFIX):
            rec = record.read_path(os.path.join(folder, name))
            seen[rec.pid] = [rec.rank, rec.world_size, rec.job]
    print("REPORT " + json.dumps({"pid": os.getpid(), "rank": group.rank(), "seen": seen}),
          flush=True)
    mx.eval(mx.distributed.all_sum(mx.ones(1)))  # nobody leaves before all have looked
""")


def two_free_ports() -> int:
    """A port p with p and p + 1 free (mlx.launch gives rank r the port p + r)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise AssertionError("no two consecutive free ports")


def test_mlx_launch_itself_is_never_published(tmp_path: Path, record_dir: Path) -> None:
    prog = tmp_path / "rank.py"
    prog.write_text(RANK)
    env = base_env(record_dir, MLX_WATCHDOG="1")
    launcher = subprocess.Popen(
        [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()",
         "--backend", "ring", "-n", "2", "--hosts", "127.0.0.1",
         "--starting-port", str(two_free_ports()), "--env", "MLX_WATCHDOG=1",
         "--env", f"MLX_WATCHDOG_DIR={record_dir}", "--env", f"PYTHONPATH={REPO}",
         sys.executable, str(prog)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The launcher has imported mlx.core (zero-code activation ran in it) well
        # before its ranks report; it must never have a record of its own.
        out, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, out
    assert "mlx-watchdog:" not in out, out
    # mlx.launch relays both ranks' output into one pipe, and one rank's line may run on
    # into the other's: every report is read where it starts, to the end of its JSON.
    decoder = json.JSONDecoder()
    reports = [decoder.raw_decode(part)[0] for part in out.split("REPORT ")[1:]]
    assert sorted(r["rank"] for r in reports) == [0, 1], out
    rank_pids = {str(r["pid"]) for r in reports}
    for report in reports:
        seen = report["seen"]
        # Exactly the two ranks, each with its rank, the world size and one shared job.
        assert set(seen) == rank_pids, (seen, launcher.pid)
        assert sorted((rank, size) for rank, size, _ in seen.values()) == [(0, 2), (1, 2)]
        assert len({job for _, _, job in seen.values()}) == 1
        assert str(launcher.pid) not in seen
    assert os.listdir(record_dir) == []  # and the ranks' clean exits removed theirs


def test_a_process_that_only_imports_mlx_never_warns_about_the_directory(
        tmp_path: Path) -> None:
    """A launcher with MLX_WATCHDOG=1 but no usable directory of its own says nothing;
    a process that then waits warns once and runs on."""
    code = "import mlx.core as mx, sys; sys.argv[1] == 'wait' and mx.eval(mx.ones(2))"
    env = base_env(tmp_path / "missing", MLX_WATCHDOG="1")
    quiet = subprocess.run([sys.executable, "-c", code, "import"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    waited = subprocess.run([sys.executable, "-c", code, "wait"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert waited.returncode == 0, waited.stderr
    assert [line for line in waited.stderr.splitlines() if "mlx-watchdog:" in line] == [
        f"mlx-watchdog: not instrumenting this process: record directory "
        f"{tmp_path / 'missing'} does not exist (this rank runs unwatched): the daemon "
        "creates it when it starts (sudo mlx-watchdog service install, or mlx-watchdog "
        "run), or point MLX_WATCHDOG_DIR at the daemon's (`mlx-watchdog doctor` says "
        "which)"], waited.stderr


def test_a_process_that_only_imports_mlx_is_published_at_its_first_wait(
        record_dir: Path) -> None:
    code = textwrap.dedent("""
        import sys
        import mlx.core as mx
        print("imported", flush=True)
        sys.stdin.readline()
        mx.eval(mx.ones(2))
        print("waited", flush=True)
        sys.stdin.readline()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env=base_env(record_dir,
                            MLX_WATCHDOG="1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline() == "imported\n"
        # Instrumented, but no rank yet: no record, no stack-dump file.
        assert os.listdir(record_dir) == []
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "waited\n"
        rec_path = record_dir / f"{proc.pid}.rec"
        assert rec_path.exists(), os.listdir(record_dir)
        from watchdog import record
        rec = record.read_path(str(rec_path))
        assert (rec.pid, rec.rank, rec.world_size) == (proc.pid, -1, 0)  # a job of one
        assert (rec.waits_entered, rec.waits_completed) == (1, 1)
        assert (record_dir / f"{proc.pid}.stacks").exists()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None and "mlx-watchdog:" not in proc.stderr.read()
    wait_for(lambda: os.listdir(record_dir) == [], 5, what="the record removed at exit")
