"""The `mlx-watchdog` command: a thin layer over the library.

Every error the user can cause ends as one line on stderr and a non-zero exit:
`main()` runs click without its standalone handling and prints exceptions
itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import time
from datetime import datetime
from typing import Any

import click

from . import __version__, journal
from .config import DEFAULT_RECORD_DIR, DEFAULT_STATE_DIR, ConfigError, Settings
from .states import HUNG
from .text import printable

DIR_ENV = "MLX_WATCHDOG_DIR"
STATE_ENV = "MLX_WATCHDOG_STATE_DIR"

dir_option = click.option("--dir", "record_dir", envvar=DIR_ENV, default=DEFAULT_RECORD_DIR,
                          show_default=True, help="Record directory (env MLX_WATCHDOG_DIR).")
state_option = click.option("--state-dir", envvar=STATE_ENV, default=DEFAULT_STATE_DIR,
                            show_default=True,
                            help="Daemon state directory (env MLX_WATCHDOG_STATE_DIR).")


class Deadline(click.ParamType):  # type: ignore[type-arg]
    name = "SECONDS|auto"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither a number of seconds nor 'auto'", param, ctx)
        if not seconds > 0 or seconds == float("inf"):
            self.fail(f"{value!r} must be a number of seconds > 0", param, ctx)
        return seconds


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mlx-watchdog")
def cli() -> None:
    """Find MLX distributed ranks hung in a collective, and end them safely."""


# -- run ------------------------------------------------------------------------


def _settings_options(f: Any) -> Any:
    """One option per setting, so every key of the TOML file is also a flag.

    Values arrive as text and are checked by `config.build`, so a bad value
    gets the same one-line message from the file or the command line.
    """
    from .config import HELP

    for field in reversed(dataclasses.fields(Settings)):
        flag = "--" + field.name.replace("_", "-")
        if field.name == "peers":
            f = click.option(flag, multiple=True, default=None, help=HELP[field.name])(f)
        else:
            default = getattr(Settings(), field.name)
            shown = "auto" if field.name == "deadline" else default
            envvar = {"dir": DIR_ENV, "state_dir": STATE_ENV,
                      "secret": "MLX_WATCHDOG_SECRET"}.get(field.name)
            f = click.option(flag, field.name, envvar=envvar,
                             help=f"{HELP[field.name]} [{shown}]")(f)
    return f


@cli.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="MLX_WATCHDOG_CONFIG", help="TOML file (keys as the options below).")
@_settings_options
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def run(config_path: str | None, log_level: str, **options: Any) -> None:
    """Run the daemon: watch every rank on this node and end hung ones."""
    from . import dirs
    from .config import load
    from .daemon import Daemon
    from .metrics import serve

    options["peers"] = options.get("peers") or None
    settings = load(config_path, options)
    from .text import OneLineFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("%(asctime)s mlx-watchdog %(levelname)s %(message)s"))
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    dirs.prepare(settings.dir, settings.state_dir)
    daemon = Daemon(settings)
    try:
        server = serve(settings.listen_address, lambda: daemon.snapshot, daemon.healthy,
                       daemon.fence_request if settings.secret else None)
    except OSError as err:
        raise click.ClickException(f"cannot listen on {settings.listen}: {err.strerror}") from None
    logging.getLogger("watchdog").info("serving /metrics /status /healthz on http://%s:%s",
                                       *server.server_address[:2])

    def stop(signum: int, _frame: Any) -> None:
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        daemon.run()
    finally:
        server.shutdown()


# -- status, watch, inspect ---------------------------------------------------------


deadline_option = click.option(
    "--deadline", type=Deadline(), default="auto", show_default=True,
    help="With no daemon running: the deadline to judge waits by.")


def _ranks(record_dir: str, state_dir: str, deadline: float | str = "auto"
           ) -> tuple[list[dict[str, Any]], str]:
    from .detector import Rules
    from .local import daemon_status, sample_ranks

    snap = daemon_status(state_dir)
    if snap is not None:
        return snap.get("ranks", []), "daemon"
    if not os.path.isdir(record_dir):
        raise click.ClickException(f"record directory {record_dir} does not exist "
                                   f"(set --dir or {DIR_ENV})")
    rules = Rules(deadline=None if deadline == "auto" else float(deadline))
    ranks, invalid = sample_ranks(record_dir, rules)
    for path, why in invalid.items():
        click.echo(f"skipped {path}: {why}", err=True)
    return ranks, "sampled"


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


COLUMNS = ("PID", "JOB", "RANK", "STATE", "PHASE", "PROGRESS", "COLL", "SINCE", "DEADLINE",
           "CPU", "OP")


def table(ranks: list[dict[str, Any]]) -> str:
    rows: list[tuple[str, ...]] = [COLUMNS]
    for r in ranks:
        cells = (r["pid"], r["job"], f"{r['rank']}/{r['world_size']}", r["state"], r["phase"],
                 r["progress"], r["collectives"], _fmt(r.get("seconds_since_progress"), ".1f"),
                 _fmt(r.get("deadline_seconds"), ".0f"),
                 _fmt(r.get("busiest_thread_cpu"), ".2f"), r.get("current_op") or "")
        rows.append(tuple(printable(cell) for cell in cells))  # record strings are untrusted
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


@cli.command()
@dir_option
@state_option
@click.option("--json", "as_json", is_flag=True, help="One JSON list, one object per rank.")
@click.option("--check", is_flag=True, help="Exit 1 if any rank is stalled, blocked or "
              "unkillable.")
@deadline_option
def status(record_dir: str, state_dir: str, as_json: bool, check: bool,
           deadline: float | str) -> None:
    """The ranks on this node and their state (works with no daemon running)."""
    ranks, source = _ranks(record_dir, state_dir, deadline)
    if as_json:
        click.echo(json.dumps(ranks, indent=1))
    elif ranks:
        click.echo(table(ranks))
        click.echo(f"({len(ranks)} ranks; " + ("verdicts from the daemon)" if source == "daemon"
                   else "sampled here: no daemon running)"), err=True)
    else:
        click.echo(f"no ranks in {record_dir}")
    if check and any(r["state"] in {s.value for s in HUNG} for r in ranks):
        sys.exit(1)


@cli.command()
@dir_option
@state_option
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True)
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many refreshes.")
@deadline_option
def watch(record_dir: str, state_dir: str, interval: float, count: int | None,
          deadline: float | str) -> None:
    """A live view of the ranks, refreshed in place (Ctrl-C to quit)."""
    shown = 0
    try:
        while count is None or shown < count:
            ranks, source = _ranks(record_dir, state_dir, deadline)
            stamp = datetime.now().strftime("%H:%M:%S")
            body = table(ranks) if ranks else f"no ranks in {record_dir}"
            click.echo(f"\x1b[H\x1b[2J{stamp}  mlx-watchdog  ({source})\n\n{body}")
            shown += 1
            if count is None or shown < count:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass


@cli.command()
@click.argument("pid", type=click.IntRange(min=1))
@dir_option
@click.option("--json", "as_json", is_flag=True)
def inspect(pid: int, record_dir: str, as_json: bool) -> None:
    """One rank in depth: threads, counters, expect window, flight recorder."""
    from .details import describe, render_text
    from .recdir import find_record

    rec, why = find_record(record_dir, pid)
    if rec is None:
        raise click.ClickException(f"no usable record for pid {pid} in {record_dir}"
                                   + (f": {why}" if why else ""))
    info = describe(rec)
    click.echo(json.dumps(info, indent=1) if as_json else render_text(info))


# -- incidents and the node ----------------------------------------------------------


def _existing_state_dir(state_dir: str) -> None:
    if not os.path.isdir(state_dir):
        raise click.ClickException(f"state directory {state_dir} does not exist (set "
                                   f"--state-dir or {STATE_ENV}; the daemon creates it)")


@cli.command()
@state_option
@click.option("--json", "as_json", is_flag=True)
@click.option("--last", type=click.IntRange(min=1), help="Only the last N incidents.")
def incidents(state_dir: str, as_json: bool, last: int | None) -> None:
    """The incident journal: what the watchdog found and did."""
    _existing_state_dir(state_dir)
    items, bad = journal.read_incidents(state_dir)
    if last:
        items = items[-last:]
    if bad:
        click.echo(f"warning: {bad} malformed lines skipped", err=True)
    if as_json:
        click.echo(json.dumps(items, indent=1))
        return
    if not items:
        click.echo("no incidents")
        return
    for inc in items:
        _echo_incident(inc)


def _echo_incident(inc: dict[str, Any]) -> None:
    when = datetime.fromtimestamp(float(inc.get("time", 0))).strftime("%Y-%m-%d %H:%M:%S")
    ranks = ",".join(str(r.get("rank")) for r in inc.get("ranks", []))
    lines = [f"{when}  {inc.get('id')}  job {inc.get('job')}  {inc.get('verdict')}  "
             f"ranks {ranks}  {inc.get('action', '')}", f"    {inc.get('reason', '')}"]
    if inc.get("culprit"):
        c = inc["culprit"]
        lines.append(f"    culprit: rank {c.get('rank')} pid {c.get('pid')} on {c.get('host')}: "
                     f"{c.get('reason')}")
    outcome = ", ".join(f"{pid}:{res}" for pid, res in (inc.get("outcome") or {}).items())
    if outcome:
        lines.append(f"    outcome: {outcome}")
    if inc.get("reboot_required"):
        lines.append(f"    REBOOT REQUIRED: {inc['reboot_required']}")
    for line in lines:
        click.echo(printable(line))  # record strings are untrusted: one line each


@cli.group()
def node() -> None:
    """This node's reboot flag and wired memory."""


