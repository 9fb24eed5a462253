"""`mlx-watchdog demo`: a real local MLX ring job, a real daemon, an injected fault: the
story (`story.py`), its processes (`job.py`), the incident as told (`report.py`), its
rank program (`rank.py`)."""
