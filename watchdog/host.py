"""Which OS this is, decided once, and every default that follows from it.

The one place that looks at `sys.platform`: the probes, the exit watcher,
the service kind and the default directories all ask `host.os_name()` or
`host.defaults()`. Tests select the macOS branch by setting `host.OS` (one
seam) instead of patching `sys.platform` everywhere. Rank-side code imports
this module, so it uses the stdlib only.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

DARWIN, LINUX, OTHER = "darwin", "linux", "other"


def detect(platform: str) -> str:
    if platform == "darwin":
        return DARWIN
    if platform.startswith("linux"):
        return LINUX
    return OTHER


OS = detect(sys.platform)


@dataclass(frozen=True)
class Defaults:
    record_dir: str  # where ranks publish (shared, sticky, world-writable)
    state_dir: str  # the journal and the reboot flag (root only)
    service: str  # "launchd" or "systemd"
    stdout_log: str | None  # where the service manager sends stdout (None: the journal)
    stderr_log: str | None


# macOS: /var/run is cleared at boot like Linux's /run, and /var/db is where
# system daemons keep state; launchd has no journal, so logs go to /var/log.
_DEFAULTS = {
    DARWIN: Defaults("/var/run/mlx-watchdog", "/var/db/mlx-watchdog", "launchd",
                     "/var/log/mlx-watchdog.log", "/var/log/mlx-watchdog.err.log"),
    LINUX: Defaults("/run/mlx-watchdog", "/var/lib/mlx-watchdog", "systemd", None, None),
}


def os_name() -> str:
    return OS


def defaults(name: str | None = None) -> Defaults:
    """The defaults of `name` (default: this OS); an unknown OS gets Linux's paths."""
    return _DEFAULTS.get(name or OS, _DEFAULTS[LINUX])


def for_service(kind: str) -> Defaults:
    """The defaults of the OS a service manager belongs to."""
    return _DEFAULTS[DARWIN if kind == "launchd" else LINUX]
