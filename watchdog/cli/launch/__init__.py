"""Launching: `launch` runs mlx.launch with one job id and relaunches a torn-down job
(`supervisor` runs the attempts, `relaunch` decides, `childio` carries the child's
streams and signals, `launcher` finds mlx.launch and names the job)."""
