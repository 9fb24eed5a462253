"""The smaller defects of the issue-11 review, each with the test that shows it.

The seqlock reader takes `seq` first; the fence after a local verdict goes out
at once; a fence signed before the receiver started is refused; an infinite
expect window is refused; the reboot flag and incidents are fsync'd; `cluster
status` fails when no node answers; `doctor` does not call a missing state
directory unflagged.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading

import pytest
from users import UserProc, publish

from watchdog import record
from watchdog.cli import doctor
from watchdog.daemon import journal
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.net import fence
from watchdog.rank import hook
from watchdog.record import RecordWriter

SECRET = "correct horse battery staple"


def test_the_seqlock_reader_reads_seq_before_the_identity(record_dir, monkeypatch):
    """A write that starts and ends while one pread copies the record: the copy
    holds the old identity and the new (even) seq. Taken alone, the copy's seq
    and a re-read agree: a torn record. The seq read first differs."""
    path = record_dir / "r.rec"
    w = RecordWriter(str(path), pid=os.getpid(), start_time=1.0, uid=os.getuid(), host="h",
                     job="old-job", rank=0, world_size=2, backend="ring", dump_signal=0)
    old = path.read_bytes()
    w.set_identity(rank=1, world_size=2, job="new-job")
    w.close(record.STATUS_OPEN, remove=False)
    new = path.read_bytes()
    torn = old[:record.SEQ_OFFSET] + new[record.SEQ_OFFSET:]  # old identity, new seq
    state = {"copied": False}
    real_pread = os.pread

    def pread(fd, size, offset):
        if size == record.RECORD_SIZE:
            first, state["copied"] = not state["copied"], True
            return torn if first else new
        current = new if state["copied"] else old  # the writer finished during the copy
        return current[offset:offset + size]

    monkeypatch.setattr(os, "pread", pread)
    fd = os.open(path, os.O_RDONLY)
    try:
        rec = record.read_fd(fd)
    finally:
        monkeypatch.setattr(os, "pread", real_pread)
        os.close(fd)
    assert (rec.job, rec.rank) == ("new-job", 1)


def test_the_fence_goes_out_at_the_verdict_not_after_the_ladder(tmp_path, record_dir):
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"),
                        blocked_deadline=0.5, peers=("127.0.0.1:9",), secret=SECRET)
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    fenced: list[tuple] = []
    ladder_may_end = threading.Event()
    daemon._fence_peers = lambda *args: fenced.append(args)  # type: ignore[method-assign]

    def slow_handle(incident, *args, **kwargs):  # evidence, grace and settling: long
        ladder_may_end.wait(30)
        return {**incident, "outcome": {}, "signals": []}

    daemon.enforcer.handle = slow_handle  # type: ignore[method-assign]
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, "j", hung=True, world_size=2)
            for _ in range(4):
                daemon.scan()
            assert daemon.pending, "no escalation started"
            assert fenced and fenced[0][:2] == (0, "j"), "the fence waited on the ladder"
    finally:
        ladder_may_end.set()
        daemon.executor.shutdown()


def test_a_fence_signed_before_the_receiver_started_is_refused(tmp_path):
    """Its nonce may have been seen by the receiver's previous run (the cache is
    in memory): replayed just after a restart, it must not act."""
    settings = Settings(dir=str(tmp_path), state_dir=str(tmp_path), secret=SECRET)
    daemon = Daemon(settings)
    try:  # signed 5 s before the start: well within the 30 s window, so fresh otherwise
        body, headers = fence.make(SECRET, "j", "peer", "hung", None, now=daemon.started - 5)
        code, answer = daemon.fence_request(headers, body)
        assert code == 401 and "before this daemon started" in answer["error"]
        body, headers = fence.make(SECRET, "j", "peer", "hung", None, now=2000.5)
        verified = fence.verify(SECRET, headers, body, fence.NonceCache(), now=2001.0,
                                not_before=2000.0)
        assert verified.job == "j"
    finally:
        daemon.executor.shutdown()


@pytest.mark.parametrize("seconds", [math.inf, math.nan, -1.0])
def test_expect_refuses_an_infinite_window(record_dir, seconds):
    w = RecordWriter(str(record_dir / "r.rec"), pid=os.getpid(), start_time=1.0,
                     uid=os.getuid(), host="h", job="j", rank=0, world_size=1, backend="",
                     dump_signal=0)
    hb = hook.Heartbeat(w)
    with pytest.raises(ValueError, match="finite"):
        with hb.expect(seconds):
            pass
    assert record.read_path(str(record_dir / "r.rec")).expect_seconds == 0.0
    hb.close()


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
    assert journal.reboot_flag(str(state_dir))["reason"] == "unkillable" and flag


def test_cluster_status_fails_when_no_node_answers():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    out = subprocess.run([sys.executable, "-m", "watchdog.cli", "cluster", "status",
                          f"127.0.0.1:{port}", "--timeout", "2"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "UNREACHABLE" in out.stdout and "no node answered" in out.stderr


def test_doctor_does_not_call_a_missing_state_directory_unflagged(tmp_path):
    lines = doctor.check_reboot_flag(str(tmp_path / "nowhere"))
    assert [level for level, _ in lines] == [doctor.WARN]
    assert "no reboot flag" not in lines[0][1] and "does not exist" in lines[0][1]
    assert doctor.check_reboot_flag(str(tmp_path))[0][0] == doctor.OK
