"""Run the CLI (`python tests/support/proc_audit.py run ...`) with an audit hook that
writes to $MLXWD_PROC_AUDIT every file or directory under /proc opened or listed by
code outside the simulated Mac's room (watchdog/macsim): on the simulated Mac the
daemon itself must read no /proc, only the stand-ins do (docs/macos.md)."""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

LOG = os.environ["MLXWD_PROC_AUDIT"]
ROOM = os.sep + os.path.join("watchdog", "macsim") + os.sep
EVENTS = ("open", "os.listdir", "os.scandir")


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in EVENTS or not args:
        return
    path = args[0]
    if isinstance(path, bytes):
        path = path.decode(errors="replace")
    if not isinstance(path, str) or not (path == "/proc" or path.startswith("/proc/")):
        return
    frame = sys._getframe(1)
    reader = frame.f_code.co_filename
    stack = []
    while frame is not None:
        name = frame.f_code.co_filename
        if ROOM in name:
            return  # a stand-in reading the live process: allowed
        if name.startswith("<frozen importlib") and os.sep + "watchdog" + os.sep not in reader:
            # A library reading its platform's sources as it is imported (psutil's
            # Linux backend, prometheus_client's default process collector): on a Mac
            # the same import reads the Mac's. The daemon's own reads are what count.
            return
        stack.append(f"{name}:{frame.f_lineno}")
        frame = frame.f_back
    with open(LOG, "a") as out:
        out.write(f"{event} {path} <- {' < '.join(stack[:10])}\n")


sys.addaudithook(_hook)
sys.argv = ["mlx-watchdog", *sys.argv[1:]]
runpy.run_module("watchdog.cli", run_name="__main__", alter_sys=True)
