"""The launchd and systemd service definitions, rendered and installed.

This module owns the text of both service files. The copies in `launchd/` and
`systemd/` are `render()` output for `/usr/local/bin/mlx-watchdog` and the
default paths (a test keeps them equal); `mlx-watchdog service print|install`
renders the same files for the interpreter and paths of the machine at hand.

The daemon gets `--dir`/`--state-dir` only when they differ from the defaults
below, so that a plain install leaves `/etc/mlx-watchdog.toml` in charge.
"""

from __future__ import annotations

import math
import os
import plistlib
import re
import sysconfig
import tempfile

from watchdog import host

KINDS = ("launchd", "systemd")
LABEL = "com.github.mlx-watchdog"
UNIT = "mlx-watchdog.service"
SCRIPT = "mlx-watchdog"
DEFAULT_CONFIG = "/etc/mlx-watchdog.toml"
DEFAULT_RECORD_DIR = {kind: host.for_service(kind).record_dir for kind in KINDS}
DEFAULT_STATE_DIR = {kind: host.for_service(kind).state_dir for kind in KINDS}
_DEFAULT_PATH = {
    "launchd": f"/Library/LaunchDaemons/{LABEL}.plist",
    "systemd": f"/etc/systemd/system/{UNIT}",
}
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._+@,:/-]*")


class ServiceError(Exception):
    """A service file cannot be rendered or written; the message says why."""


def default_path(kind: str) -> str:
    """Where the service manager looks for our file."""
    return _DEFAULT_PATH[checked_kind(kind)]


