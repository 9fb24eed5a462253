"""`mlx-watchdog run`: the daemon wired to its HTTP endpoint, logs and signals."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from typing import Any

from watchdog import host
from watchdog.daemon.config import (
    SPECS,
    ConfigError,
    Settings,
    SetupRefused,
    load,
    load_file,
    own_peers,
    parse_listen,
    secret_exposed,
)
from watchdog.daemon.lograte import RepeatFilter, RotatingStream
from watchdog.daemon.loop import Daemon
from watchdog.daemon.store import dirs, journal
from watchdog.net.http import serve, set_peers, shut
from watchdog.net.notify import watchdog_interval
from watchdog.text import OneLineFormatter


class CannotStart(Exception):
    """The daemon cannot start; the message is one sentence for the user."""


NOFILE_WANTED = 65536  # descriptors: records, pidfds, probes and HTTP of a busy node


def _port_hint(listen: str, err: OSError) -> str:
    """For a port in use: whose it is (a daemon of ours answers there: its pid and
    state directory, and how to stop it) and what to do."""
    import errno
    import json
    import urllib.request

    from watchdog.status import NodeStatus

    if err.errno != errno.EADDRINUSE:
        return ""
    host, port = parse_listen(listen)
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/status"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=1.0) as resp:
            theirs = NodeStatus.from_json(json.loads(resp.read(16 << 20)))
    except Exception:  # noqa: BLE001 - not ours, or not answering: said below
        return (f": another program holds port {port} (find it: lsof -i :{port}, or "
                f"ss -ltnp); pass --listen another port")
    return (f": an mlx-watchdog daemon (pid {theirs.daemon_pid}, state directory "
            f"{theirs.state_dir}) already listens there: {dirs.stop_hint(theirs.daemon_pid)}, "
            "or pass --listen another port")


def raise_nofile() -> str:
    """Raise the soft descriptor limit toward the hard one (systemd's default soft
    limit is 1024; launchd's 256): the daemon must not run out before a user does.
    Returns what it did, for the log once the daemon has started ("" for nothing):
    a start that fails says one line, its reason."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = NOFILE_WANTED if hard == resource.RLIM_INFINITY else min(hard, NOFILE_WANTED)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            except ValueError:
                wanted = min(wanted, 10240)  # macOS: at most OPEN_MAX below an infinite hard
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return f"raised the open-files limit from {soft} to {wanted}"
    except (ValueError, OSError) as err:
        return f"cannot raise the open-files limit: {err}"
    return ""


# What SIGHUP may change in a running daemon; the rest (the directories, the address,
# what the evidence worker was built with) is kept, and the log says it needs a restart.
RELOADABLE = frozenset({
    "mode", "kill_scope", "interval", "deadline", "auto_factor", "auto_floor", "auto_min_waits",
    "auto_fallback", "init_deadline", "blocked_deadline", "spin_ratio", "confirm", "wedge_floor",
    "wedge_floor_exact",
    "grace",
    "kill_timeout", "wired_threshold", "settle", "retention", "peers", "peer_timeout",
    "secret"})


def _shown(key: str, value: Any) -> str:
    if key == "secret":
        return "set" if value else "unset"
    if key == "deadline" and value is None:
        return "auto"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    # Durations as the start line says them (`deadline 10s`): the unit its spec counts.
    seconds = key in SPECS and SPECS[key].unit.startswith("SECONDS")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and seconds:
        return f"{value:g}s"
    return f"{value:g}" if isinstance(value, float) else str(value)


def reloaded(old: Settings, new: Settings) -> tuple[Settings, list[str], list[str]]:
    """The settings a reload applies, what it changed, and what needs a restart (kept)."""
    changed: list[str] = []
    kept: list[str] = []
    for f in dataclasses.fields(Settings):
        before, after = getattr(old, f.name), getattr(new, f.name)
        if before == after:
            continue
        text = (f"{f.name} {_shown(f.name, before)} -> {_shown(f.name, after)}"
                if f.name != "secret" or not (before and after) else "secret changed")
        (changed if f.name in RELOADABLE else kept).append(text)
    keep = {f.name: getattr(old, f.name) for f in dataclasses.fields(Settings)
            if f.name not in RELOADABLE}
    return dataclasses.replace(new, **keep), changed, kept


def describe(settings: Settings, config_path: str | None,
             systemd_watchdog: float | None = None) -> list[tuple[int, str]]:
    """The start's log lines beyond `watching`: where the settings came from, peers and
    fences, a listen address no peer can reach, and an interval systemd's watchdog
    (`WatchdogSec`, `systemd_watchdog` seconds) would take for a hung daemon."""
    lines = [(logging.INFO, f"settings from {config_path}" if config_path
              else "no config file: defaults and flags")]
    exposed = secret_exposed(config_path) if config_path else ""
    if exposed:
        lines.append((logging.WARNING, exposed))
    if settings.peers:
        lines.append((logging.INFO, f"peers {', '.join(settings.peers)} (timeout "
                                    f"{settings.peer_timeout:g}s); fences "
                                    f"{'on' if settings.secret else 'off (no secret)'}"))
        host_part = settings.listen_address[0]
        if host_part in ("localhost", "::1") or host_part.startswith("127."):
            lines.append((logging.WARNING,
                          f"listen {settings.listen} is loopback but peers are configured: "
                          "no peer can reach this node (its cluster view and fences); listen "
                          "on an address they reach"))
    else:
        lines.append((logging.INFO, "no peers: cluster view and fences off"))
    # The loop pings systemd once a scan; sd_watchdog_enabled(3) asks for half the timeout.
    if systemd_watchdog is not None and settings.interval > systemd_watchdog / 2:
        lines.append((logging.WARNING,
                      f"interval {settings.interval:g}s is more than half systemd's "
                      f"WatchdogSec ({systemd_watchdog:g}s): systemd may restart a healthy "
                      "daemon; lower interval or raise WatchdogSec"))
    return lines


def _itself(listen: str, config_path: str | None, overrides: dict[str, Any]) -> tuple[str, ...]:
    """The peers as given (the flags', else the file's) that are this node itself: the
    settings hold them no more (config.own_peers), the start line says so."""
    given = overrides.get("peers")
    if not given and config_path:
        try:
            given = load_file(config_path).get("peers")
        except ConfigError:
            given = None
    listed = tuple(p for p in given if isinstance(p, str)) if isinstance(
        given, (list, tuple)) else ()
    return own_peers(listen, listed)


def run_daemon(settings: Settings, log_level: str = "info", *, config_path: str | None = None,
               overrides: dict[str, Any] | None = None) -> None:
    """Run until SIGTERM or SIGINT; the scan loop in this thread, HTTP in its own.
    SIGHUP reads the config file again and applies what can change while running."""
    handler = RotatingStream()  # stderr; rotated in place when a plain file (launchd)
    handler.setFormatter(OneLineFormatter("%(asctime)s mlx-watchdog %(levelname)s %(message)s"))
    handler.addFilter(RepeatFilter())  # what others can make us log is bounded
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    # Whatever umask it inherited (000 from a careless unit): nothing it creates,
    # parents of its directories included, is writable by others.
    os.umask(0o022)
    created = dirs.prepare(settings.dir, settings.state_dir)
    lock_fd = -1
    try:
        # One daemon per directory: the state directory's lock (kept for our life), and
        # no other live daemon's pointer in the record directory.
        lock_fd = dirs.lock_state_dir(settings.state_dir)
        pointer = journal.read_pointer(settings.dir)
        if pointer is not None and os.path.abspath(pointer.state_dir) != os.path.abspath(
                settings.state_dir):
            holder = dirs.held_by(pointer.state_dir)
            if holder is not None:
                raise SetupRefused(f"another daemon (pid {holder}) already watches "
                                   f"{settings.dir} (its state directory is "
                                   f"{pointer.state_dir}): {dirs.stop_hint(holder)}")
        nofile = raise_nofile()
        daemon = Daemon(settings)
        try:
            server = serve(settings.listen_address, lambda: daemon.snapshot, daemon.healthy,
                           daemon.fence_request if settings.secret else None,
                           peers=settings.peers, job_label=settings.job_label,
                           secret=lambda: daemon.live.peering.secret,
                           health=lambda: daemon.health)
        except OSError as err:
            raise CannotStart(f"cannot listen on {settings.listen}: {err.strerror}"
                              + _port_hint(settings.listen, err)) from None
    except (SetupRefused, CannotStart):
        if lock_fd >= 0:
            os.close(lock_fd)
        dirs.undo(created, settings.state_dir)  # a refused start leaves nothing behind
        raise
    log = logging.getLogger("watchdog")
    if nofile:
        log.log(logging.WARNING if nofile.startswith("cannot") else logging.INFO, "%s", nofile)
    log.info("serving /metrics /status /healthz on http://%s:%s (platform: %s)",
             *server.server_address[:2], host.platform_label())
    if settings.job_label == "job":
        log.warning("job_label = \"job\": rank series name the MLX job `job` (deprecated, "
                    "removed in the next release; scrape with honor_labels, or move to "
                    "mlx_job: docs/operations.md, Upgrading)")
    for level, line in describe(settings, config_path, watchdog_interval()):
        log.log(level, "%s", line)
    for peer in _itself(settings.listen, config_path, overrides or {}):
        log.info("peer %s is this node (its listen %s): skipped (no fence, view or check "
                 "of itself)", peer, settings.listen)

    def reload() -> None:
        if config_path is None:
            log.warning("SIGHUP: no config file to read again (started without one); "
                        "nothing changed")
            return
        try:
            new = load(config_path, overrides or {})  # the flags still win over the file
        except ConfigError as err:
            log.error("SIGHUP: %s; the running settings are kept", err)
            return
        before = daemon.settings
        applied, changed, kept = reloaded(before, new)
        # Said first: what applying it logs (a peer that does not resolve) follows it.
        # One story: "nothing changed" only when nothing did, not before "kept" below.
        if changed or not kept:
            log.info("SIGHUP: reloaded %s: %s", config_path,
                     "; ".join(changed) or "nothing changed")
        daemon.apply_settings(applied)
        if applied.peers != before.peers:
            set_peers(server, applied.peers)
        server.fence = (  # type: ignore[attr-defined]
            daemon.fence_request if applied.secret else None)
        if kept:
            log.warning("SIGHUP: %s: needs a restart, kept as running: %s",
                        "reloaded " + config_path + (", the rest applied" if changed else
                                                     ", nothing else changed"),
                        "; ".join(kept))
        exposed = secret_exposed(config_path)
        if exposed:
            log.warning("%s", exposed)

    def stop(signum: int, _frame: Any) -> None:
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # The reload reads a file and takes the scan's lock: on a thread, never in the handler.
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(
        target=reload, name="reload", daemon=True).start())
    try:
        daemon.run()
    finally:
        shut(server)
        os.close(lock_fd)
