"""The node: `incidents`, `node` (reboot flag, wait-healthy), `doctor`, and the fitness
check (`health`) that `launch` and `node wait-healthy` share."""
