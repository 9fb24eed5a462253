"""`demo`, the command (the story itself is `story.py`, loaded only when it runs)."""

from __future__ import annotations

import sys

import click

from watchdog.cli.options import Duration


@click.command()
@click.option("--ranks", type=click.IntRange(2, 8), default=3, show_default=True,
              help="Ranks of the local MLX ring job.")
@click.option("--deadline", type=Duration(1), default=4.0, show_default=True,
              help="How long a wait may last before the demo's daemon judges it hung "
                   "(seconds, or 4s, 1m, as every duration).")
@click.option("--fault", type=click.Choice(["stop", "kill", "mismatch"]), default="stop",
              show_default=True, help="Freeze a rank, kill one, or leave one waiting in "
              "a recv nobody sends.")
@click.option("--keep", is_flag=True, help="Keep the scratch directory at the end: the "
              "incident, its evidence files and the daemon's log (the ranks and the "
              "daemon are stopped either way).")
def demo(ranks: int, deadline: float, fault: str, keep: bool) -> None:
    """Run a real local MLX ring job, inject a fault, and watch the watchdog act."""
    from watchdog.cli.demo.story import run_demo

    sys.exit(run_demo(ranks=ranks, deadline=deadline, fault=fault, keep=keep))
