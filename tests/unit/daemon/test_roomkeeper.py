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
