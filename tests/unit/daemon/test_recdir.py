"""The record directory reader: junk read once, a capped and rotating scan."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from tests.support.users import OTHER_UID
from watchdog import record
from watchdog.daemon import recdir
from watchdog.daemon.recdir import RecordDir
from watchdog.record import RecordWriter


def real_record(path: Path) -> RecordWriter:
    me = psutil.Process()
    w = RecordWriter(str(path), pid=me.pid, start_time=me.create_time(), uid=os.getuid(),
                     host="h", job="j", rank=0, world_size=1, backend="ring", dump_signal=0)
    w.begin()
    w.end()
    return w


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path the reader opens, in order (the real read still happens)."""
    calls: list[str] = []
    real = record.read_path

    def counting(path: str) -> record.Record:
        calls.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(recdir.record, "read_path", counting)
    return calls


def test_unusable_files_are_opened_once_until_they_change(tmp_path: Path,
                                                          opened: list[str]) -> None:
    (tmp_path / "a.rec").write_bytes(b"\0" * record.RECORD_SIZE)
    (tmp_path / "b.rec").write_bytes(b"short")  # wrong size: never opened at all
    rd = RecordDir(str(tmp_path))
    first = {os.path.basename(e.path): e.why for e in rd.read()}
    assert list(rd.read()) == []  # known: not even looked at again
    second = {os.path.basename(e.path): e.why for e in rd.read(all_files=True)}
    assert first == second and set(first) == {"a.rec", "b.rec"}
    assert rd.unusable(1) == {str(tmp_path / "a.rec"): first["a.rec"]}
    assert "bad magic" in first["a.rec"] and "size 5" in first["b.rec"]
    assert opened == ["a.rec"]
    os.truncate(tmp_path / "a.rec", 0)  # changed in place: still the same junk file
    os.truncate(tmp_path / "a.rec", record.RECORD_SIZE)
    list(rd.read())
    assert opened == ["a.rec"]
    w = real_record(tmp_path / "new.rec")  # a rank publishes by renaming into place
    try:
        os.rename(w.path, tmp_path / "a.rec")
        (entry,) = [e for e in rd.read() if e.path.endswith("a.rec")]
        assert entry.record is not None and opened == ["a.rec", "a.rec"]
    finally:
        w.close(record.STATUS_CLOSED, remove=False)


def test_a_record_torn_mid_init_is_read_again_next_scan(tmp_path: Path,
                                                        opened: list[str]) -> None:
    """Stopped inside set_identity (the magic blanked, seq odd): unusable now, but
    it must not be written off, or the rank would stay hidden when it resumes."""
    w = real_record(tmp_path / "r.rec")
    try:
        w.begin()
        w.words[0] = 0  # the magic's word, as struct.pack_into blanks it
        rd = RecordDir(str(tmp_path))
        (entry,) = rd.read()
        assert entry.record is None and "mid-write" in entry.why
        w.set_identity(rank=0, world_size=1)  # resumes: rewrites the identity...
        w.end()  # ...and closes the write it was stopped in
        (entry,) = rd.read()
        assert entry.record is not None and opened == ["r.rec", "r.rec"]
    finally:
        w.close(record.STATUS_CLOSED)


def test_a_forged_record_marked_bad_is_skipped_until_it_changes(tmp_path: Path,
                                                                opened: list[str]) -> None:
    w = real_record(tmp_path / "r.rec")
    try:
        rd = RecordDir(str(tmp_path))
        (entry,) = rd.read()
        assert entry.record is not None
        rd.mark_bad(entry.path, entry.stat, "forged")
        assert list(rd.read()) == []
        (again,) = rd.read(all_files=True)
        assert again.record is None and again.why == "forged"
        assert opened == ["r.rec"]
    finally:
        w.close(record.STATUS_CLOSED)


def test_the_cap_rotates_so_junk_sorting_first_cannot_hide_a_record(tmp_path: Path,
                                                                    opened: list[str]) -> None:
    for i in range(10):
        (tmp_path / f"0-junk-{i}.rec").write_bytes(os.urandom(record.RECORD_SIZE))
    w = real_record(tmp_path / "zz.rec")
    try:
        rd = RecordDir(str(tmp_path), max_reads=4)
        found = []
        for _ in range(3):
            before = len(opened)
            found += [e.record for e in rd.read() if e.record is not None]
            assert len(opened) - before <= 4
        assert found and found[0] is not None and found[0].job == "j"
        # Once watched, it is read on every scan whatever the junk costs.
        watched = {str(tmp_path / "zz.rec")}
        for _ in range(3):
            assert any(e.record is not None for e in rd.read(watched))
    finally:
        w.close(record.STATUS_CLOSED)


def test_a_rank_stopped_mid_write_is_still_read(tmp_path: Path) -> None:
    w = real_record(tmp_path / "r.rec")
    try:
        w.begin()  # `seq` odd for good, as if SIGSTOP landed here
        (entry,) = RecordDir(str(tmp_path)).read()
        assert entry.record is not None and entry.record.seq % 2 == 1
    finally:
        w.end()
        w.close(record.STATUS_CLOSED)


# -- issue 57: names steer nothing ------------------------------------------------------


