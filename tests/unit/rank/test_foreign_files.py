"""Another user's files under a rank's pid do not stop it being watched.

In the sticky, world-writable record directory a process may not replace a
file of another user. A `<pid>.stacks`, `<pid>.rec` or staging file left by
another uid (pid reuse, or planted) made `install()` fail for the rank that
got that pid. The rank now publishes under another name and the daemon finds
it. Real: the rank is a child running as uid 65534, the files are root's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile

import pytest

from tests.support.users import OTHER_UID, become
from watchdog import record
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.daemon.recdir import find_record
from watchdog.procstat import read_start_ticks
from watchdog.rank import hook

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a second uid"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux")]



@pytest.fixture
def sticky_dir():
    path = tempfile.mkdtemp(prefix="mlxwd-sticky-", dir="/tmp")  # reachable by uid 65534
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path)


def _install_as_other_user(directory: str, plant: tuple[str, ...]):
    """Fork a child that becomes uid 65534, waits while root plants files named
    after its pid, then installs; returns (pid, what install reported, result fd)."""
    import mlx.core  # noqa: F401 - imported here: uid 65534 cannot read root's site-packages

    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(go_w)
            os.close(out_r)
            become(OTHER_UID)
            os.read(go_r, 1)
            os.environ["MLX_WATCHDOG_DUMP_SIGNAL"] = str(int(signal.SIGUSR1))
            hb = hook.install(directory, job="jforeign")
            os.write(out_w, json.dumps({"active": hb.active, "path": hb.path}).encode() + b"\n")
            signal.pause()
        finally:
            os._exit(0)
    os.close(go_r)
    os.close(out_w)
    for name in plant:
        path = os.path.join(directory, name.format(pid=pid))
        with open(path, "wb") as f:
            f.write(b"root's, not yours")
        os.chmod(path, 0o644)
    os.write(go_w, b"x")
    os.close(go_w)
    with os.fdopen(out_r) as out:
        line = out.readline()
    return pid, json.loads(line)


@pytest.mark.parametrize("plant", [
    ("{pid}.stacks",),
    ("{pid}.rec",),
    (".{pid}.rec.new",),
    ("{pid}.stacks", "{pid}.rec", ".{pid}.rec.new"),
])
def test_a_rank_whose_pid_names_another_users_files_is_still_watched(sticky_dir, tmp_path,
                                                                      plant):
    pid, reported = _install_as_other_user(sticky_dir, plant)
    try:
        assert reported["active"], "install() gave up on another user's files"
        path = reported["path"]
        assert os.path.basename(path).startswith(f"{pid}-") and path.endswith(record.SUFFIX)
        assert os.stat(path).st_uid == OTHER_UID
        for name in plant:  # root's files are untouched
            with open(os.path.join(sticky_dir, name.format(pid=pid)), "rb") as f:
                assert f.read() == b"root's, not yours"
        rec, _ = find_record(sticky_dir, pid)
        assert rec is not None and rec.job == "jforeign" and rec.uid == OTHER_UID
        assert rec.start_ticks == read_start_ticks(pid)  # what identity compares
        settings = Settings(dir=sticky_dir, state_dir=str(tmp_path / "state"), deadline=60.0)
        os.makedirs(settings.state_dir)
        daemon = Daemon(settings)
        try:
            daemon.scan()
            watched = [r for r in daemon.ranks.values() if r.record.pid == pid]
            assert len(watched) == 1 and watched[0].path == path
            stacks = watched[0].target().stacks_path
            assert stacks == path[: -len(record.SUFFIX)] + ".stacks"
            assert os.stat(stacks).st_uid == OTHER_UID  # the dump goes beside its record
        finally:
            daemon.executor.shutdown()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
