"""What runs inside the user's rank process: the heartbeat hook (stdlib and psutil only)."""
