"""Which OS this is, decided once, and every default that follows from it.

The one place that looks at `sys.platform`: the probes, the exit watcher,
the service kind and the default directories all ask `host.os_name()` or
`host.defaults()`. Tests select the macOS branch by setting `host.OS` (one
seam) instead of patching `sys.platform` everywhere. Rank-side code imports
this module, so it uses the stdlib only.

`MLX_WATCHDOG_SIMULATE=macos` (read once, here) is a test aid: on Linux the daemon,
the CLI and the ranks then take their macOS path whole, every macOS source replaced
by a stand-in of `watchdog/macsim/` (loaded where the platform is chosen,
`probes.simulation()`, and by a rank's hook for its GPU's label, only then and after
`check_simulation()`; this module imports none of it), and every default path put
under `MLX_WATCHDOG_SIMULATE_ROOT` (default /tmp/mlx-watchdog-macsim).
`platform_label()` says "macos (simulated)" so no one mistakes such a run for a real
one (docs/macos.md).

As root the simulation runs only in a test root it owns (`simulation_refused`): its
root and the folder the package is imported from, each with every folder above it,
owned by root and writable by no one else (or sticky, as /tmp): the stand-ins run as
processes of their own, and no other user may put code or files where they come from.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace

DARWIN, LINUX, OTHER = "darwin", "linux", "other"


def detect(platform: str) -> str:
    """The OS a `sys.platform` value names: DARWIN, LINUX or OTHER."""
    if platform == "darwin":
        return DARWIN
    if platform.startswith("linux"):
        return LINUX
    return OTHER


# Where a tool the daemon runs as root is looked for (gdb, py-spy; the simulated Mac's
# gdb): the system's folders and the one its own Python is in (a venv's py-spy), never
# the caller's PATH: a root daemon started by hand from a shell whose PATH leads through
# a user's folder runs no `gdb` of theirs (issue 57). A Mac's own tools are run by their
# absolute paths (probes/macos.TOOLS).
TOOL_PATH = os.pathsep.join(["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin",
                             "/sbin", "/bin", os.path.dirname(sys.executable)])

SIMULATE_VARIABLE = "MLX_WATCHDOG_SIMULATE"
SIMULATE_ROOT_VARIABLE = "MLX_WATCHDOG_SIMULATE_ROOT"
SIMULATED_ROOT = "/tmp/mlx-watchdog-macsim"


def simulating(environ: dict[str, str] | os._Environ[str], platform: str) -> bool:
    """True when `environ` asks for the simulated Mac on a Linux host (the only host it
    runs on: a real Mac is never simulated)."""
    return environ.get(SIMULATE_VARIABLE, "") == "macos" and detect(platform) == LINUX


SIMULATED = simulating(os.environ, sys.platform)
OS = DARWIN if SIMULATED else detect(sys.platform)


@dataclass(frozen=True)
class Defaults:
    """This OS's defaults: the record and state directories, the service manager and
    where it sends the daemon's output."""
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
    """This OS: DARWIN (the simulated Mac too), LINUX or OTHER."""
    return OS


def simulated() -> bool:
    """True when this is the simulated Mac (see the module's docstring)."""
    return SIMULATED and OS == DARWIN


def platform_label() -> str:
    """The platform as the start line, /status and doctor name it."""
    name = {DARWIN: "macos", LINUX: "linux"}.get(OS, "other")
    return f"{name} (simulated)" if simulated() else name


class SimulationRefused(RuntimeError):
    """The simulation asked for as root outside a test root it owns."""


def _unsafe(path: str) -> str | None:
    """Why `path` (its nearest folder that exists, and each above it) is not root's
    alone: owned by another uid, or writable by group or others without the sticky bit
    (another user could rename a folder there, or plant one). None: root's alone."""
    import stat

    path = os.path.abspath(path)
    while not os.path.lexists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)  # what root creates under it is root's
    while True:
        try:
            st = os.lstat(path)
        except OSError as err:
            return f"{path}: {err.strerror}"
        if stat.S_ISLNK(st.st_mode):
            return f"{path} is a symbolic link"
        if st.st_uid != 0:
            return f"{path} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & 0o1000):
            return f"{path} is writable by others"
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def simulation_refused(euid: int | None = None) -> str | None:
    """Why the simulation may not run here (None: it may). As root (`euid` 0) it runs
    only in a test root it owns: its root (MLX_WATCHDOG_SIMULATE_ROOT) and the folder
    this package is imported from, and every folder above each, root's alone
    (`_unsafe`). A user's simulation is that user's business."""
    if (os.geteuid() if euid is None else euid) != 0:
        return None
    root = os.environ.get(SIMULATE_ROOT_VARIABLE) or SIMULATED_ROOT
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for what, path in (("its root", root), ("the package's folder", package)):
        why = _unsafe(path)
        if why:
            return (f"the simulated Mac ({SIMULATE_VARIABLE}=macos) refuses to run as root "
                    f"outside a test root it owns: {what} {path}: {why}")
    return None


def check_simulation() -> None:
    """Raise SimulationRefused when the simulated Mac may not run here
    (`simulation_refused`): whoever loads its stand-ins (the probes' choice of
    platform, a rank's hook) calls this first, and only when `simulated()`."""
    refused = simulation_refused()
    if refused:
        raise SimulationRefused(refused)


def _rooted(defaults: Defaults) -> Defaults:
    """The macOS defaults moved under the simulation's root."""
    root = os.environ.get(SIMULATE_ROOT_VARIABLE) or SIMULATED_ROOT

    def under(path: str | None) -> str | None:
        return None if path is None else root.rstrip("/") + path

    return replace(defaults, record_dir=under(defaults.record_dir) or "",
                   state_dir=under(defaults.state_dir) or "",
                   stdout_log=under(defaults.stdout_log), stderr_log=under(defaults.stderr_log))


def defaults(name: str | None = None) -> Defaults:
    """The defaults of `name` (default: this OS); an unknown OS gets Linux's paths."""
    chosen = _DEFAULTS.get(name or OS, _DEFAULTS[LINUX])
    return _rooted(chosen) if chosen.service == "launchd" and simulated() else chosen


def for_service(kind: str) -> Defaults:
    """The defaults of the OS a service manager belongs to."""
    return defaults(DARWIN if kind == "launchd" else LINUX)
