"""mlx-watchdog: finds MLX distributed ranks hung in a collective and ends them.

The rank-side API lives here; importing this package loads only the standard
library (psutil on `install()`), never click or prometheus_client.
"""

from .hook import Heartbeat, current, install, uninstall

__all__ = ["Heartbeat", "current", "install", "uninstall", "__version__"]
__version__ = "0.1.0"
