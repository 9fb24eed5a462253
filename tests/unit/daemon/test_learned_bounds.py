"""What any user's records can teach the auto deadline is bounded.

Unknown op codes are one kind; a job's kinds and a uid's jobs are capped; the
file written always loads. tests/ranks/daemon/test_learned_bounds.py runs it against
the real daemon.
"""

from __future__ import annotations

import time

import pytest

from tests.support.users import OTHER_UID
from watchdog.daemon.judge.deadlines import OTHER_KIND, Learned, kind_of
from watchdog.daemon.store import learning
from watchdog.record.layout import OPS


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


@pytest.mark.slow
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
