"""The launcher, a program of its own: `mlx-watchdog launch` runs as the job's parent,
runs mlx.launch with one job id and relaunches a torn-down job (`supervisor` runs the
attempts, `relaunch` decides, `childio` carries the child's streams and signals,
`launcher` finds mlx.launch and names the job, `health` is the node's fitness for an
attempt, `codes` its exit codes). The command is a thin click command in `cli/launch/`.

It may import the daemon's parts it reads (the settings, the record directory, the
daemon's files and snapshot), `net` and the contracts; neither the daemon nor `net`
imports it, and it imports nothing of `cli`.
"""
