"""`python -m watchdog.cli`: the same as the `mlx-watchdog` command."""

from watchdog.cli import main

main()
