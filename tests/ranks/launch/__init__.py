"""The launcher end to end: real ranks under `mlx-watchdog launch`, relaunched."""
