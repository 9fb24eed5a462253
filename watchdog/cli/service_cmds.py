"""`service print | install`: the launchd or systemd service for this machine."""

from __future__ import annotations

import sys
from typing import Any

import click


@click.group()
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
    from watchdog.cli import service

    kind = _service_kind(launchd, systemd)
    return kind, dict(executable=service.script_path(), config=config_path,
                      record_dir=service.DEFAULT_RECORD_DIR[kind],
                      state_dir=service.DEFAULT_STATE_DIR[kind])


@service.command("print")
@_service_options
def service_print(launchd: bool, systemd: bool, config_path: str) -> None:
    """Print the service file for this machine's interpreter and paths."""
    from watchdog.cli.service import render

    kind, kwargs = _render(launchd, systemd, config_path)
    click.echo(render(kind, **kwargs), nl=False)


@service.command("install")
@_service_options
@click.option("--path", help="Where to write it (default: the system location).")
def service_install(launchd: bool, systemd: bool, config_path: str, path: str | None) -> None:
    """Write the service file; prints the command that loads it."""
    from watchdog.cli.service import ServiceError, install, write_default_config

    kind, kwargs = _render(launchd, systemd, config_path)
    try:
        written = install(kind, path, **kwargs)
    except ServiceError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"wrote {written}")
    if path is None:
        try:
            if write_default_config(config_path):
                click.echo(f"wrote {config_path} (every key at its default)")
        except OSError as err:
            raise click.ClickException(f"cannot write {config_path}: {err.strerror}") from None
    from watchdog.cli.service import activation_commands

    click.echo("load it with:")
    for command in activation_commands(kind, written):
        click.echo(f"  sudo {command}")

