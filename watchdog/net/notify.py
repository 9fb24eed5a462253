"""The systemd notify protocol (sd_notify(3)), with no dependency.

This module owns the two things the daemon says to systemd: `READY=1` once it
is up and `WATCHDOG=1` after every scan that completed, each a single datagram
to the AF_UNIX socket named by `$NOTIFY_SOCKET` (a path, or an abstract socket
when it starts with `@`). Outside systemd the variable is unset and every call
is a cheap no-op. Nothing here raises: a supervisor that cannot be reached
must never take the watchdog down with it.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

logger = logging.getLogger(__name__)

# A blocked send (the manager's queue full, PID 1 busy) must not stall the
# scan loop; a missed ping is recovered by the next one.
_SEND_TIMEOUT_SECONDS = 1.0


def notify(message: str, env: Mapping[str, str] = os.environ) -> bool:
    """Send `message` (e.g. "READY=1") to the service manager.

    Returns True when the datagram was sent, False when there is no
    `$NOTIFY_SOCKET` or sending failed (logged at debug level).
    """
    address = env.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        # Linux abstract namespace: the name starts with a NUL byte.
        target = "\0" + address[1:]
    elif address.startswith("/"):
        target = address
    else:
        # Newer systemd may hand out vsock: addresses; we only speak AF_UNIX.
        logger.debug("NOTIFY_SOCKET %r is not an AF_UNIX address; not notifying", address)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.settimeout(_SEND_TIMEOUT_SECONDS)
            sock.sendto(message.encode("utf-8"), target)
    except (OSError, ValueError) as err:
        # ValueError: a message or address Python refuses to encode.
        logger.debug("sd_notify %r to %r failed: %s", message, address, err)
        return False
    return True


def watchdog_interval(env: Mapping[str, str] = os.environ) -> float | None:
    """Seconds within which systemd expects `WATCHDOG=1`, or None if it does not.

    Reads `$WATCHDOG_USEC`; when `$WATCHDOG_PID` is set the timeout is meant for
    that process only, so a child that inherited the environment gets None.
    Callers should ping at half this interval, as sd_watchdog_enabled(3) advises.
    """
    watchdog_pid = env.get("WATCHDOG_PID")
    if watchdog_pid is not None and watchdog_pid.strip() != str(os.getpid()):
        return None
    usec = env.get("WATCHDOG_USEC")
    if usec is None:
        return None
    try:
        microseconds = int(usec)
    except ValueError:
        logger.debug("ignoring WATCHDOG_USEC=%r: not an integer", usec)
        return None
    if microseconds <= 0:
        return None
    return microseconds / 1_000_000
