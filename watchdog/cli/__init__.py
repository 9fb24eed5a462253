"""The command-line tools: status, inspect, watch, incidents, node, doctor, demo, service.

`main` is the `mlx-watchdog` entry point. `commands.py` holds the root group and
the list of commands; each command lives in the package of what it serves:
`look/` (status, watch, inspect, cluster), `node/` (incidents, node, doctor),
`service/` (run, service), `launch/` (launch), `demo/` (demo). They load only
when called.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    """Run the command line (`mlx-watchdog`), importing the commands only now."""
    from watchdog.cli.commands import main as run

    run(argv)
