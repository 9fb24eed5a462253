"""The simulated Mac: the macOS path run whole on Linux, each macOS source a stand-in.

A test aid (docs/macos.md). `MLX_WATCHDOG_SIMULATE=macos`, read once by
`watchdog/host.py`, makes the daemon, the CLI and the ranks take their macOS path. The
probes load this room where they choose the platform (`probes.simulation()`), and a
rank's hook its `gpu` alone, only then (so a real Mac never loads it). It imports
nothing of the daemon's, only the contracts below it (`host.py`, `procstat.py`,
`gdbstack.py`), so it stands low (tests/unit/test_rooms.py). It hands over

- the sources the real macOS probe (probes/macos.py) is handed by the probe factory
  (`probes.probe()`): psutil as macOS answers (psutil_mac.py), libproc's structures
  (libproc.py), and the tools it runs by their absolute paths, `/usr/bin/sample`,
  `/usr/sbin/ioreg`, `/usr/bin/powermetrics` and `/usr/bin/pmset` (`tool()`, tools.py:
  each path mapped to its stand-in, nothing looked up on PATH), MLX's compute thread
  standing for the Mac's GPU (gpu.py: the rank labels it, `gpu.label`);
- `kqueue_module()`: kqueue's NOTE_EXIT for the exit watcher (kqueue.py).

Each stand-in reads the live Linux process but hands over only what macOS gives, in
macOS's format, and says where it guesses. Only this room reads /proc: the test
`tests/unit/macsim/test_no_proc.py` holds the daemon's side to it.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from watchdog.macsim import gpu, kqueue, libproc, psutil_mac, tools

__all__ = ["gpu", "kqueue_module", "libproc", "psutil_mac", "tool"]

# The stand-in of each tool the macOS probe runs, by the tool's absolute path there
# (probes/macos.TOOLS).
STAND_INS = {"/usr/bin/sample": "sample", "/usr/sbin/ioreg": "ioreg",
             "/usr/bin/pmset": "pmset", "/usr/bin/powermetrics": "powermetrics"}
# The folder the `watchdog` package was imported from (this room's grandparent): the
# stand-ins import it from there alone.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tool(path: str) -> list[str] | None:
    """The command that runs the stand-in of the macOS tool at `path`
    ("/usr/bin/sample", "/usr/sbin/ioreg", "/usr/bin/powermetrics", "/usr/bin/pmset");
    None for a tool a Mac does not have here.

    The stand-in is this package's own module, whatever the working directory and the
    environment: `-I` (no PYTHON* variable, no user site, neither the working
    directory nor a script's on sys.path), then the package's own folder first on
    sys.path. A daemon root started from a folder another user writes never imports
    that user's `watchdog` (issue 57, item 2)."""
    name = STAND_INS.get(path)
    if name not in tools.TOOLS:
        return None
    code = (f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r}); "
            "from watchdog.macsim.tools import main; sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-I", "-c", code, name]


def kqueue_module() -> ModuleType:
    """select's kqueue as macOS gives it, for the exit watcher."""
    return kqueue