@pytest.fixture
def looked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every name the reader `lstat`s."""
    calls: list[str] = []
    real = os.lstat

    def counting(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(recdir.os, "lstat", counting)
    return calls


def _junk(path: Path, uid: int = 0) -> Path:
    path.write_bytes(b"\0" * record.RECORD_SIZE)
    os.chown(path, uid, uid)
    return path


def test_hard_links_and_renames_of_junk_cost_nothing(tmp_path: Path, opened: list[str],
                                                     looked: list[str]) -> None:
    """Item 1 and 5: a file found unusable is so by what it is: 500 hard links to it
    cost no open and no lstat; a rename of it one lstat, no open."""
    seed = _junk(tmp_path / "seed")
    rd = RecordDir(str(tmp_path))
    os.link(seed, tmp_path / "a.rec")
    assert [e.why for e in rd.read()] == ["not an mlx-watchdog record (bad magic)"]
    for i in range(500):
        os.link(seed, tmp_path / f"z{i:04d}.rec")
    looked.clear()
    assert list(rd.read()) == []
    assert opened == ["a.rec"] and looked == []
    os.rename(tmp_path / "a.rec", tmp_path / "renamed.rec")
    os.unlink(seed)
    for i in range(500):
        os.unlink(tmp_path / f"z{i:04d}.rec")
    assert list(rd.read()) == [] and opened == ["a.rec"] and looked == ["renamed.rec"]
    # Changed in place under a fresh name: another file now, read again.
    os.rename(tmp_path / "renamed.rec", tmp_path / "again.rec")
    os.utime(tmp_path / "again.rec", ns=(1, 1))
    assert len(list(rd.read())) == 1 and opened == ["a.rec", "again.rec"]


def test_a_copy_is_refused_by_its_name_not_its_file(tmp_path: Path) -> None:
    """A copy's verdict is its name's: the file under its first name is still read."""
    w = real_record(tmp_path / "r.rec")
    try:
        os.link(tmp_path / "r.rec", tmp_path / "copy.rec")
        rd = RecordDir(str(tmp_path))
        rd.mark_bad(str(tmp_path / "copy.rec"), os.lstat(tmp_path / "copy.rec"), "a copy",
                    by_file=False)
        (entry,) = rd.read([str(tmp_path / "r.rec")])
        assert entry.record is not None and entry.path.endswith("r.rec")
    finally:
        w.close(record.STATUS_CLOSED)


def test_one_owners_flood_never_delays_another_owners_record(tmp_path: Path,
                                                             opened: list[str]) -> None:
    """Item 1: however many files one uid has waiting, whatever their names, another
    uid's record is opened in the first scan that lists it; each owner's files are
    opened at most `max_reads_per_uid` a scan, his newest and oldest by turns."""
    rd = RecordDir(str(tmp_path), max_reads=64, max_reads_per_uid=4)
    for i in range(40):
        path = tmp_path / f"{i:03d}.rec"
        path.write_bytes(os.urandom(record.RECORD_SIZE))  # each file its own junk
        os.chown(path, OTHER_UID, OTHER_UID)
        os.utime(path, ns=(i, 10**9 + i))
    w = real_record(tmp_path / "zzz.rec")  # root's, sorting last, newest
    try:
        found = [e for e in rd.read() if e.record is not None]
        assert [os.path.basename(e.path) for e in found] == ["zzz.rec"]
        assert sorted(opened) == ["000.rec", "001.rec", "038.rec", "039.rec", "zzz.rec"]
        for i in range(40, 80):  # fresh names of his sorting after: his own turn only
            path = _junk(tmp_path / f"zz{i}.rec", OTHER_UID)
            path.write_bytes(os.urandom(record.RECORD_SIZE))
        opened.clear()
        list(rd.read([str(tmp_path / "zzz.rec")]))
        assert opened[0] == "zzz.rec" and len(opened) == 5
        assert opened[2] == "002.rec" and opened[4] == "003.rec"  # the backlog drains
    finally:
        w.close(record.STATUS_CLOSED)


def test_an_ended_ranks_file_is_not_read_again(tmp_path: Path, opened: list[str]) -> None:
    """Item 8: `settled` paths are not read while they hold the file last read."""
    w = real_record(tmp_path / "r.rec")
    try:
        rd = RecordDir(str(tmp_path))
        assert len(list(rd.read())) == 1
        for _ in range(3):
            assert list(rd.read(settled=[str(tmp_path / "r.rec")])) == []
        assert opened == ["r.rec"]
        w2 = real_record(tmp_path / "new.rec")  # a new rank published under the name
        os.rename(tmp_path / "new.rec", tmp_path / "r.rec")
        assert len(list(rd.read(settled=[str(tmp_path / "r.rec")]))) == 1
        w2.close(record.STATUS_CLOSED, remove=False)
    finally:
        w.close(record.STATUS_CLOSED, remove=False)


def test_the_room_keeper_frees_junk_of_a_records_size(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 7: exact-size junk the reader found unusable is freed below the reserve; a
    file of a record's size not known unusable (a record not read yet) is kept."""
    from watchdog.daemon import roomkeeper

    monkeypatch.setattr(roomkeeper, "_free", lambda _d: (0, 64 << 20))
    junk = [tmp_path / f"j{i}.rec" for i in range(3)]
    for path in junk:
        path.write_bytes(os.urandom(record.RECORD_SIZE))
    rd = RecordDir(str(tmp_path))
    list(rd.read())
    unread = tmp_path / "unread.rec"
    unread.write_bytes(os.urandom(record.RECORD_SIZE))
    keeper = roomkeeper.Keeper(str(tmp_path), lambda _d: {}, unusable=rd.known_bad)
    keeper.keep()
    assert not any(p.exists() for p in junk) and unread.exists()
