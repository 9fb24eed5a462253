"""The record directory reader: junk read once, a capped and rotating scan."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

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
