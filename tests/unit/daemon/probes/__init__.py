"""The OS probes and exit watchers of Linux and macOS."""
