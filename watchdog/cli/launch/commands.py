"""`launch`, the command: its flags are the launch keys of the settings."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from watchdog.cli.exits import SetupError
from watchdog.cli.options import Node, state_option
from watchdog.daemon.config import LaunchSettings


def _launch_options(f: Any) -> Any:
    """The launch keys of the settings as flags of `launch` (the config file's keys too)."""
    from watchdog.cli.options import SettingType
    from watchdog.daemon.config import LAUNCH_KEYS, SPECS

    defaults = LaunchSettings()
    for key in reversed(LAUNCH_KEYS):
        f = click.option("--" + key.replace("_", "-"), key, type=SettingType(key),
                         help=f"{SPECS[key].help.removeprefix('launch: ')} "
                              f"[default: {getattr(defaults, key)}]")(f)
    return f


@click.command(context_settings={"ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@state_option
@_launch_options
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def launch(node: Node, /, state_dir: str, args: tuple[str, ...], **options: Any) -> None:
    """mlx.launch ARGS with one MLX_WATCHDOG_JOB on every rank; relaunch it when torn down.

    Exit status: 0 every rank exited 0; 10 a rank failed or crashed; 11 the
    watchdog or a fence ended the job; 12 refused (node flagged for reboot, or
    wired memory not back); 13 gave up (no progress); 130 interrupted (143 by
    SIGTERM); 2 a bad option; 3 mlx-watchdog itself could not launch (no mlx.launch).
    """
    import dataclasses

    from watchdog.cli.options import DIR_ENV
    from watchdog.launch.launcher import (
        JOB_ENV,
        LauncherError,
        find_mlx_launch,
        named_env,
        new_job_id,
    )
    from watchdog.launch.supervisor import LaunchFailed, Plan, Supervisor

    if not args:  # a usage error, not an attempt that failed (exit 10, journalled)
        raise click.UsageError("nothing to launch: give mlx.launch's arguments and the "
                               "program, e.g. mlx-watchdog launch --hostfile h.json train.py")
    try:
        mlx_launch = find_mlx_launch()
    except LauncherError as err:
        raise SetupError(str(err)) from None
    given = named_env(list(args), JOB_ENV)
    job = given or os.environ.get(JOB_ENV) or new_job_id()
    settings = dataclasses.replace(node.settings, state_dir=state_dir)
    launching = dataclasses.replace(node.launch,
                                    **{k: v for k, v in options.items() if v is not None})
    record_dir = named_env(list(args), DIR_ENV) or os.environ.get(DIR_ENV) or settings.dir
    click.echo(f"mlx-watchdog: job {job}", err=True)
    plan = Plan(mlx_launch=mlx_launch, args=list(args), job=job, job_given=given is not None,
                record_dir=record_dir, settings=settings, launch=launching,
                dir_given=named_env(list(args), DIR_ENV) is not None)
    try:
        sys.exit(Supervisor(plan).run())
    except LaunchFailed as err:
        raise SetupError(str(err)) from None
