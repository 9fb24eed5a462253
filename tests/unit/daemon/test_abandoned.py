"""A record the hook abandoned is reported, never acted on.

After an internal error the hook stops writing and closes the record with
status 3 (abandoned); its words stay frozen where they were, maybe in a WAIT.
The process runs on uninstrumented: that WAIT is no hang, and its later exit
says nothing of a crash. The daemon in-process, the real Linux probe, a real
process, fences configured towards a peer.
"""

from __future__ import annotations

import logging
import os

import pytest

from tests.support.users import UserProc, publish
from watchdog import record
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.rank import hook
from watchdog.record import RecordWriter
from watchdog.states import State


@pytest.mark.parametrize("status", [record.STATUS_ABANDONED, record.STATUS_ERROR])
def test_an_abandoned_record_frozen_in_a_wait_is_never_acted_on_nor_fenced_over(
        tmp_path, record_dir, caplog, status):
    """Status 3 is what the hook writes now; status 2 (closed on error) is what
    it wrote before, and what a rank on its way out after an uncaught
    exception shows: alive behind either, the frozen WAIT is not judged."""
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"),
                        blocked_deadline=0.5, interval=0.1, peers=("127.0.0.1:9",),
                        secret="correct horse battery staple")
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    caplog.set_level(logging.INFO, logger="watchdog")
    try:
        with UserProc(0) as rank:
            publish(record_dir, rank.pid, 0, "j", hung=True, world_size=2, status=status)
            for _ in range(5):  # the same record left open is acted on at the 2nd tick
                daemon.scan()
            (watched,) = daemon.ranks.values()
            assert watched.state == State.ABANDONED
            assert not daemon.pending and not watched.escalating
            assert rank.poll() is None and rank.signals() == []
            assert daemon.snapshot.ranks[0].state == "abandoned"
            rank.kill()
            daemon.scan()
            assert watched.state == State.EXITED
            if status == record.STATUS_ABANDONED:  # how it ended is unknown: no fence
                assert "abandoned" in watched.reason and "fencing" not in caplog.text
            else:  # closed on an uncaught exception, then gone: a crash of the job
                assert daemon.peers.fenced_since(watched.record.uid, "j") is not None
    finally:
        daemon.executor.shutdown()


def test_the_hook_marks_a_record_it_gives_up_on_abandoned(record_dir):
    path = record_dir / "self.rec"
    writer = RecordWriter(str(path), pid=os.getpid(), start_time=0.0, uid=os.getuid(),
                          host="h", job="j", rank=0, world_size=2, backend="ring",
                          dump_signal=0)
    hb = hook.Heartbeat(writer)
    hb._fail(RuntimeError("an internal error of the hook"))
    assert not hb.active
    assert record.read_path(str(path)).status == record.STATUS_ABANDONED


def test_status_without_a_daemon_reports_an_abandoned_record_unjudged(record_dir):
    from watchdog.cli.look.sampling import sample_ranks
    from watchdog.daemon.judge.deadlines import Rules

    with UserProc(0) as rank:
        publish(record_dir, rank.pid, 0, "j", hung=True, status=record.STATUS_ABANDONED)
        ranks, invalid = sample_ranks(str(record_dir), Rules(deadline=0.1), pause=0.01)
        assert invalid == {}
        assert [(r.pid, r.state) for r in ranks] == [(rank.pid, "abandoned")]