@node.command("status")
@state_option
@click.option("--json", "as_json", is_flag=True)
def node_status(state_dir: str, as_json: bool) -> None:
    """Is this node flagged for reboot?"""
    _existing_state_dir(state_dir)
    from .local import daemon_status

    flag = journal.reboot_flag(state_dir)
    snap = daemon_status(state_dir) or {}
    info = {"reboot_required": flag is not None, "reboot": flag,
            "daemon_running": bool(snap), "wired_bytes": snap.get("wired_bytes"),
            "wired_baseline_bytes": snap.get("wired_baseline_bytes")}
    if as_json:
        click.echo(json.dumps(info, indent=1))
    else:
        click.echo("reboot required: " + (f"YES ({flag.get('reason')})" if flag else "no"))
        click.echo(f"daemon: {'running' if snap else 'not running'}")
        if snap.get("wired_bytes") is not None:
            click.echo(f"wired memory: {snap['wired_bytes'] / 2**20:.0f} MiB "
                       f"(baseline {(snap.get('wired_baseline_bytes') or 0) / 2**20:.0f} MiB)")
    if flag:
        sys.exit(1)


@node.command("clear-reboot")
@state_option
def clear_reboot(state_dir: str) -> None:
    """Clear the reboot flag (after rebooting the node)."""
    _existing_state_dir(state_dir)
    try:
        cleared = journal.clear_reboot_flag(state_dir)
    except PermissionError:
        raise click.ClickException(f"permission denied in {state_dir} (run as root)") from None
    click.echo("reboot flag cleared" if cleared else "no reboot flag was set")


