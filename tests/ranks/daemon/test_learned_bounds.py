"""What any user's records can teach the auto deadline is bounded, against the real
daemon: a uid-65534 process whose record waits on ever-new op codes teaches one kind.
"""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from tests.support.ranks import DaemonProc
from tests.support.records import SyntheticWriter
from tests.support.users import OTHER_UID, UserProc
from watchdog import record
from watchdog.daemon.judge.deadlines import OTHER_KIND
from watchdog.daemon.store import learning
from watchdog.procstat import read_start_ticks
from watchdog.record import layout
from watchdog.record.layout import OPS
from watchdog.states import Phase


@pytest.mark.ranks
def test_a_record_waiting_on_new_op_codes_teaches_one_kind(record_dir, state_dir):
    os.chmod(record_dir, 0o1777)
    daemon = DaemonProc(record_dir, state_dir, deadline="auto", interval=0.1)
    with UserProc() as child:
        path = record_dir / f"{child.pid}.rec"
        writer = SyntheticWriter(str(path), pid=child.pid,
                              start_time=psutil.Process(child.pid).create_time(), uid=OTHER_UID,
                              host="node", job="mint", rank=0, world_size=1, backend="ring",
                              dump_signal=0, start_ticks=read_start_ticks(child.pid))
        os.chown(writer.path, OTHER_UID, OTHER_UID)
        try:
            daemon.start()
            counts: dict[int, int] = {}
            for n in range(12):  # 12 waits, each on an op code nobody knows
                # Codes past the op table: in the pace table (up to PACE_OPS) as it counts
                # them, and far past it in the wait's op word, as a forger may write.
                code = len(OPS) + n % (layout.PACE_OPS - len(OPS))
                began = time.monotonic_ns()
                writer.begin()
                writer.write_hot(n, n + 1, n, 0, Phase.WAIT, len(OPS) + 100 + n, began, began,
                                 began, 0, 0)
                writer.end()
                time.sleep(0.35)  # long enough for a scan to see it in progress
                done = time.monotonic_ns()
                counts[code] = counts.get(code, 0) + 1
                writer.begin()
                writer.write_hot(n + 1, n + 1, n + 1, 0, Phase.RUNNING, 0, done, 0, done,
                                 done - began, done - began)
                writer.write_pace(code, counts[code], done - began)
                writer.end()
                time.sleep(0.15)
        finally:
            daemon.stop()  # the stop writes what was learned
            writer.close(record.STATUS_CLOSED, remove=True)
    jobs = json.loads((state_dir / learning.FILE).read_text())["jobs"]
    kinds = jobs[f"{OTHER_UID}:mint"]["kinds"]
    assert set(kinds) == {OTHER_KIND}, kinds
    assert kinds[OTHER_KIND]["count"] >= 6
