"""The `mlx-watchdog` command: the root group, the list of its commands, and `main()`.

A command is a module-level `@click.command()` (or a `@click.group()` with its
subcommands) in the package of what it serves: `look/` (status, watch,
inspect, cluster), `node/` (incidents, node, doctor), `service/` (run,
service), `launch/` (launch), `demo/` (demo). It imports anything heavier than
click and `cli/options.py` inside its body, so `--help` stays quick, and it is
listed once in COMMANDS below. No command is defined here.

Every error the user can cause ends as one line on stderr and a non-zero exit:
`main()` runs click without its standalone handling and prints exceptions
itself.
"""

from __future__ import annotations

import sys

import click

from watchdog import __version__
from watchdog.cli import exits
from watchdog.cli.demo import commands as demo_cmds
from watchdog.cli.launch import commands as launch_cmds
from watchdog.cli.look import cluster as cluster_cmds
from watchdog.cli.look import status
from watchdog.cli.node import commands as node_cmds
from watchdog.cli.options import Commands, Node
from watchdog.cli.service import commands as service_cmds
from watchdog.cli.service.unit import DEFAULT_CONFIG
from watchdog.daemon.config import ConfigError, SetupRefused
from watchdog.text import printable


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Every duration takes seconds or a unit (500ms, 90s, 2m, 1h); shell "
                    "completion: see the README.")
@click.version_option(__version__, "-V", "--version", prog_name="mlx-watchdog")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="MLX_WATCHDOG_CONFIG",
              help=f"The node's config file, for the directories and peers of every command "
                   f"[default: {DEFAULT_CONFIG} when present].")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Find MLX distributed ranks hung in a collective, and end them safely."""
    from watchdog import host

    refused = host.simulation_refused() if host.simulated() else None
    if refused:
        raise exits.SetupError(refused)
    ctx.obj = Node(config_path)


COMMANDS: tuple[click.Command, ...] = (
    status.status, status.watch, status.inspect, cluster_cmds.cluster,  # looking
    node_cmds.incidents, node_cmds.node, node_cmds.doctor,  # the node
    service_cmds.run, service_cmds.service,  # the service
    launch_cmds.launch, demo_cmds.demo,  # launching, and the demo
)
for command in COMMANDS:
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Run the command line and turn every error into one line and its exit code."""
    try:
        code = cli.main(args=argv, prog_name="mlx-watchdog", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("mlx-watchdog: aborted", err=True)
        sys.exit(exits.INTERRUPTED)
    except click.ClickException as err:
        click.echo(f"mlx-watchdog: {printable(err.format_message())}", err=True)
        # A bare ClickException is an error, never a verdict: not click's 1.
        sys.exit(exits.SETUP if err.exit_code == 1 else err.exit_code)
    except SetupRefused as err:
        click.echo(f"mlx-watchdog: {printable(err)}", err=True)
        sys.exit(exits.SETUP)
    except ConfigError as err:
        click.echo(f"mlx-watchdog: {printable(err)}", err=True)
        sys.exit(exits.USAGE)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
