"""`mlx-watchdog doctor`: check this node's setup and say what to fix.

`run_checks` returns one (level, message) line per finding, level "ok",
"warn" or "fail"; every message that is not "ok" says what to do. A check that
itself breaks is reported as a failure of that check, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import signal
import site
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from importlib import metadata
from typing import Any

from watchdog import __version__, host
from watchdog.daemon import journal
from watchdog.daemon.config import ConfigError, parse_listen
from watchdog.daemon.dirs import UnsafeDirectory, check_record_dir, check_state_dir

Line = tuple[str, str]
OK, WARN, FAIL = "ok", "warn", "fail"
MIN_MLX = (0, 32)
PTH = "mlx_watchdog.pth"
HTTP_TIMEOUT = 2.0


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_about() -> list[Line]:
    return [(OK, f"mlx-watchdog {__version__}, Python {sys.version.split()[0]} "
                 f"({sys.executable}) on {sys.platform}")]


def check_record(record_dir: str) -> list[Line]:
    from watchdog.rank.hook import record_dir as rank_record_dir

    lines: list[Line] = []
    if not os.path.lexists(record_dir):
        lines.append((FAIL, f"record directory {record_dir} does not exist: ranks cannot "
                            "publish their records (they run uninstrumented). The daemon "
                            f"creates it when it starts; or create it: mkdir -m 1777 "
                            f"{record_dir}"))
    else:
        try:
            check_record_dir(record_dir)
        except UnsafeDirectory as err:
            lines.append((FAIL, str(err)))
        except OSError as err:
            lines.append((FAIL, f"record directory {record_dir}: {err.strerror}"))
        else:
            st = os.stat(record_dir)
            lines.append((OK, f"record directory {record_dir}: owner uid {st.st_uid}, mode "
                              f"{st.st_mode & 0o7777:o}"))
            if not os.access(record_dir, os.W_OK | os.X_OK):
                lines.append((WARN, f"this user (uid {os.getuid()}) cannot write in "
                                    f"{record_dir}: its ranks would run uninstrumented; the "
                                    f"directory should be mode 1777 (chmod 1777 {record_dir})"))
    ranks_use = rank_record_dir()
    if os.path.abspath(ranks_use) != os.path.abspath(record_dir):
        source = ("MLX_WATCHDOG_DIR" if os.environ.get("MLX_WATCHDOG_DIR")
                  else "the default, MLX_WATCHDOG_DIR being unset")
        lines.append((WARN, f"ranks started from this environment publish to {ranks_use} "
                            f"({source}), not {record_dir}: a daemon watching {record_dir} "
                            f"will not see them; launch them with MLX_WATCHDOG_DIR={record_dir}"))
    return lines


def check_state(state_dir: str) -> list[Line]:
    if not os.path.lexists(state_dir):
        return [(FAIL, f"state directory {state_dir} does not exist: the daemon creates it "
                       f"when it starts (mlx-watchdog run --state-dir {state_dir}); or "
                       f"create it: mkdir -m 755 {state_dir}")]
    try:
        check_state_dir(state_dir)
    except UnsafeDirectory as err:
        return [(FAIL, str(err))]
    except OSError as err:
        return [(FAIL, f"state directory {state_dir}: {err.strerror}")]
    st = os.stat(state_dir)
    return [(OK, f"state directory {state_dir}: owner uid {st.st_uid}, mode "
                 f"{st.st_mode & 0o7777:o}")]


def check_daemon(listen: str, state_dir: str) -> list[Line]:
    from watchdog.cli.sampling import daemon_status

    try:
        host, port = parse_listen(listen)
    except ConfigError as err:
        return [(FAIL, f"--listen: {err}")]
    if port == 0:
        return [(WARN, f"listen address {listen} has port 0: cannot check the daemon; pass "
                       "the address it really listens on")]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"
    # Loopback is never proxied, whatever http_proxy says.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=HTTP_TIMEOUT) as resp:
            code = resp.status
    except urllib.error.HTTPError as err:
        code = err.code
    except (urllib.error.URLError, OSError) as err:
        why = getattr(err, "reason", err)
        line = (f"no daemon answers at {url} ({why}): start it with `mlx-watchdog run` or "
                "install the service (`mlx-watchdog service install`)")
        snap = daemon_status(state_dir)
        if snap is not None:
            line += (f"; a daemon (pid {snap.get('daemon_pid')}) does publish in {state_dir}: "
                     "it listens elsewhere, pass its --listen")
        return [(WARN, line)]
    if code == 200:
        return [(OK, f"the daemon answers at {url}")]
    if code == 503:
        return [(FAIL, f"the daemon at {url} has not completed a scan recently (healthz "
                       "503): its loop is stuck; read its log and restart it")]
    return [(WARN, f"{url} answered HTTP {code}: is that mlx-watchdog listening there?")]


def check_instrumentation() -> list[Line]:
    lines: list[Line] = []
    try:
        importlib.import_module("watchdog.rank.hook")
    except Exception as err:  # noqa: BLE001 - report any failure to import
        lines.append((FAIL, f"watchdog.rank.hook does not import ({err!r}): "
                            "reinstall mlx-watchdog"))
    else:
        lines.append((OK, "watchdog.rank.hook imports (the rank side of the watchdog)"))
    extra = "'mlx[cpu]'" if host.os_name() == host.LINUX else "mlx"
    try:
        mx: Any = importlib.import_module("mlx.core")
    except Exception as err:  # noqa: BLE001
        lines.append((FAIL, f"mlx.core does not import in {sys.executable} ({err}): "
                            f"pip install {extra}"))
        return lines
    version = str(getattr(mx, "__version__", "unknown"))
    if not hasattr(mx, "distributed"):
        lines.append((FAIL, f"mlx {version} has no mlx.core.distributed: pip install -U "
                            f"{extra}"))
    elif _version_tuple(version) < MIN_MLX:
        lines.append((WARN, f"mlx {version} is older than "
                            f"{'.'.join(map(str, MIN_MLX))}, the version mlx-watchdog is "
                            f"tested with: pip install -U {extra}"))
    else:
        lines.append((OK, f"mlx {version} (mlx.core imports)"))
    return lines


def check_foreign_watchdog() -> list[Line]:
    """The PyPI `watchdog` (filesystem events) shares our import name and folder."""
    lines: list[Line] = []
    fix = ("pip uninstall -y watchdog && pip install --force-reinstall mlx-watchdog (both own "
           "site-packages/watchdog/, so uninstalling one deletes files of the other), or give "
           "mlx-watchdog a virtual environment of its own")
    try:
        dist: Any = metadata.distribution("watchdog")
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        lines.append((FAIL, f"the PyPI package 'watchdog' {dist.version} (filesystem events, "
                            "not this project) is installed here and shares the import name "
                            f"'watchdog': {fix}"))
    package = sys.modules.get("watchdog") or importlib.import_module("watchdog")
    where = os.path.dirname(getattr(package, "__file__", None) or "?")
    if not hasattr(package, "install") or not hasattr(package, "Heartbeat"):
        lines.append((FAIL, f"{where}/__init__.py is not mlx-watchdog's (no install()): "
                            f"another 'watchdog' overwrote it: {fix}"))
    try:
        observers = importlib.util.find_spec("watchdog.observers")
    except (ImportError, ValueError):
        observers = None
    if observers is not None:
        lines.append((FAIL, f"{where}/observers exists: files of the filesystem-events "
                            f"'watchdog' are mixed into this package: {fix}"))
    if not lines:
        lines.append((OK, "no foreign 'watchdog' package (the PyPI filesystem-events "
                          "library) in this environment"))
    return lines


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def check_pth() -> list[Line]:
    shipped = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_pth", PTH)
    try:
        with open(shipped, "rb") as f:
            expected: bytes | None = f.read()
    except OSError:
        expected = None
    found = [os.path.join(d, PTH) for d in _site_dirs() if os.path.isfile(os.path.join(d, PTH))]
    if not found:
        return [(WARN, f"{PTH} is not in this interpreter's site-packages "
                       f"({', '.join(_site_dirs())}): MLX_WATCHDOG=1 does nothing here "
                       "(ranks calling watchdog.install() are unaffected); reinstall: pip "
                       "install --force-reinstall mlx-watchdog")]
    path = found[0]
    if expected is not None:
        try:
            with open(path, "rb") as f:
                if f.read() != expected:
                    return [(WARN, f"{path} differs from this version's hook: reinstall: "
                                   "pip install --force-reinstall mlx-watchdog")]
        except OSError as err:
            return [(WARN, f"{path} is unreadable ({err.strerror})")]
    return [(OK, f"zero-code hook {path} present: MLX_WATCHDOG=1 instruments any process "
                 "of this interpreter that imports mlx.core")]


def check_probes() -> list[Line]:
    from watchdog.daemon.probes import ProbeError, probe

    p = probe()
    try:
        sample = p.sample(os.getpid())
        wired = p.wired_bytes()
    except ProbeError as err:
        return [(FAIL, f"platform probe {p.name} fails: {err}")]
    if sample is None:
        return [(FAIL, f"platform probe {p.name} cannot see this very process")]
    lines: list[Line] = []
    if not sample.threads:
        lines.append((WARN, f"platform probe {p.name} cannot read thread CPU times: a spinning "
                            "wait cannot be told from a quiet one (run the daemon as root)"))
    if wired is None:
        lines.append((WARN, f"platform probe {p.name} has no wired-memory reading: leaks after "
                            "a kill will not be detected"))
    else:
        lines.append((OK, f"platform probes ({p.name}): {len(sample.threads)} thread(s) "
                          f"sampled, wired memory {wired / 2**20:.0f} MiB"))
    return lines


def check_dump_signal() -> list[Line]:
    from watchdog.daemon.enforcer import DUMP_SIGNALS
    from watchdog.rank.hook import dump_signal_from_env

    raw = os.environ.get("MLX_WATCHDOG_DUMP_SIGNAL")
    signum = dump_signal_from_env()
    if raw is not None and raw.strip() not in ("", "0") and signum == 0:
        return [(FAIL, f"MLX_WATCHDOG_DUMP_SIGNAL={raw!r} is not a signal: use SIGUSR2 (the "
                       "default), SIGUSR1, a number, or 0 for no dumps")]
    if signum == 0:
        return [(WARN, "stack dumps are off (MLX_WATCHDOG_DUMP_SIGNAL=0): incidents will hold "
                       "no Python stacks; unset it to use SIGUSR2")]
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum not in DUMP_SIGNALS:
        return [(WARN, f"ranks would dump on {name}, which the daemon never sends (only "
                       "SIGUSR1, SIGUSR2 or a real-time signal): set "
                       "MLX_WATCHDOG_DUMP_SIGNAL=SIGUSR2")]
    source = "MLX_WATCHDOG_DUMP_SIGNAL" if raw else "the default"
    return [(OK, f"ranks dump their Python stacks on {name} ({source}); a program with its own "
                 f"{name} handler gets no dumps (the hook says so on its stderr)")]


def check_evidence_tools() -> list[Line]:
    from watchdog.daemon.probes import probe

    command = probe().stack_command(os.getpid())
    lines: list[Line] = []
    if command is None:
        hint = ("/usr/bin/sample ships with macOS; is PATH complete?"
                if host.os_name() == host.DARWIN else "pip install py-spy, or apt install gdb")
        lines.append((WARN, "no native stack sampler for evidence (py-spy or gdb on Linux, "
                            f"sample on macOS): incidents get only Python stacks; {hint}"))
    else:
        lines.append((OK, f"native stacks for evidence: {os.path.basename(command[0])} "
                          f"({command[0]})"))
        scope = _ptrace_scope()
        if scope is not None and scope >= 3:
            lines.append((WARN, "kernel.yama.ptrace_scope is 3: nobody may attach a debugger, "
                                "native stacks will be empty"))
        elif scope is not None and scope >= 1 and os.geteuid() != 0:
            lines.append((WARN, f"kernel.yama.ptrace_scope is {scope} and the daemon would not "
                                "be root: it cannot attach to ranks for native stacks (the "
                                "service runs as root)"))
    return lines


def _ptrace_scope() -> int | None:
    if host.os_name() != host.LINUX:
        return None  # Yama is Linux's; macOS lets root attach (SIP-protected binaries aside)
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def check_service() -> list[Line]:
    """On a Mac: is the LaunchDaemon loaded and running (`launchctl print`)?"""
    if host.os_name() != host.DARWIN:
        return []  # systemd says it with `systemctl status`; the daemon check covers it
    from watchdog.cli.service import LABEL, ServiceError, default_path
    from watchdog.cli.servicectl import launchd_loaded, service_target

    install = "sudo mlx-watchdog service install --launchd"
    try:
        loaded, text = launchd_loaded()
    except ServiceError as err:
        return [(WARN, f"cannot ask launchd about {LABEL}: {err}")]
    if not loaded:
        where = (f"{default_path('launchd')} exists but is not loaded"
                 if os.path.exists(default_path("launchd")) else "it is not installed")
        return [(WARN, f"the launchd job {service_target()} is not loaded ({where}): nothing "
                       f"restarts the daemon or starts it at boot; run: {install}")]
    fields = dict(re.findall(r"^\t(state|pid|path|last exit code) = (.*)$", text, re.M))
    if fields.get("state") != "running":
        log = host.defaults(host.DARWIN).stderr_log
        state = fields.get("state", "not running")
        return [(FAIL, f"the launchd job {service_target()} is loaded but {state} "
                       f"(last exit code {fields.get('last exit code', '?')}): read {log}")]
    return [(OK, f"launchd job {service_target()} loaded and running (pid "
                 f"{fields.get('pid', '?')}, from {fields.get('path', '?')})")]


def check_reboot_flag(state_dir: str) -> list[Line]:
    if not os.path.isdir(state_dir):
        # No directory, no flag file: but that proves nothing about this node.
        return [(WARN, f"cannot tell whether this node is flagged for reboot: the state "
                       f"directory {state_dir} does not exist")]
    flag = journal.reboot_flag(state_dir)
    if flag is None:
        return [(OK, "no reboot flag: this node is not flagged for reboot")]
    path = os.path.join(state_dir, journal.REBOOT_FLAG)
    return [(FAIL, f"this node is flagged for reboot: {flag.get('reason', 'no reason given')} "
                   f"({path}); reboot it, then run: mlx-watchdog node clear-reboot "
                   f"--state-dir {state_dir}")]


def run_checks(record_dir: str, state_dir: str, listen: str) -> list[Line]:
    checks: list[tuple[str, Callable[[], list[Line]]]] = [
        ("version", check_about),
        ("record directory", lambda: check_record(record_dir)),
        ("state directory", lambda: check_state(state_dir)),
        ("daemon", lambda: check_daemon(listen, state_dir)),
        ("instrumentation", check_instrumentation),
        ("foreign watchdog", check_foreign_watchdog),
        ("zero-code hook", check_pth),
        ("platform probes", check_probes),
        ("dump signal", check_dump_signal),
        ("evidence tools", check_evidence_tools),
        ("service", check_service),
        ("reboot flag", lambda: check_reboot_flag(state_dir)),
    ]
    lines: list[Line] = []
    for name, check in checks:
        try:
            lines.extend(check())
        except Exception as err:  # noqa: BLE001 - one broken check must not hide the rest
            lines.append((FAIL, f"the {name} check itself failed: {err!r}"))
    return lines
