"""The hook inside real ranks: what the records show, entry points, launchers."""
