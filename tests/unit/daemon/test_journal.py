"""The incident journal and the reboot flag in the state directory."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from watchdog.daemon.store import journal


def test_append_and_read_round_trip(state_dir: Path) -> None:
    first = {"id": "a", "time": 1.5, "ranks": [{"rank": 0, "pid": 10}], "reboot_required": False}
    second = {"id": "b", "note": "ünïcode ✓", "path": Path("/x")}  # default=str for odd types
    journal.append_incident(str(state_dir), first)
    journal.append_incident(str(state_dir), second)
    lines, bad = journal.read_lines(str(state_dir / journal.INCIDENTS))
    assert bad == 0
    assert lines == [first, {"id": "b", "note": "ünïcode ✓", "path": "/x"}]
    incidents, bad = journal.read_incidents(str(state_dir))  # through the contract
    assert bad == 0 and [i.id for i in incidents] == ["a", "b"]
    assert incidents[0].time == 1.5 and incidents[0].ranks[0].pid == 10
    assert incidents[0].reboot_required is False
    lines = (state_dir / journal.INCIDENTS).read_bytes().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)
    assert (state_dir / journal.INCIDENTS).stat().st_mode & 0o777 == 0o644


def test_no_journal_yet(state_dir: Path) -> None:
    assert journal.read_incidents(str(state_dir)) == ([], 0)


def test_malformed_lines_are_counted_and_skipped(state_dir: Path) -> None:
    journal.append_incident(str(state_dir), {"id": "good-1"})
    with open(state_dir / journal.INCIDENTS, "ab") as f:
        f.write(b'{"id": "torn", "ti\n')  # a torn line
        f.write(b"not json at all\n")
        f.write(b"[1, 2, 3]\n")  # JSON, but not an incident object
        f.write(b"\xff\xfe garbage\n")
    journal.append_incident(str(state_dir), {"id": "good-2"})
    incidents, bad = journal.read_incidents(str(state_dir))
    assert [i.id for i in incidents] == ["good-1", "good-2"]
    assert bad == 4
    with open(state_dir / journal.INCIDENTS, "ab") as f:
        f.write(b'{"no id": 1}\n')  # an object, but no incident: counted, never read
    assert [i.id for i in journal.read_incidents(str(state_dir))[0]] == ["good-1", "good-2"]
    assert journal.read_incidents(str(state_dir))[1] == 5


def test_append_does_not_follow_a_symlink(state_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    (state_dir / journal.INCIDENTS).symlink_to(elsewhere)
    with pytest.raises(OSError):
        journal.append_incident(str(state_dir), {"id": "x"})
    assert elsewhere.read_text() == ""


def _writer(state_dir: str, writer: int, count: int, start: multiprocessing.synchronize.Event
            ) -> None:
    start.wait(10)
    padding = "x" * (200 + 97 * writer)  # lines of different lengths, some over 1 KiB
    for n in range(count):
        journal.append_incident(state_dir, {"writer": writer, "n": n, "pad": padding * (n % 5)})


@pytest.mark.slow
def test_concurrent_appends_never_interleave(state_dir: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    writers, count = 6, 300
    procs = [ctx.Process(target=_writer, args=(str(state_dir), w, count, start))
             for w in range(writers)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0

    raw = (state_dir / journal.INCIDENTS).read_bytes()
    lines = raw.splitlines()
    assert len(lines) == writers * count
    seen = {(w, n) for w in range(writers) for n in range(count)}
    got = set()
    for line in lines:
        item = json.loads(line)  # every line parses: nothing interleaved
        got.add((item["writer"], item["n"]))
    assert got == seen
    incidents, bad = journal.read_lines(str(state_dir / journal.INCIDENTS))
    assert bad == 0 and len(incidents) == writers * count
    # Each writer's own lines stay in its order.
    for w in range(writers):
        assert [i["n"] for i in incidents if i["writer"] == w] == list(range(count))


# -- the reboot flag -----------------------------------------------------------------------


def test_reboot_flag_set_keep_first_reason_clear(state_dir: Path) -> None:
    sd = str(state_dir)
    assert journal.reboot_flag(sd) is None
    first = journal.set_reboot_flag(sd, "pid 42 survived SIGKILL", time=1.0, incident="i1")
    assert first.reason == "pid 42 survived SIGKILL"
    second = journal.set_reboot_flag(sd, "wired memory leaked", time=2.0, wired_after=5)
    assert second.reason == "pid 42 survived SIGKILL"  # the first reason stays
    assert [r.reason for r in second.reasons] == ["pid 42 survived SIGKILL",
                                                  "wired memory leaked"]
    assert second.reasons[1].wired_after == 5

    flag = journal.reboot_flag(sd)  # what a restarted daemon or the CLI reads back
    assert flag == second
    path = state_dir / journal.REBOOT_FLAG
    assert json.loads(path.read_text()) == second.to_json() == {
        "reason": "pid 42 survived SIGKILL",
        "reasons": [{"incident": "i1", "reason": "pid 42 survived SIGKILL", "time": 1.0},
                    {"reason": "wired memory leaked", "time": 2.0, "wired_after": 5}]}
    assert path.stat().st_mode & 0o777 == 0o644
    assert not [p for p in os.listdir(sd) if p.startswith(".tmp-")]  # no temp file left

    assert journal.clear_reboot_flag(sd) is True
    assert journal.reboot_flag(sd) is None
    assert journal.clear_reboot_flag(sd) is False


def test_unreadable_reboot_flag_still_counts_as_flagged(state_dir: Path) -> None:
    (state_dir / journal.REBOOT_FLAG).write_text("{ not json")
    flag = journal.reboot_flag(str(state_dir))
    assert flag is not None and "unreadable" in flag.reason
    (state_dir / journal.REBOOT_FLAG).write_text('"old style reason"')
    assert journal.reboot_flag(str(state_dir)).to_json() == {"reason": "old style reason"}
    # Setting over an unreadable flag keeps a reason and stays valid JSON.
    (state_dir / journal.REBOOT_FLAG).write_text("{ not json")
    flag = journal.set_reboot_flag(str(state_dir), "pid 7 survived SIGKILL")
    assert json.loads((state_dir / journal.REBOOT_FLAG).read_text()) == flag.to_json()
    assert flag.reason


def test_a_planted_pointer_never_blocks_nor_misleads(tmp_path):
    """The record directory is everyone's: a FIFO, a link or another user's file
    where the daemon's pointer goes must not hang `status` or the daemon's stop,
    nor be believed."""
    import threading

    from watchdog.daemon.store import journal as j

    pointer = tmp_path / j.POINTER
    os.mkfifo(pointer)  # open() without O_NONBLOCK would wait for a writer forever
    results = []
    worker = threading.Thread(target=lambda: results.append(
        (j.read_pointer(str(tmp_path)), j.remove_pointer(str(tmp_path)))), daemon=True)
    worker.start()
    worker.join(10)
    assert results == [(None, None)] and pointer.exists()
    pointer.unlink()
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"state_dir": "/forged", "daemon_pid": os.getpid()}))
    pointer.symlink_to(target)
    assert j.read_pointer(str(tmp_path)) is None
    j.remove_pointer(str(tmp_path))
    assert pointer.is_symlink() and target.exists()  # a link is not ours to follow
    pointer.unlink()
    j.publish_pointer(str(tmp_path), str(tmp_path / "state"), "127.0.0.1:0")
    assert j.read_pointer(str(tmp_path)).state_dir == str(tmp_path / "state")
    os.chown(pointer, 65534, 65534)  # another user's: not believed, not removed
    assert j.read_pointer(str(tmp_path)) is None
    j.remove_pointer(str(tmp_path))
    assert pointer.exists()
    os.chown(pointer, os.getuid(), os.getgid())
    j.remove_pointer(str(tmp_path))
    assert not pointer.exists()


def test_the_reboot_flag_and_incidents_are_fsynced(state_dir, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    journal.set_reboot_flag(str(state_dir), "unkillable")
    flag = str(state_dir / journal.REBOOT_FLAG)
    # The file's data before the rename (under its temporary name), then the directory.
    assert any(p.startswith(str(state_dir / ".tmp-")) for p in synced), synced
    assert synced[-1] == str(state_dir), synced
    synced.clear()
    journal.append_incident(str(state_dir), {"id": "i"})
    assert synced == [str(state_dir / journal.INCIDENTS)]
    assert journal.reboot_flag(str(state_dir)).reason == "unkillable" and flag
