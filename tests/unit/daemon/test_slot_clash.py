"""Two live processes claiming one rank of one job are not one group: the daemon says so
once (an mpirun whose MLX found no MPI runs each process alone, rank 0 of 1, under the
one job id mpirun gives them). The daemon in-process, the real probe, real processes.
"""

from __future__ import annotations

import logging
import os

from tests.support.users import UserProc, publish
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon


def test_two_processes_in_one_slot_are_warned_once(tmp_path, record_dir, caplog):
    settings = Settings(dir=str(record_dir), state_dir=str(tmp_path / "state"), interval=0.1)
    os.makedirs(settings.state_dir)
    daemon = Daemon(settings)
    caplog.set_level(logging.INFO, logger="watchdog")
    try:
        with UserProc(0) as first, UserProc(0) as second, UserProc(0) as third:
            for proc in (first, second):  # two singletons of one mpirun
                publish(record_dir, proc.pid, 0, "jmpi", hung=False, world_size=1, rank=0)
            publish(record_dir, third.pid, 0, "jother", hung=False, world_size=2, rank=0)
            for _ in range(3):
                daemon.scan()
            warned = [r.getMessage() for r in caplog.records
                      if r.levelno == logging.WARNING and "claim rank" in r.getMessage()]
            low, high = sorted((first.pid, second.pid))
            assert warned == [f"pids {low}, {high} all claim rank 0 of job jmpi (world size 1): "
                              "they are not one group. An mpirun whose MLX found no MPI "
                              "library runs each process alone as rank 0 of 1 (name it with "
                              "MLX_MPI_LIBNAME: README, \"Instrumenting a job\"); or two "
                              "launches share one MLX_WATCHDOG_JOB"], warned
            assert len(daemon.ranks) == 3  # both still watched
            # `status` shows the two rank-0 rows with the daemon's warning under them.
            from click.testing import CliRunner

            from watchdog.cli.commands import cli

            shown = CliRunner().invoke(cli, ["status", "--dir", str(record_dir),
                                             "--state-dir", settings.state_dir])
            assert shown.exit_code == 0, shown.output
            assert f"warning: {warned[0]}" in shown.stderr.splitlines(), shown.stderr
            assert "jother" not in shown.stderr
            assert "None" not in caplog.text and "(?)" not in caplog.text
    finally:
        daemon.executor.shutdown()
