"""`run`, the daemon, and `service print | install | uninstall | restart`: the launchd or
systemd service that runs it on this machine."""

from __future__ import annotations

import os
from typing import Any

import click

from watchdog.cli.exits import SetupError
from watchdog.cli.options import Commands, Node, settings_options
from watchdog.cli.service.unit import DEFAULT_CONFIG


@click.group(cls=Commands)
def service() -> None:
    """Install or print the launchd / systemd service for this machine."""


def _service_kind(launchd: bool, systemd: bool) -> str:
    if launchd and systemd:
        raise click.UsageError("choose one of --launchd and --systemd")
    if launchd or systemd:
        return "launchd" if launchd else "systemd"
    from watchdog import host

    return host.defaults().service


def _service_options(f: Any) -> Any:
    for option in (
        click.option("--launchd", is_flag=True, help="A macOS LaunchDaemon plist."),
        click.option("--systemd", is_flag=True, help="A systemd unit."),
        click.option("--config", "config_path", default="/etc/mlx-watchdog.toml",
                     show_default=True, help="Config file the service runs with."),
    ):
        f = option(f)
    return f


def _render(launchd: bool, systemd: bool, config_path: str) -> tuple[str, dict[str, str]]:
    from watchdog.cli.service import unit as service

    kind = _service_kind(launchd, systemd)
    return kind, dict(executable=service.script_path(), config=config_path,
                      record_dir=service.DEFAULT_RECORD_DIR[kind],
                      state_dir=service.DEFAULT_STATE_DIR[kind])


def _check_config(config_path: str, writes_default: bool) -> None:
    """The service runs `run --config FILE`: a file it cannot use would have it fail at
    every start, so it is checked before anything is installed (a bad value: exit 2;
    a missing file where none is written: exit 3)."""
    import os

    from watchdog.daemon.config import load

    if not os.path.lexists(config_path):
        if writes_default:
            return  # written below (every key at its default), or the default one
        raise SetupError(f"config file {config_path} does not exist: the service would fail "
                         "at every start; create it first, or install to the system "
                         "location, which writes it")
    load(config_path, {})


def _native(kind: str, verb: str) -> None:
    """Refuse to install or load a service kind this OS has no manager for."""
    from watchdog import host

    darwin = host.os_name() == host.DARWIN
    if kind == "launchd" and not darwin:
        raise SetupError(f"launchd is macOS only: on this machine, {verb} --systemd (or "
                         "`service print --launchd`, or --path FILE, to write the plist for "
                         "a Mac)")
    if kind == "systemd" and darwin:
        raise SetupError(f"systemd is Linux only: on a Mac, {verb} --launchd (or "
                         "`service print --systemd`, or --path FILE, to write the unit for "
                         "Linux)")


@service.command("print")
@_service_options
def service_print(launchd: bool, systemd: bool, config_path: str) -> None:
    """Print the service file for this machine's interpreter and paths."""
    from watchdog.cli.service.unit import render

    kind, kwargs = _render(launchd, systemd, config_path)
    click.echo(render(kind, **kwargs), nl=False)


@service.command("install")
@_service_options
@click.option("--path", help="Where to write it (default: the system location).")
@click.option("--load/--no-load", default=None,
              help="Load and start it with launchctl/systemctl (default: only when "
                   "written to the system location).")
def service_install(launchd: bool, systemd: bool, config_path: str, path: str | None,
                    load: bool | None) -> None:
    """Write the service file, then load and start it."""
    from watchdog.cli.service import control as ctl
    from watchdog.cli.service import unit as svc

    kind, kwargs = _render(launchd, systemd, config_path)
    if path is None:  # the system location of another OS's service manager
        _native(kind, "install")
    named = click.get_current_context().get_parameter_source("config_path") not in (
        click.core.ParameterSource.DEFAULT, None)
    # A file named on purpose must be there; the default one is written (system install).
    _check_config(config_path, writes_default=path is None or not named)
    try:
        written = svc.install(kind, path, **kwargs)
    except svc.ServiceError as err:
        raise SetupError(str(err)) from None
    click.echo(f"wrote {written}")
    hidden = svc.under_private_tmp(kwargs["executable"]) if kind == "systemd" else None
    if hidden:
        click.echo(f"mlx-watchdog: warning: the unit runs {kwargs['executable']}, under "
                   f"{hidden}, which the unit's PrivateTmp=yes hides from the service: it "
                   "would not start. Install mlx-watchdog outside a temporary directory "
                   "(e.g. a venv in /opt/mlx-watchdog) and install the service from there",
                   err=True)
    if path is None:
        try:
            if svc.write_default_config(config_path):
                click.echo(f"wrote {config_path} (every key at its default)")
        except OSError as err:
            raise SetupError(f"cannot write {config_path}: {err.strerror}") from None
    if not (path is None if load is None else load):
        click.echo("load it with:")
        for argv in ctl.activation_commands(kind, written):
            click.echo(f"  sudo {ctl.shell_line(argv)}")
        return
    try:
        for argv in ctl.load(kind, written):
            click.echo(f"ran: {ctl.shell_line(argv)}")
    except ctl.ManagerUnreachable as err:
        raise SetupError(f"{written} is written but not loaded: {err}; "
                         f"`mlx-watchdog service uninstall --{kind}` removes it") from None
    except svc.ServiceError as err:
        raise SetupError(str(err)) from None
    click.echo(f"the {kind} service is loaded; check it with: mlx-watchdog doctor")