def script_path() -> str:
    """The `mlx-watchdog` console script installed with this interpreter.

    Looked up in the interpreter's own scripts directory (a venv's `bin/`)
    rather than on $PATH, which may hold a shim that needs a login shell.
    """
    schemes = (sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user"))
    for scheme in schemes:
        path = os.path.join(sysconfig.get_path("scripts", scheme), SCRIPT)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise ServiceError(f"no {SCRIPT} script next to this interpreter; is the package installed?")


def under_private_tmp(path: str) -> str | None:
    """The temporary directory `path` lies under, which the systemd unit's PrivateTmp
    replaces with an empty one for the service; None when it lies elsewhere."""
    real = os.path.realpath(path)
    for tmp in dict.fromkeys(("/tmp", "/var/tmp", tempfile.gettempdir())):
        base = os.path.realpath(tmp)
        if real == base or real.startswith(base.rstrip("/") + "/"):
            return tmp
    return None


def render(
    kind: str, *, executable: str, config: str | None, record_dir: str, state_dir: str
) -> str:
    """The service file for `kind` ("launchd" or "systemd") as text."""
    kind = checked_kind(kind)
    # The service starts in "/", where a relative path means nothing useful.
    if not os.path.isabs(executable):
        raise ServiceError(f"the service executable must be an absolute path: {executable!r}")
    if config is not None and not os.path.isabs(config):
        raise ServiceError(f"the config file must be an absolute path: {config!r}")
    record_dir = _absolute_dir(kind, "record", record_dir)
    state_dir = _absolute_dir(kind, "state", state_dir)
    argv = [executable, "run"]
    if config is not None:
        argv += ["--config", config]
    if record_dir != DEFAULT_RECORD_DIR[kind]:
        argv += ["--dir", record_dir]
    if state_dir != DEFAULT_STATE_DIR[kind]:
        argv += ["--state-dir", state_dir]
    if kind == "launchd":
        return _launchd(argv)
    return _systemd(argv, record_dir, state_dir)


def install(
    kind: str,
    path: str | None = None,
    *,
    executable: str,
    config: str | None,
    record_dir: str,
    state_dir: str,
) -> str:
    """Write the rendered file to `path` (default: `default_path(kind)`) atomically.

    The file appears whole or not at all, mode 0644, and its path is returned.
    Loading it (`launchctl bootstrap`, `systemctl enable`) is left to the caller.
    """
    text = render(
        kind, executable=executable, config=config, record_dir=record_dir, state_dir=state_dir
    )
    target = path if path is not None else default_path(kind)
    directory = os.path.dirname(os.path.abspath(target))
    tmp_path: str | None = None
    try:
        fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.")
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            # launchd refuses a plist that is group- or world-writable.
            os.fchmod(tmp.fileno(), 0o644)
            os.fsync(tmp.fileno())
        os.replace(tmp_path, target)
        tmp_path = None
    except PermissionError as err:
        raise ServiceError(f"not permitted to write {target}: run this as root") from err
    except OSError as err:
        raise ServiceError(f"cannot write {target}: {err.strerror or err}") from err
    finally:
        if tmp_path is not None:
            _remove_quietly(tmp_path)
    return target


def shutdown_seconds() -> int:
    """How long the daemon may take to exit on SIGTERM, at the default settings.

    The loop stops at once, but an escalation already under way is stepped to
    its end first: one peer call, evidence, SIGTERM grace, SIGKILL confirmation,
    wired-memory settle.
    A service manager that SIGKILLs the daemon sooner can cut a ladder short.
    """
    from watchdog.daemon.config import Settings

    s = Settings()
    return math.ceil(s.interval + s.ladder().ladder_span())


def checked_kind(kind: str) -> str:
    """`kind` when it is a known service kind, else a `ServiceError`."""
    if kind not in KINDS:
        raise ServiceError(f"unknown service kind {kind!r}: expected 'launchd' or 'systemd'")
    return kind


def _absolute_dir(kind: str, name: str, path: str) -> str:
    normal = os.path.normpath(path)
    plain = normal not in ("/", "/run", "/var/lib") and _PLAIN_PATH.fullmatch(normal)
    # launchd takes any path (plistlib escapes it); unit directory settings
    # are written unquoted, so those must need no quoting.
    if not os.path.isabs(normal) or (kind == "systemd" and not plain):
        raise ServiceError(f"unsupported {name} directory {path!r}: use a plain absolute path")
    return normal


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        # The write already failed and is being reported; a stray temp file
        # (dot-prefixed, next to the target) is the lesser problem.
        return


_PLIST_NOTES = {
    "Label": (
        "A LaunchDaemon, so it runs as root: ending and tracing other users'\n"
        "\t     ranks need it (it never reboots: it flags the node).\n"
        "\t     Load with: launchctl bootstrap system <this file>\n"
        "\t     No SoftResourceLimits/HardResourceLimits: on a system daemon a\n"
        "\t     NumberOfFiles limit changes kern.maxfiles for the whole machine;\n"
        "\t     the daemon raises its own soft open-files limit at start instead."
    ),
    "ExitTimeOut": (
        "Seconds from SIGTERM to SIGKILL: at least the daemon's own shutdown\n"
        "\t     time, since an escalation under way (evidence, grace, kill, settle)\n"
        "\t     runs to its end. Raise it if you raise those settings."
    ),
    "ProcessType": (
        "Interactive, not Standard: with Standard (or no ProcessType) launchd\n"
        "\t     throttles the job's CPU and I/O, and the watchdog must keep its\n"
        "\t     deadlines while hung ranks spin every core. It sleeps between scans."
    ),
}


def _launchd(argv: list[str]) -> str:
    logs = host.for_service("launchd")
    job = {
        "Label": LABEL,
        "ProgramArguments": argv,
        "RunAtLoad": True,
        "KeepAlive": True,
        "ThrottleInterval": 10,
        "ExitTimeOut": shutdown_seconds() + 10,
        "ProcessType": "Interactive",
        "StandardOutPath": logs.stdout_log,
        "StandardErrorPath": logs.stderr_log,
    }
    text = plistlib.dumps(job, sort_keys=False).decode("utf-8")
    # plistlib cannot write comments; they go in front of the key they explain.
    for key, note in _PLIST_NOTES.items():
        text = text.replace(f"\t<key>{key}</key>", f"\t<!-- {note} -->\n\t<key>{key}</key>", 1)
    return text


def _systemd_quote(arg: str, *, program: bool = False) -> str:
    """One ExecStart= word: specifiers and `$` expansion escaped, quoted if needed."""
    if any(ord(char) < 0x20 or char == "\x7f" for char in arg):
        raise ServiceError(f"control character in service argument {arg!r}")
    if program and re.search(r"[\"'\\]", arg):
        # systemd quotes such a path correctly, then refuses to run it.
        raise ServiceError(f"systemd refuses a program path with quotes or backslashes: {arg!r}")
    word = arg.replace("%", "%%")
    if not program:
        # systemd expands $VAR in arguments only; the program path is literal.
        word = word.replace("$", "$$")
    if word and not re.search(r"[\s\"'\\;]", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _systemd(argv: list[str], record_dir: str, state_dir: str) -> str:
    directories = []
    writable = []
    if record_dir.startswith("/run/"):
        directories += [
            "# The record directory is sticky and world-writable like /tmp: ranks of",
            "# any user publish there but cannot touch each other's records. It is",
            "# kept when the daemon stops, since live ranks still hold their records.",
            f"RuntimeDirectory={record_dir.removeprefix('/run/')}",
            "RuntimeDirectoryMode=1777",
            "RuntimeDirectoryPreserve=yes",
        ]
    else:
        writable.append(record_dir)
    if state_dir.startswith("/var/lib/"):
        directories.append(f"StateDirectory={state_dir.removeprefix('/var/lib/')}")
    else:
        writable.append(state_dir)
    if writable:
        directories += [
            "# Outside /run and /var/lib: these must exist before the service starts.",
            "ReadWritePaths=" + " ".join(writable),
        ]
    return _UNIT_TEMPLATE.format(
        exec_start=" ".join(
            [_systemd_quote(argv[0], program=True)] + [_systemd_quote(arg) for arg in argv[1:]]
        ),
        directories="\n".join(directories),
    )


_UNIT_TEMPLATE = """\
# mlx-watchdog: ends MLX distributed ranks hung in a collective.
# Rendered by watchdog/cli/service/unit.py; `mlx-watchdog service install --systemd`
# writes it for this machine's interpreter and paths.

[Unit]
Description=mlx-watchdog: ends MLX distributed ranks hung in a collective
# A watchdog has to come back however often it fails: no start rate limit.
StartLimitIntervalSec=0

[Service]
# The daemon sends READY=1 when up and WATCHDOG=1 after each completed scan
# (watchdog/net/notify.py), so a wedged scan loop is restarted by systemd.
Type=notify
NotifyAccess=main
WatchdogSec=30
ExecStart={exec_start}
# SIGHUP reloads the config file (mode, deadlines, peers, secret): systemctl reload
ExecReload=/bin/kill -HUP $MAINPID
Restart=always
RestartSec=2
# Descriptors: one pidfd per watched rank, the HTTP clients, the probes.
# The daemon also raises its soft limit itself (to 65536 at most);
# this sets the hard one it may raise to.
LimitNOFILE=65536

{directories}

# Hardening that leaves the daemon able to see, signal and trace the ranks of
# every user: /proc stays whole (no ProtectProc=invisible, ProcSubset=pid or
# PrivatePIDs), and of root's capabilities only these remain:
#   CAP_KILL             SIGCONT/SIGTERM/SIGKILL to other users' ranks
#   CAP_SYS_PTRACE       py-spy/gdb evidence, other users' /proc/<pid> files
#   CAP_DAC_READ_SEARCH  read records and stack dumps whatever their mode
CapabilityBoundingSet=CAP_KILL CAP_SYS_PTRACE CAP_DAC_READ_SEARCH
NoNewPrivileges=yes
ProtectSystem=strict
# Read-only rather than hidden: ranks' interpreters and venvs often live in
# /home, and the evidence tools read them.
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native
# @debug adds ptrace for py-spy and gdb (process_vm_readv is in @system-service).
SystemCallFilter=@system-service @debug
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
"""


def write_default_config(path: str) -> bool:
    """Write the config file with every key at its default, unless one is there.

    0600: the file may later hold the fence secret. Returns whether it wrote.
    """
    from watchdog.daemon.config import default_toml

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(default_toml())
    return True
