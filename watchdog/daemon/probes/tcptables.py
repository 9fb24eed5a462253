"""Linux: a process's sockets and the kernel's TCP tables as text (/proc/<pid>/fd links,
/proc/net/tcp{,6}), parsed: the sockets' queues the stack sampler reads, and who listens
on an address (the data-link probe's check). Pure but for `socket_inodes`; bounded
(MAX_SOCKETS sockets, 65,536 descriptors looked at)."""

from __future__ import annotations

import os
import socket

MAX_SOCKETS = 4096


def socket_inodes(pid: int, proc: str = "/proc") -> set[int]:
    """The inodes of the sockets the process holds open (its /proc fd links)."""
    found: set[int] = set()
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return found
    for fd in fds[:65536]:
        try:
            link = os.readlink(f"{proc}/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link.endswith("]"):
            found.add(int(link[8:-1]))
            if len(found) >= MAX_SOCKETS:
                break
    return found


def tcp_queues(text: str, inodes: set[int]) -> list[tuple[int, int, int]]:
    """(inode, tx_queue, rx_queue) of the rows of /proc/net/tcp{,6} whose inode is one
    of `inodes` ("sl local rem st tx_queue:rx_queue tr:when retrnsmt uid timeout inode")."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or not fields[9].isdigit():
            continue
        inode = int(fields[9])
        if inode in inodes:
            tx, _, rx = fields[4].partition(":")
            try:
                rows.append((inode, int(tx, 16), int(rx, 16)))
            except ValueError:
                continue
    return rows


def _address(hex_address: str) -> str:
    """/proc/net/tcp's local address ("0100007F" or 32 hex digits): the IP as text."""
    raw = bytes.fromhex(hex_address)
    # Each 32-bit word is in the kernel's byte order (little-endian here).
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def tcp_listener_uid(text: str, ip: str, port: int) -> int | None:
    """The uid owning a socket that listens on `ip:port` (or on every address) in the
    rows of /proc/net/tcp{,6}; None when none does."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":  # TCP_LISTEN
            continue
        local, _, hex_port = fields[1].partition(":")
        try:
            if int(hex_port, 16) != port or _address(local) not in (ip, "0.0.0.0", "::"):
                continue
            return int(fields[7])
        except (ValueError, OSError):
            continue
    return None
