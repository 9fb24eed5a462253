"""How the daemon and the CLI see processes and the machine: one seam per OS.

`probe()` picks the platform once (the simulated Mac's stand-ins included:
`simulation()`). Everything returns plain data; psutil's errors become `ProcessGone` or
`ProbeError` here, so callers handle two cases. What every probe offers is in base.py,
re-exported here; the platforms' probes (linux.py, macos.py) import base.py, never this
face, so the choice below imports them and nothing imports it back.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import psutil

from watchdog import host
from watchdog.daemon.probes.base import (
    UNINTERRUPTIBLE,
    Probe,
    ProbeError,
    ProcessSample,
    find_tool,
    same_process,
    stack_tool_output,
)

__all__ = ["UNINTERRUPTIBLE", "Probe", "ProbeError", "ProcessSample", "find_tool",
           "platform_psutil", "probe", "same_process", "simulation", "stack_tool_output"]


def simulation() -> ModuleType:
    """The simulated Mac's stand-ins (watchdog/macsim), chosen here with the platform:
    only when `host.simulated()`, and never as root outside a test root it owns
    (host.SimulationRefused)."""
    host.check_simulation()
    from watchdog import macsim

    return macsim


def platform_psutil() -> Any:
    """psutil as this platform answers: on the simulated Mac, its stand-in (for the
    few readers outside the probe: the data-link prober, the attempt reader)."""
    if host.simulated():
        return simulation().psutil_mac
    return psutil


def probe() -> Probe:
    """The probe for this platform (on the simulated Mac, the macOS probe handed the
    stand-ins of its sources: `simulation()`)."""
    if host.simulated():  # the real macOS probe, handed the stand-ins of its sources
        from watchdog.daemon.probes.macos import MacProbe

        sim = simulation()
        lib = sim.libproc.LibProc()
        return MacProbe(ps=sim.psutil_mac, libproc=lib, tool=sim.tool,
                        timebase=lib.mach_timebase_info)
    if host.os_name() == host.DARWIN:
        from watchdog.daemon.probes.macos import MacProbe

        return MacProbe()
    if host.os_name() == host.LINUX:
        from watchdog.daemon.probes.linux import LinuxProbe

        return LinuxProbe()
    return Probe()
