"""A fifth hostile review (issue 57), items 2, 3, 6, 10-13: each attack run against the
real daemon (or the real CLI) beside what shows it would have worked.

The attacker is a real process of uid 65534 (tests/support/users.py); the daemon is
the real one, as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.ranks import DaemonProc, wait_for
from tests.support.users import OTHER_UID, UserProc, publish

pytestmark = pytest.mark.ranks

PLANTED = """import os
open({marker!r}, "a").write(f"imported as uid {{os.geteuid()}}\\n")
"""


@pytest.mark.skipif(shutil.which("gdb") is None, reason="no gdb behind the sample stand-in")
def test_the_simulation_never_runs_code_from_where_the_daemon_was_started(tmp_path,
                                                                        record_dir):
    """Item 2. Root starts the simulated Mac's daemon from a folder uid 65534 writes, in
    which that user planted a `watchdog` package; his own rank hangs. The stand-ins
    (`sample` for the evidence and the stack sampler) run as the installed package's
    modules: the planted one is never imported, while the `sample` stand-in did run
    (the incident's native stacks are its report)."""
    os.chmod(record_dir, 0o1777)
    planted = Path(tempfile.mkdtemp(prefix="mlxwd-planted-"))
    marker = planted / "imported"
    try:
        (planted / "watchdog" / "macsim").mkdir(parents=True)
        for module in ("watchdog/__init__.py", "watchdog/macsim/__init__.py",
                       "watchdog/macsim/tools.py"):
            (planted / module).write_text(PLANTED.format(marker=str(marker)))
        for path in [planted, *planted.rglob("*")]:
            os.chown(path, OTHER_UID, OTHER_UID)
        os.chmod(planted, 0o777)
        daemon = DaemonProc(record_dir, tmp_path / "state", evidence_timeout=4)
        daemon.argv[1:1] = ["-P"]  # the daemon itself not from there (a console script's way)
        daemon.cwd = planted
        daemon.extra_env = {"MLX_WATCHDOG_SIMULATE": "macos",
                            "MLX_WATCHDOG_SIMULATE_ROOT": str(tmp_path / "macroot")}
        with daemon, UserProc() as rank:
            assert daemon.status()["platform"] == "macos (simulated)"
            publish(record_dir, rank.pid, OTHER_UID, "planter", hung=True, world_size=1)
            wait_for(lambda: rank.poll() is not None, 30, what="the planter's hung rank ended")
            inc = wait_for(daemon.incidents, 15, what="the incident")[-1]
            natives = [p for p in inc["evidence"] if p.endswith("-native.txt")]
            assert natives, inc["evidence"]
            assert "Call graph:" in Path(natives[0]).read_text()  # the stand-in ran
        assert not marker.exists(), marker.read_text()
    finally:
        shutil.rmtree(planted, ignore_errors=True)


def test_the_simulation_refuses_to_run_as_root_outside_a_root_it_owns(tmp_path):
    """Item 2. As root, the simulated Mac whose root another user owns (or may write) is
    refused: one line, exit 3, before anything runs; its own root-owned root is fine."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    cli = [sys.executable, "-P", "-m", "watchdog.cli", "node", "status", "--state-dir",
           str(tmp_path / "state")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
           "MLX_WATCHDOG_SIMULATE": "macos"}
    for root, refused in ((theirs / "macroot", True), (tmp_path / "ours", False)):
        done = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                              env={**env, "MLX_WATCHDOG_SIMULATE_ROOT": str(root)})
        if refused:
            assert done.returncode == 3, done
            assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
            assert "refuses to run as root outside a test root it owns" in done.stderr
            assert f"{theirs} is owned by uid {OTHER_UID}" in done.stderr
        else:
            assert "refuses to run" not in done.stderr, done.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "watchdog.cli", *args], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ,
                               "PYTHONPATH": str(Path(__file__).resolve().parents[3])})


def test_inspect_shows_whose_record_and_never_a_forged_one(tmp_path, record_dir):
    """Items 12 and 13. uid 65534 publishes `<pid>-x.rec` naming root's rank's pid, a
    later start than the real one's (the old pick: the newest), and a junk file whose
    name is a terminal escape. `inspect` shows root's own record, saying which file and
    whose; with only the forged one, it shows none and says why; `status` with no daemon
    prints the junk's name escaped."""
    from tests.support.records import SyntheticWriter
    from watchdog import record
    from watchdog.procstat import read_start_ticks

    os.chmod(record_dir, 0o1777)
    with UserProc(0) as rank:
        real = publish(record_dir, rank.pid, 0, "victim", hung=False, world_size=1)
        forged = record_dir / f"{rank.pid}-x.rec"
        writer = SyntheticWriter(str(forged), pid=rank.pid, start_time=2e9, uid=OTHER_UID,
                                 host="node", job="forged", rank=0, world_size=1,
                                 backend="ring", dump_signal=0,
                                 start_ticks=read_start_ticks(rank.pid) + 10**6)
        writer.begin()
        writer.end()
        writer.close(record.STATUS_OPEN, remove=False)
        os.chown(forged, OTHER_UID, OTHER_UID)
        junk = record_dir / "\x1b]0;pwned\x07\x1b[2J.rec"
        junk.write_bytes(b"x")

        shown = _cli("inspect", str(rank.pid), "--dir", str(record_dir))
        assert shown.returncode == 0, shown.stderr
        assert "job victim" in shown.stdout and "forged" not in shown.stdout
        assert f"record {real} of uid 0 (root): this process's" in shown.stdout
        as_json = _cli("inspect", str(rank.pid), "--dir", str(record_dir), "--json")
        assert '"record_path": "' + str(real) + '"' in as_json.stdout

        real.unlink()  # the forged one alone: no record of this process
        alone = _cli("inspect", str(rank.pid), "--dir", str(record_dir))
        assert alone.returncode == 3 and "forged" not in alone.stdout
        assert f"{forged} (uid {OTHER_UID}) names pid {rank.pid} but not this process" \
            in alone.stderr

        status = _cli("status", "--dir", str(record_dir), "--state-dir", str(tmp_path / "s"))
        assert "skipped" in status.stderr and "\\x1b]0;pwned\\x07" in status.stderr
        assert "\x1b" not in status.stdout + status.stderr
