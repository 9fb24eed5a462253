"""What any user's records can teach the auto deadline is bounded.

Unknown op codes are one kind; a job's kinds and a uid's jobs are capped; the
file written always loads. The real test: a uid-65534 process whose record
waits on ever-new op codes, against the real daemon.
"""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from tests.support.ranks import DaemonProc
from tests.support.users import OTHER_UID, UserProc
from watchdog import record
from watchdog.daemon import learning
from watchdog.daemon.deadlines import OTHER_KIND, Learned, kind_of
from watchdog.daemon.probes.linux import read_start_ticks
from watchdog.record import RecordWriter
from watchdog.record.layout import OPS
from watchdog.states import Phase


def test_every_unknown_op_code_is_one_kind():
    assert kind_of("eval") == "eval" and kind_of("async_eval") == "eval"
    assert kind_of("") == "wait"
    assert {kind_of(f"?{code}") for code in range(len(OPS), 4096)} == {OTHER_KIND}
    assert kind_of("not an op") == OTHER_KIND


def test_prune_caps_kinds_per_job_and_jobs_per_uid_without_touching_other_users():
    now = 1e9
    learned = {f"{OTHER_UID}:j{n}": {"eval": Learned(1.0, 5)} for n in range(200)}
    updated = {job: now - 1000 + n for n, job in enumerate(learned)}
    learned["0:root-job"] = {f"k{n}": Learned(1.0, n) for n in range(100)}
    updated["0:root-job"] = now - 5000  # the oldest of all, and still kept
    learning.prune(learned, updated, now)
    theirs = [j for j in learned if j.startswith(f"{OTHER_UID}:")]
    assert len(theirs) == learning.MAX_JOBS_PER_UID
    assert f"{OTHER_UID}:j199" in theirs and f"{OTHER_UID}:j0" not in theirs  # newest kept
    assert len(learned["0:root-job"]) == learning.MAX_KINDS_PER_JOB
    assert "k99" in learned["0:root-job"] and "k0" not in learned["0:root-job"]  # most seen


def test_the_file_written_always_loads(state_dir):
    now = time.time()
    # Up to the record's bounds: long job ids and kinds, under many uids.
    learned = {f"{uid}:{'j' * 60}{uid}": {f"{'k' * 200}{n}": Learned(1.5, 9) for n in range(48)}
               for uid in range(450)}
    updated = {job: now - i for i, job in enumerate(learned)}
    learning.save(str(state_dir), learned, updated)
    assert (state_dir / learning.FILE).stat().st_size <= learning.MAX_BYTES
    loaded, _ = learning.load(str(state_dir), now)
    assert loaded and set(loaded) == set(learned)
    assert "0:" + "j" * 60 + "0" in loaded  # the newest kept


@pytest.mark.ranks
def test_a_record_waiting_on_new_op_codes_teaches_one_kind(record_dir, state_dir):
    os.chmod(record_dir, 0o1777)
    daemon = DaemonProc(record_dir, state_dir, deadline="auto", interval=0.1)
    with UserProc() as child:
        path = record_dir / f"{child.pid}.rec"
        writer = RecordWriter(str(path), pid=child.pid,
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
                code = len(OPS) + n % (record.PACE_OPS - len(OPS))
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
