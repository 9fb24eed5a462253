"""A setting's text read as the user typed it: durations and sizes in Prometheus's and
systemd's units, `HOST:PORT`, and which of a file's peers are this node itself; and the
one error a bad setting raises (`ConfigError`, one sentence naming the key: exit 2). Read
by `config.py`, which re-exports them, and the CLI."""

from __future__ import annotations

import re

DEFAULT_PORT = 9753


class ConfigError(Exception):
    """A setting that cannot be used; the message is one sentence for the user."""


class SetupRefused(ConfigError):
    """The node is not set up for this (a directory missing, unwritable or unsafe, or
    another daemon on it): a setup error, exit 3, never a verdict's code."""


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` as (host, port), brackets off an IPv6 host; a `ConfigError` otherwise."""
    host, sep, port = text.rpartition(":")
    if (not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535
            or any(c.isspace() or c == "," for c in host)):
        raise ConfigError(f"listen must be HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT}), "
                          f"got {text!r}")
    return host.strip("[]"), int(port)


# Units as Prometheus and systemd users type them: 10s, 500ms, 1m30s; 1G, 512MiB.
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def parse_duration(text: str) -> float | None:
    """Seconds from "10s", "500ms", "1m30s", "2h" (units required; None if not one)."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * DURATION_UNITS[u] for n, u in parts)


def parse_size(text: str) -> float | None:
    """Bytes from "1G", "512M", "64KiB", "1GB" (powers of 1024, as systemd's); None if not."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or (text.strip()[-1:].lower() == "b" and not match.group(2)):
        return None
    return float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]


def _local_names() -> set[str]:
    """This machine's names and addresses, lower-cased: its host name (with and without
    `.local`, a Mac's), loopback, and every interface's address (psutil, no lookup)."""
    import socket

    name = socket.gethostname().lower()
    names = {name, name.split(".")[0], name.split(".")[0] + ".local", "localhost",
             "127.0.0.1", "::1", "0.0.0.0", "::"}  # noqa: S104 - compared, never bound
    try:
        import psutil

        for addrs in psutil.net_if_addrs().values():
            names.update(a.address.split("%")[0].lower() for a in addrs if a.address)
    except (ImportError, OSError):  # a host whose interfaces cannot be listed
        pass
    return names


def own_peers(listen: str, peers: tuple[str, ...]) -> tuple[str, ...]:
    """The peers that are this node's own daemon: its `listen` address itself, or (the
    same port) its host name or one of its addresses. Read from names and interfaces
    alone, never a DNS lookup (a config load must not wait on one)."""
    if not peers:
        return ()
    try:
        host_part, port = parse_listen(listen)
    except ConfigError:
        return ()
    wildcard = host_part in ("0.0.0.0", "::", "")  # noqa: S104 - compared, never bound
    local = _local_names()
    mine = []
    for peer in peers:
        try:
            peer_host, peer_port = parse_listen(peer)
        except ConfigError:
            continue
        peer_host = peer_host.lower()
        if peer_port != port:
            continue
        if peer_host == host_part.lower() or (
                peer_host in local and (wildcard or host_part.lower() in local)):
            mine.append(peer)
    return tuple(mine)
