"""`demo`, the command (the story itself is `story.py`, loaded only when it runs)."""

from __future__ import annotations

import sys

import click


@click.command()
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
