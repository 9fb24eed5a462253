"""mlx-watchdog: finds MLX distributed ranks hung in a collective and ends them.

The rank-side API lives here; importing this package loads only the standard
library (psutil on `install()`), never click or prometheus_client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from watchdog.rank.hook import Heartbeat, current, install, uninstall

_LAZY = ("Heartbeat", "current", "install", "uninstall")


def __getattr__(name: str) -> Any:
    # Lazy, so `import watchdog._autoload` (the .pth hook) loads nothing more until mlx does.
    if name in _LAZY:
        from watchdog.rank import hook

        return getattr(hook, name)
    raise AttributeError(f"module 'watchdog' has no attribute {name!r}")

__all__ = ["Heartbeat", "current", "install", "uninstall", "__version__"]
__version__ = "0.1.0"
