"""`mlx-watchdog run`: the daemon wired to its HTTP endpoint, logs and signals."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

from watchdog.daemon import dirs
from watchdog.daemon.config import Settings
from watchdog.daemon.loop import Daemon
from watchdog.net.metrics import serve
from watchdog.text import OneLineFormatter


class CannotStart(Exception):
    """The daemon cannot start; the message is one sentence for the user."""


def run_daemon(settings: Settings, log_level: str = "info") -> None:
    """Run until SIGTERM or SIGINT; the scan loop in this thread, HTTP in its own."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("%(asctime)s mlx-watchdog %(levelname)s %(message)s"))
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    dirs.prepare(settings.dir, settings.state_dir)
    daemon = Daemon(settings)
    try:
        server = serve(settings.listen_address, lambda: daemon.snapshot, daemon.healthy,
                       daemon.fence_request if settings.secret else None)
    except OSError as err:
        raise CannotStart(f"cannot listen on {settings.listen}: {err.strerror}") from None
    logging.getLogger("watchdog").info("serving /metrics /status /healthz on http://%s:%s",
                                       *server.server_address[:2])

    def stop(signum: int, _frame: Any) -> None:
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        daemon.run()
    finally:
        server.shutdown()
