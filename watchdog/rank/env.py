"""What a rank learns from its environment: the record directory, the job, its place
in the group, the dump signal; and the one way the rank side speaks (stderr)."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from collections.abc import Mapping

from watchdog import record
from watchdog.rank import launchenv


def warn(message: str) -> None:
    """Tell the user one line on stderr (a stderr gone is ignored)."""
    try:
        sys.stderr.write(f"mlx-watchdog: {message}\n")
    except Exception:  # noqa: BLE001, S110 - stderr itself is gone; nothing left to tell
        pass


def record_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The record directory a rank publishes to: `MLX_WATCHDOG_DIR`, else the default."""
    return env.get("MLX_WATCHDOG_DIR") or record.DEFAULT_DIR


def job_id(env: Mapping[str, str] = os.environ) -> str:
    """A job id that every rank of one launch derives alike, with no configuration.

    MLX_WATCHDOG_JOB if set; else a hash of the hostfile's or the JACCL device
    file's contents and the coordinator, or of MPI's job namespace
    (watchdog/rank/launchenv.py), the same text on every node of a launch,
    wherever the launcher wrote it.
    """
    return launchenv.job_id(env, os.getpid(), os.getppid())


def workload() -> str:
    """A digest of this program and its arguments: the same for every relaunch of one
    workload (exo's runners are spawned children, whose sys.argv is their parent's), so
    the daemon's auto deadline carries over to a relaunch under a new job id."""
    try:
        text = "\0".join([sys.executable, *map(str, sys.argv)])
        return "w" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:23]
    except Exception:  # noqa: BLE001 - never into the user's program
        return ""


def env_rank_size(env: Mapping[str, str]) -> tuple[int, int]:
    """The rank and world size the launch environment gives (-1 and 0 when unknown)."""
    return launchenv.rank(env), launchenv.world_size(env)


def guess_backend(env: Mapping[str, str]) -> str:
    """The backend the launch environment names ("" when none is recognised)."""
    return launchenv.backend(env)


def dump_signal_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """MLX_WATCHDOG_DUMP_SIGNAL: a number or a name (SIGUSR2, USR2); 0 for none."""
    raw = env.get("MLX_WATCHDOG_DUMP_SIGNAL", "SIGUSR2").strip().upper()
    if raw.isdigit():
        return int(raw)
    name = raw if raw.startswith("SIG") else "SIG" + raw
    return int(getattr(signal, name, 0))
