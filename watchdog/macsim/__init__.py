"""The simulated Mac: the macOS path run whole on Linux, each macOS source a stand-in.

A test aid (docs/macos.md). `MLX_WATCHDOG_SIMULATE=macos`, read once by
`watchdog/host.py`, makes the daemon, the CLI and the ranks take their macOS path:
host.py imports this room (nothing else does, so a real Mac never loads it) for

- the sources the real macOS probe (probes/macos.py) is handed by the probe factory
  (`probes.probe()`): psutil as macOS answers (psutil_mac.py), libproc's structures
  (libproc.py), and the tools it runs by path, `sample`, `ioreg`, `powermetrics` and
  `pmset` (`tool()`, tools.py), MLX's compute thread standing for the Mac's GPU
  (gpu.py: the rank labels it, `gpu.label`);
- `kqueue_module()`: kqueue's NOTE_EXIT for the exit watcher (kqueue.py).

Each stand-in reads the live Linux process but hands over only what macOS gives, in
macOS's format, and says where it guesses. Only this room reads /proc: the test
`tests/unit/macsim/test_no_proc.py` holds the daemon's side to it.
"""

from __future__ import annotations

import sys
from types import ModuleType

from watchdog.macsim import gpu, kqueue, libproc, psutil_mac

__all__ = ["gpu", "kqueue_module", "libproc", "psutil_mac", "tool"]


def tool(name: str) -> list[str] | None:
    """The command that runs the stand-in for a macOS tool ("sample", "ioreg",
    "powermetrics", "pmset"); None for a tool a Mac does not have here."""
    from watchdog.macsim.tools import TOOLS  # not at import: `-m ...tools` runs it

    if name not in TOOLS:
        return None
    return [sys.executable, "-m", "watchdog.macsim.tools", name]


def kqueue_module() -> ModuleType:
    """select's kqueue as macOS gives it, for the exit watcher."""
    return kqueue