@service.command("uninstall")
@click.option("--launchd", is_flag=True, help="The macOS LaunchDaemon.")
@click.option("--systemd", is_flag=True, help="The systemd unit.")
@click.option("--path", help="The file to remove (default: the system location).")
def service_uninstall(launchd: bool, systemd: bool, path: str | None) -> None:
    """Stop and unload the service and delete its file (state and logs are kept)."""
    from watchdog.cli.service import control as ctl
    from watchdog.cli.service import unit as svc

    kind = _service_kind(launchd, systemd)
    target = path if path is not None else svc.default_path(kind)
    try:
        ran, removed, failed = ctl.uninstall(kind, target)
    except svc.ServiceError as err:
        raise SetupError(str(err)) from None
    for argv in ran:
        click.echo(f"ran: {ctl.shell_line(argv)}")
    for said in failed:  # the file goes whatever systemctl says
        click.echo(f"mlx-watchdog: warning: {said}", err=True)
    click.echo(f"removed {target}" if removed else f"no {target} to remove")


@service.command("restart")
@click.option("--launchd", is_flag=True, help="The macOS LaunchDaemon.")
@click.option("--systemd", is_flag=True, help="The systemd unit.")
def service_restart(launchd: bool, systemd: bool) -> None:
    """Restart the daemon (after an upgrade or a config change)."""
    from watchdog.cli.service import control as ctl
    from watchdog.cli.service import unit as svc

    kind = _service_kind(launchd, systemd)
    argv = ctl.restart_command(kind, svc.default_path(kind))
    try:
        ctl.run_command(argv)
    except svc.ServiceError as err:
        raise SetupError(str(err)) from None
    click.echo(f"ran: {ctl.shell_line(argv)}")


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="MLX_WATCHDOG_CONFIG",
              help=f"TOML file (keys as the options below) [default: the file given as "
                   f"`mlx-watchdog --config FILE run`, else {DEFAULT_CONFIG} when present].")
@settings_options
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]),
              help="The least severe log lines written (debug adds every scan's detail).")
@click.pass_obj
def run(node: Node, /, config_path: str | None, log_level: str, **options: Any) -> None:
    """Run the daemon: watch every rank on this node and end hung ones.

    Its settings: defaults, then the node's config file (this --config, else the
    one given before the command, `mlx-watchdog --config FILE run`, else
    MLX_WATCHDOG_CONFIG, else /etc/mlx-watchdog.toml when it exists, as every
    command reads it), then the flags. Every duration takes seconds or a unit
    (500ms, 90s, 2m, 1h), every size bytes or 1G, 512M. SIGHUP reloads the file.
    """
    from watchdog.daemon.config import load
    from watchdog.daemon.runner import CannotStart, run_daemon

    if config_path is None and (node.explicit or os.path.lexists(node.config_path)):
        config_path = node.config_path  # the daemon must not ignore a file it cannot read
        if not node.explicit and not os.access(config_path, os.R_OK):
            raise SetupError(f"cannot read {config_path}, this node's config (run as "
                             "root, or name another file with --config)")
    # Each --peers value is already a checked tuple (commas allowed): join them.
    options["peers"] = tuple(p for given in options.get("peers") or () for p in given) or None
    try:
        run_daemon(load(config_path, options), log_level, config_path=config_path,
                   overrides=options)
    except CannotStart as err:
        raise SetupError(str(err)) from None
