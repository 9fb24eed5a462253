"""The room keeper (root) in the shared record directory: it writes only to a file
proven a rank's dump; a hard link to another owner's file, a dump of root's, of no
record or of another owner than its record's, is only unlinked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.users import OTHER_UID
from watchdog.daemon import roomkeeper

BIG = 6 << 20  # past what a dump needs


@pytest.fixture
def full(monkeypatch, tmp_path: Path) -> Path:
    """A record directory whose filesystem reads as full (nothing free of 64 MiB)."""
    monkeypatch.setattr(roomkeeper, "_free", lambda _d: (0, 64 << 20))
    directory = tmp_path / "records"
    directory.mkdir()
    return directory


def _keep(directory: Path) -> None:
    """Scans until nothing is left to free (each frees until the reserve is back, and
    the filesystem here reads as full at every one)."""
    for _ in range(8):
        roomkeeper.keep_room(str(directory))


def _file(path: Path, uid: int, size: int = BIG) -> Path:
    with open(path, "wb") as f:
        f.write(b"x" * size)  # real blocks: the keeper counts what is used
    os.chown(path, uid, uid)
    return path


def test_a_hard_link_to_another_owners_file_is_unlinked_never_truncated(full, tmp_path):
    victim = _file(tmp_path / "roots-file", 0)  # root's own: the keeper is root
    other = _file(tmp_path / "others-file", OTHER_UID)
    os.link(victim, full / "x.stacks")  # what fs.protected_hardlinks=0 lets a user do
    _file(full / "x.rec", 0, 4096)
    os.link(other, full / "y.stacks")  # another user's file, linked under a rank's name
    _file(full / "y.rec", OTHER_UID, 4096)
    _keep(full)
    assert victim.stat().st_size == BIG and other.stat().st_size == BIG
    assert not (full / "x.stacks").exists() and not (full / "y.stacks").exists()


def test_only_a_proven_ranks_dump_is_truncated(full):
    dump = _file(full / "1.stacks", OTHER_UID)  # a rank's: its record is its owner's
    _file(full / "1.rec", OTHER_UID, 4096)
    roots = _file(full / "2.stacks", 0)  # root's dump: never written
    _file(full / "2.rec", 0, 4096)
    orphan = _file(full / "3.stacks", OTHER_UID)  # no record beside it
    mismatched = _file(full / "4.stacks", OTHER_UID)  # its record is another owner's
    _file(full / "4.rec", 0, 4096)
    _keep(full)
    assert dump.exists() and dump.stat().st_size == 0  # the rank holds it open: kept
    for path in (roots, orphan, mismatched):
        assert not path.exists(), path


# -- a fill nothing can free, and the keeper's work per scan (issue 37, items 5 and 6) --


def test_a_fill_held_in_a_deleted_open_file_is_reported_with_the_uid_holding_it(
        full, caplog, monkeypatch):
    """uid 65534 holds a deleted file of the directory open: nothing there can be
    freed. The keeper says so (status, metric, alert, log), naming the uid, logged
    once while it lasts; room again is said once too."""
    import logging

    from tests.support.users import UserProc
    from watchdog.daemon.probes import probe

    held = full / "fill"
    fd = os.open(held, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"x" * (2 << 20))
    os.unlink(held)
    with UserProc() as other:  # forked: holds the descriptor, as uid 65534
        os.close(fd)
        import psutil

        from tests.support.ranks import wait_for
        # The fork returns before the child's setuid: the holder is ours until then.
        wait_for(lambda: psutil.Process(other.pid).uids().real == OTHER_UID, 10,
                 what="the child to become the other user")
        holders = probe().deleted_holders(str(full))
        if holders is not None:  # Linux reads /proc; elsewhere not findable
            assert holders.get(OTHER_UID, 0) >= 2 << 20 and other.pid
        keeper = roomkeeper.Keeper(str(full), probe().deleted_holders)
        caplog.set_level(logging.ERROR, logger="watchdog.daemon.roomkeeper")
        for _ in range(5):
            why = keeper.keep()
        assert "nothing in it left to free" in why and "unwatched" in why
        if holders is not None:
            assert f"uid {OTHER_UID}" in why
        assert len([r for r in caplog.records if "full" in r.getMessage()]) == 1
    monkeypatch.setattr(roomkeeper, "_free", lambda _d: (64 << 20, 64 << 20))  # freed
    assert keeper.keep() == "" and keeper.full == ""


def test_a_full_record_directory_is_in_the_status_and_the_metrics(full, tmp_path):
    from watchdog.daemon.config import Settings
    from watchdog.daemon.loop import Daemon
    from watchdog.net.metrics import exposition

    daemon = Daemon(Settings(dir=str(full), state_dir=str(tmp_path / "state")))
    try:
        os.makedirs(tmp_path / "state")
        daemon.scan()
        assert daemon.snapshot.record_dir_full and "full" in daemon.snapshot.record_dir_full
        assert b"mlx_watchdog_record_dir_full 1.0" in exposition(lambda: daemon.snapshot)
        assert "record_dir_full" in daemon.snapshot.to_json()
    finally:
        daemon.executor.shutdown(wait=False)


@pytest.mark.slow
def test_the_keepers_work_per_scan_is_capped_and_resumed(full, monkeypatch):
    """Issue 37, item 6: 200,000 empty dumps below the reserve made every scan stat
    them all. Each scan looks at no more than its cap, the next going on where it
    stopped; a whole pass still finds what there is to free."""
    for n in range(5000):
        (full / f"{n}.stacks").touch()
    looked: list[int] = []
    real = roomkeeper.keep_room

    def counted(*args, **kwargs):
        room = real(*args, **kwargs)
        looked.append(room.looked)
        return room

    monkeypatch.setattr(roomkeeper, "keep_room", counted)
    keeper = roomkeeper.Keeper(str(full), lambda _d: {}, limit=1000)
    junk = _file(full / "junk", OTHER_UID, 1 << 20)  # somewhere in the listing
    scans = 0
    while junk.exists() and scans < 10:
        keeper.keep()
        scans += 1
    assert not junk.exists(), "a whole pass did not find the junk"
    assert max(looked) <= 1000 and scans <= 6, (looked, scans)
