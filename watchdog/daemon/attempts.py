"""Which attempt of its job a rank is: `mlx-watchdog launch` numbers each launch of a
job in MLX_WATCHDOG_ATTEMPT (1, 2, ...), which mlx.launch exports to every rank.

The record has no field for it (its layout is versioned and shared with the
hook), so the daemon reads the variable from the rank's environment once, when
it first sees the rank. Reading another user's environment takes root (the
daemon's usual privilege); without it, or with no such variable, the attempt
is unknown (None) and nothing else changes.
"""

from __future__ import annotations

import psutil

ATTEMPT_ENV = "MLX_WATCHDOG_ATTEMPT"
MAX_ATTEMPT = 1_000_000


def parse(raw: str | None) -> int | None:
    """An attempt number as the launcher writes it, else None."""
    if raw is None or not raw.isdigit():
        return None
    number = int(raw)
    return number if 0 < number < MAX_ATTEMPT else None


def attempt_of(pid: int) -> int | None:
    """The attempt number in the process's environment; None when unknown or unreadable."""
    from watchdog.daemon.probes import platform_psutil

    ps = platform_psutil()
    try:
        return parse(ps.Process(pid).environ().get(ATTEMPT_ENV))
    except (psutil.Error, OSError, ValueError):
        return None  # gone, not ours to read, or unreadable: the attempt is unknown
