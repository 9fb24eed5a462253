"""`mlx-watchdog launch ARGS...`: mlx.launch with one fresh job id for the whole launch.

mlx.launch gives the ranks nothing that differs between two launches of the
same hostfile and ports, so the hook's derived job id is shared by such
relaunches (docs/limits.md). This runs mlx.launch with
`--env MLX_WATCHDOG_JOB=<id>` first, which mlx.launch exports on every host
(ssh does not forward our environment; `--env` is how it reaches remote ranks).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import time
import uuid

JOB_ENV = "MLX_WATCHDOG_JOB"


class LauncherError(Exception):
    """mlx.launch cannot be found or run; the message says what to do."""


def new_job_id(now: float | None = None) -> str:
    """A fresh job id for one launch: `launch-<UTC time>-<8 hex digits>`."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"launch-{stamp}-{uuid.uuid4().hex[:8]}"


def named_env(args: list[str], key: str) -> str | None:
    """The value of `key` given to mlx.launch with --env, if any (before the command)."""
    for i, arg in enumerate(args):
        value = None
        if arg == "--env" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--env="):
            value = arg[len("--env="):]
        if value is not None and value.startswith(f"{key}="):
            return value.split("=", 1)[1]
        if arg == "--":
            break
    return None


LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def single_node(args: list[str], here: str | None = None) -> bool:
    """The launch runs every rank on this node: mlx.launch given no --hostfile, and no
    --hosts or only this node's names (its options, before the script). Its peers'
    reboot flags then do not bear on it."""
    import socket

    names = LOCAL_NAMES | {here or socket.gethostname()}
    for i, arg in enumerate(args):
        if arg == "--" or arg.endswith(".py"):
            break
        if arg == "--hostfile" or arg.startswith("--hostfile="):
            return False
        hosts = (args[i + 1] if arg == "--hosts" and i + 1 < len(args)
                 else arg[len("--hosts="):] if arg.startswith("--hosts=") else None)
        if hosts is not None and not all(h.strip() in names
                                         for h in hosts.split(",") if h.strip()):
            return False
    return True


def find_mlx_launch() -> str:
    """mlx.launch of this interpreter's environment, else the first on PATH."""
    here = os.path.join(sysconfig.get_path("scripts"), "mlx.launch")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    found = shutil.which("mlx.launch")
    if found is None:
        raise LauncherError(f"no mlx.launch next to {sys.executable} or on PATH: pip install mlx")
    return found