# -- service, doctor, demo ------------------------------------------------------------


@cli.group()
def service() -> None:
    """Install or print the launchd / systemd service for this machine."""


def _service_kind(launchd: bool, systemd: bool) -> str:
    if launchd and systemd:
        raise click.UsageError("choose one of --launchd and --systemd")
    if launchd or systemd:
        return "launchd" if launchd else "systemd"
    return "launchd" if sys.platform == "darwin" else "systemd"


def _service_options(f: Any) -> Any:
    for option in (
        click.option("--launchd", is_flag=True, help="A macOS LaunchDaemon plist."),
        click.option("--systemd", is_flag=True, help="A systemd unit."),
        click.option("--config", "config_path", default="/etc/mlx-watchdog.toml",
                     show_default=True, help="Config file the service runs with."),
    ):
        f = option(f)
    return f


def _render(launchd: bool, systemd: bool, config_path: str) -> tuple[str, dict[str, Any]]:
    from . import service

    kind = _service_kind(launchd, systemd)
    return kind, dict(executable=service.script_path(), config=config_path,
                      record_dir=service.DEFAULT_RECORD_DIR[kind],
                      state_dir=service.DEFAULT_STATE_DIR[kind])


@service.command("print")
@_service_options
def service_print(launchd: bool, systemd: bool, config_path: str) -> None:
    """Print the service file for this machine's interpreter and paths."""
    from .service import render

    kind, kwargs = _render(launchd, systemd, config_path)
    click.echo(render(kind, **kwargs), nl=False)


