"""A rank that dies takes down its job's local ranks that were alive with it, after
PEER_DEATH_GRACE, and never a rank that started later under the same job name (the
job relaunched by `mlx-watchdog launch`, which keeps the name across attempts)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tests.support.ranks import wait_for
from tests.support.users import UserProc, publish
from watchdog.daemon.clock import Clock
from watchdog.daemon.config import Settings
from watchdog.daemon.fences import PEER_DEATH_GRACE
from watchdog.daemon.loop import Daemon
from watchdog.states import State

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def test_a_dead_ranks_peers_are_ended_but_not_the_next_attempts_ranks(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    settings = Settings(dir=str(records), state_dir=str(tmp_path / "state"), deadline=60.0,
                        grace=2.0)
    os.makedirs(settings.state_dir)
    clock = [time.monotonic_ns()]
    with UserProc(0) as peer, UserProc(0) as crashing, UserProc(0) as relaunched:
        publish(records, peer.pid, 0, "j", hung=False, rank=0)
        publish(records, crashing.pid, 0, "j", hung=False, rank=1)
        daemon = Daemon(settings, clock=Clock(lambda: clock[0]))
        try:
            daemon.scan()  # both seen alive: a death of either fences its peers
            crashing.kill()  # a crash: its record stays open
            daemon.scan()
            gone = next(r for r in daemon.ranks.values() if r.record.pid == crashing.pid)
            assert gone.state == State.EXITED
            # The job comes back under its name before the grace is out.
            publish(records, relaunched.pid, 0, "j", hung=False, rank=1)
            daemon.scan()
            clock[0] += int((PEER_DEATH_GRACE + 1) * 1e9)
            daemon.scan()
            assert relaunched.pid not in {k[0] for r in daemon.pending for k in r.keys}
            wait_for(lambda: peer.poll() is not None, 30, what="the dead rank's peer ended")
            assert signal.SIGTERM in peer.signals()  # by the ladder, begun at that scan
            for _ in range(3):
                clock[0] += int(1e9)
                daemon.scan()
            assert relaunched.poll() is None and relaunched.signals() == []
            ranks = {r.record.pid: r for r in daemon.ranks.values()}
            assert ranks[relaunched.pid].state not in (State.KILLED, State.EXITED)
        finally:
            daemon.executor.shutdown()
