"""The daemon samples native stacks only for a job waiting past its deadline: never for a
healthy one (the daemon in-process, the real Linux probe, a real process behind a real
record; the sampler's work is recorded instead of run)."""

from __future__ import annotations

import os

import pytest

from tests.support.users import UserProc, publish
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon


@pytest.fixture
def daemon(tmp_path, record_dir):
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"), mode="observe")
    os.makedirs(settings.state_dir)
    d = Daemon(settings)
    d.submitted = []  # type: ignore[attr-defined]
    d.jobs.stacks.submit = d.submitted.append  # type: ignore[attr-defined]
    yield d
    d.executor.shutdown()
    d.jobs.sampling.shutdown()


def test_a_healthy_job_is_never_sampled(daemon, record_dir):
    with UserProc(0) as rank:
        publish(record_dir, rank.pid, 0, "j", hung=False)
        for _ in range(3):
            daemon.scan()
        assert daemon.submitted == [] and daemon.jobs.stacks.asked == {}
        assert daemon.jobs.stacks.taken == 0


def test_a_rank_past_its_deadline_is_sampled_once_per_few_seconds(daemon, record_dir):
    with UserProc(0) as rank:
        publish(record_dir, rank.pid, 0, "j", hung=True, world_size=1)
        for _ in range(3):
            daemon.scan()
        assert len(daemon.submitted) == 1  # asked once: the next scans are within 3 s
        (key,) = daemon.jobs.stacks.asked
        assert key[0] == rank.pid
