"""macOS: wired memory from the VM statistics; native stacks from `sample`."""

from __future__ import annotations

from typing import Any

import psutil

from watchdog.daemon.probes import Probe, ProbeError, find_tool, samplegraph


class MacProbe(Probe):
    """Thread ids from psutil here are positions in `task_threads` order, main
    first (the inherited `main_thread`), not `threading.get_native_id()` values:
    the record's table of Python threads cannot be matched (see docs/limits.md)."""

    name = "macos"

    def wired_bytes(self) -> int | None:
        try:
            return int(psutil.virtual_memory().wired)  # type: ignore[attr-defined]
        except (OSError, AttributeError) as err:
            raise ProbeError(f"reading wired memory: {err}") from err

    def stack_command(self, pid: int) -> list[str] | None:
        sample = find_tool("sample")
        # `sample PID 1`: one second of samples of every thread, to stdout.
        return [sample, str(pid), "1"] if sample else None

    def hot_frames(self, text: str) -> list[dict[str, Any]] | None:
        return samplegraph.parse(text)