@service.command("install")
@_service_options
@click.option("--path", help="Where to write it (default: the system location).")
def service_install(launchd: bool, systemd: bool, config_path: str, path: str | None) -> None:
    """Write the service file; prints the command that loads it."""
    from .service import ServiceError, install

    kind, kwargs = _render(launchd, systemd, config_path)
    try:
        written = install(kind, path, **kwargs)
    except ServiceError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"wrote {written}")
    if path is None and not os.path.exists(config_path):
        from .config import default_toml

        try:
            # 0600: the file may later hold the fence secret.
            fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(default_toml())
            click.echo(f"wrote {config_path} (every key at its default)")
        except OSError as err:
            raise click.ClickException(f"cannot write {config_path}: {err.strerror}") from None
    from .service import activation_commands

    click.echo("load it with:")
    for command in activation_commands(kind, written):
        click.echo(f"  sudo {command}")


@cli.group()
def cluster() -> None:
    """Every node's ranks, lined up by job: which rank holds a job up."""


@cluster.command("status")
@click.argument("peers", nargs=-1)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="MLX_WATCHDOG_CONFIG", help="Take the peers from this config file.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds to wait for each node.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
def cluster_status(peers: tuple[str, ...], config_path: str | None, timeout: float,
                   as_json: bool, watch: bool, interval: float) -> None:
    """Gather /status from each HOST:PORT and judge every job; exit 1 if one is hung,
    2 if no node answered."""
    from . import cluster as cluster_view
    from .config import load, parse_listen

    peers = tuple(p for item in peers for p in item.replace(",", " ").split())
    for peer in peers:
        parse_listen(peer)
    if not peers:
        from .service import DEFAULT_CONFIG

        if config_path is None and os.path.exists(DEFAULT_CONFIG):
            config_path = DEFAULT_CONFIG  # a configured node needs no arguments
        peers = load(config_path, {}).peers if config_path else ()
    if not peers:
        raise click.UsageError("name the nodes (HOST:PORT ...) or a --config with peers")
    while True:
        view = cluster_view.analyze(cluster_view.gather(peers, timeout))
        if as_json:
            click.echo(json.dumps(view, indent=1))
        else:
            prefix = "\x1b[H\x1b[2J" if watch else ""
            click.echo(prefix + cluster_view.render_text(view))
        if not watch:
            break
        time.sleep(interval)
    if any(job["state"] == "hung" for job in view["jobs"]):
        sys.exit(1)
    if not any(node["ok"] for node in view["nodes"]):
        click.echo("no node answered", err=True)
        sys.exit(2)


@cli.command()
@dir_option
@state_option
@click.option("--listen", default=Settings().listen, show_default=True)
def doctor(record_dir: str, state_dir: str, listen: str) -> None:
    """Check this node's setup and say what to fix."""
    from .doctor import run_checks

    worst = 0
    for level, message in run_checks(record_dir, state_dir, listen):
        worst = max(worst, {"ok": 0, "warn": 1, "fail": 2}[level])
        click.echo(f"[{level.upper():4}] {message}")
    sys.exit(1 if worst == 2 else 0)


@cli.command()
@click.option("--ranks", type=click.IntRange(2, 8), default=3, show_default=True)
@click.option("--deadline", type=click.FloatRange(min=1), default=4.0, show_default=True)
@click.option("--fault", type=click.Choice(["stop", "kill", "mismatch"]), default="stop",
              show_default=True, help="Freeze a rank, kill one, or leave one waiting in "
              "a recv nobody sends.")
def demo(ranks: int, deadline: float, fault: str) -> None:
    """Run a real local MLX ring job, inject a fault, and watch the watchdog act."""
    from .demo import run_demo

    sys.exit(run_demo(ranks=ranks, deadline=deadline, fault=fault))


def main(argv: list[str] | None = None) -> None:
    try:
        code = cli.main(args=argv, prog_name="mlx-watchdog", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("mlx-watchdog: aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        click.echo(f"mlx-watchdog: {err.format_message()}", err=True)
        sys.exit(err.exit_code)
    except ConfigError as err:
        click.echo(f"mlx-watchdog: {err}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
