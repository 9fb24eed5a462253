"""`mlx-watchdog run`: the daemon wired to its HTTP endpoint, logs and signals."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from watchdog.daemon.config import Settings
from watchdog.daemon.lograte import RepeatFilter, RotatingStream
from watchdog.daemon.loop import Daemon
from watchdog.daemon.store import dirs
from watchdog.net.metrics import serve
from watchdog.text import OneLineFormatter


class CannotStart(Exception):
    """The daemon cannot start; the message is one sentence for the user."""


NOFILE_WANTED = 65536  # descriptors: records, pidfds, probes and HTTP of a busy node


def raise_nofile() -> str:
    """Raise the soft descriptor limit toward the hard one (systemd's default soft
    limit is 1024; launchd's 256): the daemon must not run out before a user does.
    Returns what it did, for the log once the daemon has started ("" for nothing):
    a start that fails says one line, its reason."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = NOFILE_WANTED if hard == resource.RLIM_INFINITY else min(hard, NOFILE_WANTED)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            except ValueError:
                wanted = min(wanted, 10240)  # macOS: at most OPEN_MAX below an infinite hard
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return f"raised the open-files limit from {soft} to {wanted}"
    except (ValueError, OSError) as err:
        return f"cannot raise the open-files limit: {err}"
    return ""


def run_daemon(settings: Settings, log_level: str = "info") -> None:
    """Run until SIGTERM or SIGINT; the scan loop in this thread, HTTP in its own."""
    handler = RotatingStream()  # stderr; rotated in place when a plain file (launchd)
    handler.setFormatter(OneLineFormatter("%(asctime)s mlx-watchdog %(levelname)s %(message)s"))
    handler.addFilter(RepeatFilter())  # what others can make us log is bounded
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    # Whatever umask it inherited (000 from a careless unit): nothing it creates,
    # parents of its directories included, is writable by others.
    os.umask(0o022)
    dirs.prepare(settings.dir, settings.state_dir)
    nofile = raise_nofile()
    daemon = Daemon(settings)
    try:
        server = serve(settings.listen_address, lambda: daemon.snapshot, daemon.healthy,
                       daemon.fence_request if settings.secret else None,
                       peers=settings.peers)
    except OSError as err:
        raise CannotStart(f"cannot listen on {settings.listen}: {err.strerror}") from None
    log = logging.getLogger("watchdog")
    if nofile:
        log.log(logging.WARNING if nofile.startswith("cannot") else logging.INFO, "%s", nofile)
    log.info("serving /metrics /status /healthz on http://%s:%s", *server.server_address[:2])

    def stop(signum: int, _frame: Any) -> None:
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        daemon.run()
    finally:
        server.shutdown()
