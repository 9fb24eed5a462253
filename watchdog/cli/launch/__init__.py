"""Launching: `launch`, the command (commands.py), a thin click command; the launcher
itself (the attempts, the decision, the child's streams, the job id) is `watchdog/launch/`."""
