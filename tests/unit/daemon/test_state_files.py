"""The state directory and its files against a careless umask and a planted FIFO
(issue 30, item 8): a real umask 000, a real daemon process, real FIFOs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from tests.support.ranks import REPO, base_env, wait_for
from watchdog.daemon.store import journal
from watchdog.daemon.store.dirs import UnsafeDirectory, check_state_dir
from watchdog.net import fence

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


@pytest.mark.slow
def test_a_daemon_started_with_umask_000_creates_nothing_others_may_write(tmp_path):
    records, state = tmp_path / "records", tmp_path / "a" / "b" / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "watchdog.cli", "run", "--dir", str(records), "--state-dir",
         str(state), "--interval", "0.25", "--listen", "127.0.0.1:0"],
        env=base_env(records), cwd=REPO, umask=0, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (state / journal.STATUS).exists() or proc.poll() is not None, 30,
                 what="the first scan")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        for path in (tmp_path / "a", tmp_path / "a" / "b", state,
                     *state.iterdir()):
            mode = path.lstat().st_mode
            assert not mode & OTHERS_WRITE, f"{path} is {stat.S_IMODE(mode):o}"
    finally:
        proc.terminate()
        proc.wait(15)


def test_the_nonce_file_is_rewritten_private_under_umask_000(tmp_path):
    path = str(tmp_path / fence.NONCES)
    old = os.umask(0)
    try:
        fence.NonceCache(path=path).add("n1", time.time())
        fence.NonceCache(path=path)  # a restart: the file is compacted (rewritten)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_state_dir_under_a_directory_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    (shared / "state").mkdir(parents=True)
    os.chmod(shared, 0o777)  # not sticky: anyone may rename "state" away
    with pytest.raises(UnsafeDirectory, match="above the state directory"):
        check_state_dir(str(shared / "state"))
    os.chmod(shared, 0o1777)  # sticky, as /tmp: only its owner may
    check_state_dir(str(shared / "state"))


def _returns(fn, *args) -> BaseException | None:
    """`fn(*args)` on a thread: what it raised (None: it returned); fails if it blocks."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            fn(*args)
            raised.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), f"{fn.__name__} blocked on a FIFO"
    return raised[0]


def test_a_fifo_in_place_of_a_state_file_never_blocks_the_daemon(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    for name in (journal.INCIDENTS, journal.REBOOT_FLAG):
        os.mkfifo(state / name)
    assert isinstance(_returns(journal.append_incident, str(state), {"id": "i"}), OSError)
    assert isinstance(_returns(journal.read_incidents, str(state)), OSError)
    flag: list[object] = []
    assert _returns(lambda s: flag.append(journal.reboot_flag(s)), str(state)) is None
    assert "unreadable" in str(flag[0])  # a flag there that cannot be read still flags
    assert stat.S_ISFIFO((state / journal.INCIDENTS).lstat().st_mode)
