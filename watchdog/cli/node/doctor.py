"""`mlx-watchdog doctor`: check this node's setup and say what to fix.

`run_checks` returns one (level, message) line per finding, level "ok",
"warn" or "fail"; every message that is not "ok" says what to do. A check that
itself breaks is reported as a failure of that check, never a traceback.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

from watchdog import __version__, host
from watchdog.cli.node.doctor_env import (
    FAIL,
    OK,
    WARN,
    Line,
    check_dump_signal,
    check_evidence_tools,
    check_foreign_watchdog,
    check_instrumentation,
    check_pth,
)
from watchdog.cli.node.doctor_fleet import check_config, check_peers, check_watches
from watchdog.daemon.config import ConfigError, Settings, parse_listen
from watchdog.daemon.store import journal
from watchdog.daemon.store.dirs import UnsafeDirectory, check_record_dir, check_state_dir
from watchdog.status import ABSENT

HTTP_TIMEOUT = 2.0


def check_about() -> list[Line]:
    """One line naming this mlx-watchdog, its Python and the platform."""
    return [(OK, f"mlx-watchdog {__version__}, Python {sys.version.split()[0]} "
                 f"({sys.executable}) on {sys.platform}, platform {host.platform_label()}")]


def check_record(record_dir: str) -> list[Line]:
    """The record directory: present, safe, and the one the ranks here would use."""
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
    """The state directory: present, safe and writable."""
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
    lines: list[Line] = [(OK, f"state directory {state_dir}: owner uid {st.st_uid}, mode "
                              f"{st.st_mode & 0o7777:o}")]
    if not os.access(state_dir, os.W_OK | os.X_OK):
        from watchdog.daemon.store.snapshot import daemon_status

        snap = daemon_status(state_dir)
        if snap is None:  # nobody keeps it: the daemon would be this user, and refuse
            lines.append((FAIL, f"this user (uid {os.geteuid()}) cannot write in {state_dir} "
                                "and no daemon publishes there: `mlx-watchdog run` as this "
                                "user would refuse to start; run it as root (the service), "
                                "or pass --state-dir a directory this user owns"))
    return lines


def daemon_expected(config_path: str | None) -> str | None:
    """Why this node is meant to run a daemon (its config file, or an installed
    service), or None: a daemon that does not answer then fails `doctor`."""
    from watchdog.cli.service.unit import default_path

    kind = "launchd" if host.os_name() == host.DARWIN else "systemd"
    if os.path.exists(default_path(kind)):
        return f"the {kind} service is installed ({default_path(kind)})"
    if config_path is not None and os.path.isfile(config_path):
        return f"this node has a config file ({config_path})"
    return None


def _start_hint(expected: str | None) -> str:
    if expected is None:
        return ("start it with `mlx-watchdog run` or install the service "
                "(`mlx-watchdog service install`)")
    if host.os_name() == host.DARWIN:
        return ("start it: sudo launchctl kickstart -k system/com.github.mlx-watchdog "
                f"(its log: {host.defaults(host.DARWIN).stderr_log})")
    if "service is installed" in expected:
        return ("start it: sudo systemctl restart mlx-watchdog; why it stopped: "
                "journalctl -u mlx-watchdog -n 50")
    return ("start it: sudo mlx-watchdog service install (or `mlx-watchdog run --config "
            "...` under your own supervisor)")


def check_daemon(listen: str, state_dir: str, expected: str | None = None) -> list[Line]:
    """The daemon answers on `listen`. None answering is a failure when the node is
    meant to run one (`expected`, from `daemon_expected`), a warning otherwise."""
    from watchdog.daemon.store.snapshot import daemon_status

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
        line = f"no daemon answers at {url} ({why})"
        if expected is not None:
            line += f", yet {expected}: this node's ranks are not watched"
        line += f": {_start_hint(expected)}"
        snap = daemon_status(state_dir)
        if snap is not None:
            line += (f"; a daemon (pid {snap.daemon_pid}) does publish in {state_dir}: "
                     "it listens elsewhere, pass its --listen")
        return [(WARN if expected is None or snap is not None else FAIL, line)]
    if code == 200:
        return [(OK, f"the daemon answers at {url}"), *check_versions(state_dir)]
    if code == 503:
        return [(FAIL, f"the daemon at {url} has not completed a scan recently (healthz "
                       "503): its loop is stuck; read its log and restart it")]
    return [(WARN, f"{url} answered HTTP {code}: is that mlx-watchdog listening there?")]


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def check_versions(state_dir: str) -> list[Line]:
    """This environment's hook (what its ranks load) against the daemon's version.

    Run `doctor` in a job's environment: a hook older than the daemon is read
    (the daemon reads every older record version), a newer one may write a
    record the daemon cannot read: daemons are upgraded first."""
    from watchdog.daemon.store.snapshot import daemon_status

    snap = daemon_status(state_dir)
    if snap is None or not snap.version:
        return []
    if snap.version == __version__:
        return [(OK, f"this environment's mlx-watchdog {__version__} (the hook its ranks "
                     f"load) is the daemon's (pid {snap.daemon_pid})")]
    if _version_key(__version__) > _version_key(snap.version):
        return [(FAIL, f"this environment's mlx-watchdog {__version__} (the hook its ranks "
                       f"load) is newer than the daemon's {snap.version}: the daemon may not "
                       "read its ranks' records; upgrade the daemons first (docs/cluster.md, "
                       "Rolling upgrade)")]
    return [(WARN, f"this environment's mlx-watchdog {__version__} (the hook its ranks "
                   f"load) is older than the daemon's {snap.version}: its ranks are watched "
                   f"(the daemon reads older records); upgrade this environment between "
                   "jobs")]


def check_probes() -> list[Line]:
    """The platform probe: can it sample this process and read wired memory."""
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
                            "wait cannot be told from a quiet one (run the daemon as root)"
                            + (f": {sample.threads_error}" if sample.threads_error else "")))
    elif host.os_name() == host.DARWIN:
        how = ("libproc (thread ids as threading.get_native_id() gives them)"
               if sample.native_ids else "psutil only (thread ids are positions: libproc "
               "refused)")
        lines.append((OK if sample.native_ids else WARN, f"threads read through {how}"))
    if wired is None:
        lines.append((WARN, f"platform probe {p.name} has no wired-memory reading: leaks after "
                            "a kill will not be detected"))
    else:
        lines.append((OK, f"platform probes ({p.name}): {len(sample.threads)} thread(s) "
                          f"sampled, wired memory {wired / 2**20:.0f} MiB"))
    return lines


def check_service() -> list[Line]:
    """On a Mac: is the LaunchDaemon loaded and running (`launchctl print`)?"""
    if host.os_name() != host.DARWIN:
        return []  # systemd says it with `systemctl status`; the daemon check covers it
    from watchdog.cli.service.control import launchd_loaded, service_target
    from watchdog.cli.service.unit import LABEL, ServiceError, default_path

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
        code = fields.get("last exit code")
        return [(FAIL, f"the launchd job {service_target()} is loaded but {state}"
                       + (f" (last exit code {code})" if code else "") + f": read {log}")]
    said = ", ".join(f"{key} {fields[key]}" for key in ("pid", "path") if fields.get(key))
    return [(OK, f"launchd job {service_target()} loaded and running"
                 + (f" ({said.replace('path ', 'from ')})" if said else ""))]


def check_reboot_flag(state_dir: str) -> list[Line]:
    """Whether this node is flagged for reboot, and why."""
    if not os.path.isdir(state_dir):
        # No directory, no flag file: but that proves nothing about this node.
        return [(WARN, f"cannot tell whether this node is flagged for reboot: the state "
                       f"directory {state_dir} does not exist")]
    flag = journal.reboot_flag(state_dir)
    if flag is None:
        return [(OK, "no reboot flag: this node is not flagged for reboot")]
    path = os.path.join(state_dir, journal.REBOOT_FLAG)
    said = "no reason given" if flag.reason is ABSENT else flag.reason
    return [(FAIL, f"this node is flagged for reboot: {said} "
                   f"({path}); reboot it, then run: mlx-watchdog node clear-reboot "
                   f"--state-dir {state_dir}")]


def run_checks(record_dir: str, state_dir: str, listen: str,
               config_path: str | None = None, settings: Settings | None = None) -> list[Line]:
    """Every check of `doctor`, as (level, message) lines."""
    return [(level, message) for _, level, message in
            named_checks(record_dir, state_dir, listen, config_path, settings)]


def named_checks(record_dir: str, state_dir: str, listen: str,
                 config_path: str | None = None,
                 settings: Settings | None = None,
                 config_errors: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """Every check's lines, each with the check's name: (check, level, message).
    `settings` are the node's (its config file `config_path`): the secret, the file's
    mode and the peers are checked only with them. `config_errors`: what is wrong
    with that file (`settings` are then its good keys), each a failed check."""
    expected = daemon_expected(config_path)
    checks: list[tuple[str, Callable[[], list[Line]]]] = [
        ("version", check_about),
        ("config", lambda: [
            (FAIL, f"{error}: the daemon refuses to start with this file (and a reload "
                   "keeps the old settings); fix it, then run doctor again")
            for error in config_errors]),
        ("record directory", lambda: check_record(record_dir)),
        ("state directory", lambda: check_state(state_dir)),
        ("daemon", lambda: check_daemon(listen, state_dir, expected)),
        ("daemon's directories", lambda: check_watches(listen, record_dir, state_dir)),
        ("instrumentation", check_instrumentation),
        ("foreign watchdog", check_foreign_watchdog),
        ("zero-code hook", check_pth),
        ("platform probes", check_probes),
        ("dump signal", check_dump_signal),
        ("evidence tools", check_evidence_tools),
        ("service", check_service),
        ("reboot flag", lambda: check_reboot_flag(state_dir)),
    ]
    if settings is not None:
        checks += [("config", lambda: check_config(config_path, settings)),
                   ("peers", lambda: check_peers(settings, config_path))]
    lines: list[tuple[str, str, str]] = []
    for name, check in checks:
        try:
            lines.extend((name, level, message) for level, message in check())
        except Exception as err:  # noqa: BLE001 - one broken check must not hide the rest
            lines.append((name, FAIL, f"the {name} check itself failed: {err!r}"))
    return _one_cause(lines)


# The checks whose failure follows from a daemon watching other directories than the
# config names: the config's directories missing (that daemon never made them), and
# what cannot be read there. One cause, counted once: the daemon's directories.
_FOLLOWS = ("record directory", "state directory", "reboot flag")


def _one_cause(lines: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """A consequence is not counted as a cause: with the daemon found watching other
    directories (one FAIL), the config's own directories missing are that FAIL's
    consequence, said as one (WARN), not failed again."""
    if not any(name == "daemon's directories" and level == FAIL for name, level, _ in lines):
        return lines
    return [(name, WARN, f"{message} (follows from the daemon's directories: one "
                         "cause)") if name in _FOLLOWS and level in (FAIL, WARN)
            and "does not exist" in message else (name, level, message)
            for name, level, message in lines]
