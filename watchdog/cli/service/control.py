"""Driving the service manager: launchctl and systemctl, as root, time-boxed.

`service install` loads what `service.py` rendered, `service uninstall` and
`service restart` undo and restart it; `doctor` asks launchd whether the job
is loaded. Every command line is built here, so a test checks them against
the managers' documented syntax.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time

from watchdog.cli.service.unit import (
    LABEL,
    ServiceError,
    checked_kind,
    default_path,
    shutdown_seconds,
)


def service_target() -> str:
    """launchctl's name for our job in the system domain."""
    return f"system/{LABEL}"


def activation_commands(kind: str, path: str) -> list[list[str]]:
    """The commands (as root) that load an installed file and start the daemon.

    launchd: `enable` clears a `launchctl disable` left from before (a
    disabled job is refused by bootstrap), `bootstrap system <plist>` loads it
    and RunAtLoad starts it. A job already loaded is booted out first (see
    `load`), since bootstrap refuses a label that is loaded.
    """
    if checked_kind(kind) == "launchd":
        return [["launchctl", "enable", service_target()],
                ["launchctl", "bootstrap", "system", path]]
    return [["systemctl", "daemon-reload"],
            ["systemctl", "enable", "--now", os.path.basename(path)]]


def deactivation_commands(kind: str, path: str) -> list[list[str]]:
    """The commands that stop the daemon and unload its file (before removing it)."""
    if checked_kind(kind) == "launchd":
        return [["launchctl", "bootout", service_target()]]
    return [["systemctl", "disable", "--now", os.path.basename(path)]]


def restart_command(kind: str, path: str) -> list[str]:
    """The command that restarts the installed service of `kind`."""
    if checked_kind(kind) == "launchd":
        return ["launchctl", "kickstart", "-k", service_target()]
    return ["systemctl", "restart", os.path.basename(path)]


def shell_line(argv: list[str]) -> str:
    """`argv` as one line a shell would run unchanged."""
    return " ".join(shlex.quote(arg) for arg in argv)


COMMAND_TIMEOUT = 60.0  # seconds for one launchctl/systemctl call


class ManagerUnreachable(ServiceError):
    """systemctl ran but could not reach systemd: a container, or WSL without systemd."""


# What systemctl says where no systemd runs as init (containers, WSL without systemd).
_NO_SYSTEMD = ("Failed to connect to bus", "System has not been booted with systemd")

NO_SYSTEMD_HINT = ("systemctl cannot reach systemd on this machine (a container, or WSL "
                   "without systemd). Install with --no-load and start the daemon another "
                   "way (`mlx-watchdog run --config FILE` under your supervisor), or enable "
                   "systemd first (WSL: `systemd=true` under [boot] in /etc/wsl.conf)")


def run_command(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one launchctl/systemctl command; a failure is a ServiceError saying what it said."""
    program = shutil.which(argv[0])
    if program is None:
        raise ServiceError(f"{argv[0]} is not on PATH: run by hand: {shell_line(argv)}")
    try:
        done = subprocess.run([program, *argv[1:]], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=COMMAND_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise ServiceError(f"{shell_line(argv)} did not finish in {COMMAND_TIMEOUT:g}s") from None
    except OSError as err:
        raise ServiceError(f"cannot run {argv[0]}: {err.strerror or err}") from None
    if check and done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        if argv[0] == "systemctl" and any(m in done.stderr for m in _NO_SYSTEMD):
            raise ManagerUnreachable(f"{shell_line(argv)} failed: {NO_SYSTEMD_HINT}")
        raise ServiceError(f"{shell_line(argv)} failed (exit {done.returncode}): "
                           f"{said[-1] if said else 'no message'}")
    return done


def launchd_loaded() -> tuple[bool, str]:
    """Is our job loaded in the system domain? With `launchctl print`'s text."""
    done = run_command(["launchctl", "print", service_target()], check=False)
    return done.returncode == 0, done.stdout if done.returncode == 0 else done.stderr


def load(kind: str, path: str) -> list[list[str]]:
    """Load an installed file and start the daemon; the commands run, in order."""
    ran: list[list[str]] = []
    if kind == "launchd" and launchd_loaded()[0]:
        ran.append(_unload_launchd())
    for argv in activation_commands(kind, path):
        run_command(argv)
        ran.append(argv)
    return ran


def _unload_launchd() -> list[str]:
    argv = deactivation_commands("launchd", "")[0]
    run_command(argv)
    # bootout can return before the job has exited (up to its ExitTimeOut);
    # bootstrap would then fail with "5: Input/output error", so wait it out.
    waited = 0.0
    limit = shutdown_seconds() + 10
    while launchd_loaded()[0]:
        if waited >= limit:
            raise ServiceError(f"{service_target()} was still exiting {limit}s after bootout; "
                               "run the install again once `launchctl print` no longer lists it")
        time.sleep(0.5)
        waited += 0.5
    return argv


def uninstall(kind: str, path: str | None = None
              ) -> tuple[list[list[str]], bool, list[str]]:
    """Stop and unload the service, then delete its file.

    Returns the commands run, whether a file was removed, and what systemctl said
    when it failed: the file is removed whatever systemctl says (where it cannot
    reach systemd, nothing runs the unit anyway). Not loaded, or no file, is not
    an error: uninstalling twice is fine.
    """
    target = path if path is not None else default_path(kind)
    ran: list[list[str]] = []
    failed: list[str] = []
    if kind == "launchd":
        if launchd_loaded()[0]:
            ran.append(_unload_launchd())
    elif os.path.exists(target):
        argv = deactivation_commands(kind, target)[0]
        try:
            run_command(argv)
            ran.append(argv)
        except ServiceError as err:
            failed.append(str(err))
    try:
        os.unlink(target)
        removed = True
    except FileNotFoundError:
        removed = False
    except PermissionError as err:
        raise ServiceError(f"not permitted to remove {target}: run this as root") from err
    except OSError as err:
        raise ServiceError(f"cannot remove {target}: {err.strerror or err}") from err
    if kind == "systemd" and removed and not any(NO_SYSTEMD_HINT in f for f in failed):
        argv = ["systemctl", "daemon-reload"]
        try:
            run_command(argv)
            ran.append(argv)
        except ServiceError as err:
            failed.append(str(err))
    return ran, removed, failed
