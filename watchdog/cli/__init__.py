"""The command-line tools: status, inspect, watch, incidents, node, doctor, demo, service.

`main` is the `mlx-watchdog` entry point; the commands themselves live in
`commands.py` and load only when called.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    from watchdog.cli.commands import main as run

    run(argv)
