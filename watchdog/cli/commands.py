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
from watchdog.cli import exits
from watchdog.cli.look import cluster as cluster_cmds
from watchdog.cli.look import status
from watchdog.cli.node import commands as node_cmds
from watchdog.cli.options import Node, dir_option, settings_options, state_option
from watchdog.cli.service import commands as service_cmds
from watchdog.cli.service.unit import DEFAULT_CONFIG
from watchdog.daemon.config import ConfigError, Settings, SetupError


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
              envvar="MLX_WATCHDOG_CONFIG",
              help=f"TOML file (keys as the options below) [the group's --config, else "
                   f"{DEFAULT_CONFIG} when present].")
@settings_options
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.pass_obj
def run(node: Node, /, config_path: str | None, log_level: str, **options: Any) -> None:
    """Run the daemon: watch every rank on this node and end hung ones.

    Its settings: defaults, then the node's config file (this --config, the
    group's --config, MLX_WATCHDOG_CONFIG, else /etc/mlx-watchdog.toml when it
    exists, as every command reads it), then the flags. SIGHUP reloads the file.
    """
    from watchdog.daemon.config import load
    from watchdog.daemon.runner import CannotStart, run_daemon

    if config_path is None and (node.explicit or os.path.lexists(node.config_path)):
        config_path = node.config_path  # the daemon must not ignore a file it cannot read
        if not node.explicit and not os.access(config_path, os.R_OK):
            raise exits.SetupError(f"cannot read {config_path}, this node's config (run as "
                                   "root, or name another file with --config)")
    # Each --peers value is already a checked tuple (commas allowed): join them.
    options["peers"] = tuple(p for given in options.get("peers") or () for p in given) or None
    try:
        run_daemon(load(config_path, options), log_level, config_path=config_path,
                   overrides=options)
    except CannotStart as err:
        raise exits.SetupError(str(err)) from None


@cli.command()
@dir_option
@state_option
@click.option("--listen", default=Settings().listen, show_default=True,
              help="Where the daemon serves /healthz (its listen setting).")
def doctor(record_dir: str, state_dir: str, listen: str) -> None:
    """Check this node's setup and say what to fix."""
    from watchdog.cli.node.doctor import run_checks

    worst = 0
    for level, message in run_checks(record_dir, state_dir, listen):
        worst = max(worst, {"ok": 0, "warn": 1, "fail": 2}[level])
        click.echo(f"[{level.upper():4}] {message}")
    sys.exit(1 if worst == 2 else 0)


@cli.command()
@click.option("--ranks", type=click.IntRange(2, 8), default=3, show_default=True,
              help="Ranks of the local MLX ring job.")
@click.option("--deadline", type=click.FloatRange(min=1), default=4.0, show_default=True,
              help="Seconds a wait may last before the demo's daemon judges it hung.")
@click.option("--fault", type=click.Choice(["stop", "kill", "mismatch"]), default="stop",
              show_default=True, help="Freeze a rank, kill one, or leave one waiting in "
              "a recv nobody sends.")
def demo(ranks: int, deadline: float, fault: str) -> None:
    """Run a real local MLX ring job, inject a fault, and watch the watchdog act."""
    from watchdog.cli.demo.story import run_demo

    sys.exit(run_demo(ranks=ranks, deadline=deadline, fault=fault))



def _launch_options(f: Any) -> Any:
    """The launch keys of the settings as flags of `launch` (the config file's keys too)."""
    from watchdog.cli.options import SettingType
    from watchdog.daemon.config import LAUNCH_KEYS, SPECS

    defaults = Settings()
    for key in reversed(LAUNCH_KEYS):
        f = click.option("--" + key.replace("_", "-"), key, type=SettingType(key),
                         help=f"{SPECS[key].help.removeprefix('launch: ')} "
                              f"[{getattr(defaults, key)}]")(f)
    return f


@cli.command(context_settings={"ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@state_option
@_launch_options
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def launch(node: Node, /, state_dir: str, args: tuple[str, ...], **options: Any) -> None:
    """mlx.launch ARGS with one MLX_WATCHDOG_JOB on every rank; relaunch it when torn down.

    Exit status: 0 every rank exited 0; 10 a rank failed or crashed; 11 the
    watchdog or a fence ended the job; 12 refused (node flagged for reboot, or
    wired memory not back); 13 gave up (no progress); 130 interrupted.
    """
    import dataclasses

    from watchdog.cli.launch.launcher import (
        JOB_ENV,
        LauncherError,
        find_mlx_launch,
        named_env,
        new_job_id,
    )
    from watchdog.cli.launch.supervisor import LaunchFailed, Plan, Supervisor
    from watchdog.cli.options import DIR_ENV

    if not args:  # a usage error, not an attempt that failed (exit 10, journalled)
        raise click.UsageError("nothing to launch: give mlx.launch's arguments and the "
                               "program, e.g. mlx-watchdog launch --hostfile h.json train.py")
    try:
        mlx_launch = find_mlx_launch()
    except LauncherError as err:
        raise exits.SetupError(str(err)) from None
    given = named_env(list(args), JOB_ENV)
    job = given or os.environ.get(JOB_ENV) or new_job_id()
    settings = dataclasses.replace(
        node.settings, state_dir=state_dir,
        **{k: v for k, v in options.items() if v is not None})
    record_dir = named_env(list(args), DIR_ENV) or os.environ.get(DIR_ENV) or settings.dir
    click.echo(f"mlx-watchdog: job {job}", err=True)
    plan = Plan(mlx_launch=mlx_launch, args=list(args), job=job, job_given=given is not None,
                record_dir=record_dir, settings=settings)
    try:
        sys.exit(Supervisor(plan).run())
    except LaunchFailed as err:
        raise exits.SetupError(str(err)) from None


for command in (status.status, status.watch, status.inspect, node_cmds.incidents, node_cmds.node,
                service_cmds.service, cluster_cmds.cluster):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    try:
        code = cli.main(args=argv, prog_name="mlx-watchdog", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("mlx-watchdog: aborted", err=True)
        sys.exit(exits.INTERRUPTED)
    except click.ClickException as err:
        click.echo(f"mlx-watchdog: {err.format_message()}", err=True)
        # A bare ClickException is an error, never a verdict: not click's 1.
        sys.exit(exits.SETUP if err.exit_code == 1 else err.exit_code)
    except SetupError as err:
        click.echo(f"mlx-watchdog: {err}", err=True)
        sys.exit(exits.SETUP)
    except ConfigError as err:
        click.echo(f"mlx-watchdog: {err}", err=True)
        sys.exit(exits.USAGE)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
