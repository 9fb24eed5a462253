"""The `mlx-watchdog` command: a thin layer over the library.

Every error the user can cause ends as one line on stderr and a non-zero exit:
`main()` runs click without its standalone handling and prints exceptions
itself.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from watchdog import __version__
from watchdog.cli import cluster_cmds, node_cmds, service_cmds, status
from watchdog.cli.options import Node, dir_option, settings_options, state_option
from watchdog.cli.service import DEFAULT_CONFIG
from watchdog.daemon.config import ConfigError, Settings


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mlx-watchdog")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="MLX_WATCHDOG_CONFIG",
              help=f"The node's config file, for the directories and peers of every command "
                   f"[{DEFAULT_CONFIG} when present].")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Find MLX distributed ranks hung in a collective, and end them safely."""
    ctx.obj = Node(config_path)


@cli.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="MLX_WATCHDOG_CONFIG", help="TOML file (keys as the options below).")
@settings_options
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def run(config_path: str | None, log_level: str, **options: Any) -> None:
    """Run the daemon: watch every rank on this node and end hung ones."""
    from watchdog.daemon.config import load
    from watchdog.daemon.runner import CannotStart, run_daemon

    # Each --peers value is already a checked tuple (commas allowed): join them.
    options["peers"] = tuple(p for given in options.get("peers") or () for p in given) or None
    try:
        run_daemon(load(config_path, options), log_level)
    except CannotStart as err:
        raise click.ClickException(str(err)) from None


@cli.command()
@dir_option
@state_option
@click.option("--listen", default=Settings().listen, show_default=True)
def doctor(record_dir: str, state_dir: str, listen: str) -> None:
    """Check this node's setup and say what to fix."""
    from watchdog.cli.doctor import run_checks

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
    from watchdog.cli.demo import run_demo

    sys.exit(run_demo(ranks=ranks, deadline=deadline, fault=fault))



@cli.command(context_settings={"ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def launch(args: tuple[str, ...]) -> None:
    """mlx.launch ARGS with a fresh MLX_WATCHDOG_JOB, the same on every rank of the launch."""
    from watchdog.cli.launcher import JOB_ENV, LauncherError, find_mlx_launch, launch_argv

    try:
        argv = launch_argv(find_mlx_launch(), list(args), os.environ)
    except LauncherError as err:
        raise click.ClickException(str(err)) from None
    job = next((a.split("=", 1)[1] for a in argv if a.startswith(f"{JOB_ENV}=")), None)
    if job:
        click.echo(f"mlx-watchdog: job {job}", err=True)
    try:
        os.execv(argv[0], argv)
    except OSError as err:
        raise click.ClickException(f"cannot run {argv[0]}: {err.strerror}") from None


for command in (status.status, status.watch, status.inspect, node_cmds.incidents, node_cmds.node,
                service_cmds.service, cluster_cmds.cluster):
    cli.add_command(command)


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
