"""One failed read neither ends a watch nor deletes a live record.

The daemon in-process with the real Linux probe and a real process behind a
real record; the faults are real too: the directory listing fails with EMFILE
for one scan, and the record is left mid-write with its identity blanked (as
`struct.pack_into` leaves it while a rank rewrites it).
"""

from __future__ import annotations

import errno
import os
import struct

import pytest

from tests.support.users import UserProc, publish
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.record import layout
from watchdog.states import State


@pytest.fixture
def daemon(tmp_path, record_dir):
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"), deadline=60.0,
                        retention=0.0)  # a rank taken for gone is forgotten (and its files
    os.makedirs(settings.state_dir)     # removed) at once: the fault shows at the next scan
    d = Daemon(settings)
    yield d
    d.executor.shutdown()


def test_a_failed_listing_and_a_busy_blank_record_keep_a_live_rank_watched(
        daemon, record_dir, monkeypatch):
    with UserProc(0) as rank:
        path = publish(record_dir, rank.pid, 0, "j", hung=False)
        stacks = path.with_suffix(".stacks")
        stacks.write_bytes(b"")
        daemon.scan()
        (watched,) = daemon.ranks.values()
        assert watched.state == State.RUNNING

        real_scandir = os.scandir

        def emfile(*_a, **_k):
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(os, "scandir", emfile)
        daemon.scan()
        monkeypatch.setattr(os, "scandir", real_scandir)
        assert watched.state == State.RUNNING, watched.reason
        daemon.scan()
        assert path.exists() and stacks.exists()

        # Mid-write for good, with the identity blanked: unreadable, not gone.
        healthy = path.read_bytes()
        with open(path, "r+b") as f:
            f.write(bytes(len(layout.MAGIC)))
            f.seek(layout.SEQ_OFFSET)
            f.write(struct.pack("<Q", 7))
        for _ in range(3):
            daemon.scan()
            assert daemon.ranks[watched.key].state == State.RUNNING, watched.reason
        assert path.exists() and stacks.exists()

        path.write_bytes(healthy)  # readable again (a file it cannot read is never removed)
        daemon.scan()
        assert daemon.ranks[watched.key].state == State.RUNNING
        rank.kill()  # now it is gone: its process is
        daemon.scan()
        assert watched.state == State.EXITED
        daemon.scan()  # retention 0: forgotten, and its files removed
        assert watched.key not in daemon.ranks
        assert not path.exists() and not stacks.exists()
