"""Every TCP socket's queues and byte counters, from the kernel's sock_diag netlink
(Linux's `ss -ti`, without the shell-out).

One dump (`SOCK_DIAG_BY_FAMILY` over NETLINK_INET_DIAG, IPv4 then IPv6, with the
`INET_DIAG_INFO` extension: `struct tcp_info`) gives, for each socket of the caller's
network namespace, its inode, its queues (bytes queued to send, bytes received and
not read: as /proc/net/tcp's columns) and two counters that only grow while bytes
move: `tcpi_bytes_acked` (sent and acknowledged by the peer) and
`tcpi_bytes_received`. A link moving bytes at any rate moves one of them between two
reads, where the queues of a slow but healthy transfer can read the same twice.

Layouts, from include/uapi/linux/{netlink,inet_diag,sock_diag,tcp}.h:

    nlmsghdr         len u32, type u16, flags u16, seq u32, pid u32          (16 bytes)
    inet_diag_req_v2 family u8, protocol u8, ext u8, pad u8, states u32,
                     sockid (48 bytes)                                       (56 bytes)
    inet_diag_msg    family u8, state u8, timer u8, retrans u8, sockid (48),
                     expires u32, rqueue u32, wqueue u32, uid u32, inode u32 (72 bytes)
    rtattr           len u16, type u16, then the payload, padded to 4
    tcp_info         ... tcpi_bytes_acked u64 at 120, tcpi_bytes_received u64 at 128
                     (Linux 4.1/4.2; an older kernel's shorter struct: no counters)

The dump reads the caller's namespace only: a rank in another one is read from
/proc/PID/net/tcp (queues only). A namespace with very many sockets is cut at
MAX_DUMP bytes: then nothing is returned (unknown), never a partial table that would
read as sockets gone.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import NamedTuple

NETLINK_INET_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
TCPF_ALL_BUT_LISTEN = 0xFFF & ~(1 << 10)  # TCP_LISTEN = 10: a listener moves nothing

HEADER = struct.Struct("=IHHII")
REQUEST = struct.Struct("=BBBxI48x")
MESSAGE = struct.Struct("=BBBB48xIIIII")
ATTR = struct.Struct("=HH")
COUNTERS = struct.Struct("=QQ")
COUNTERS_AT = 120  # offsetof(struct tcp_info, tcpi_bytes_acked)
MAX_DUMP = 16 << 20  # ~200k sockets' worth: past it the table is not read at all


class TcpRow(NamedTuple):
    """One socket's reading: its queues now and its counters since it opened."""

    tx_queue: int
    rx_queue: int
    bytes_acked: int | None  # None: the kernel's tcp_info has no counters
    bytes_received: int | None


class DiagError(OSError):
    """The dump could not be taken (no sock_diag, refused, or too large)."""


def request(family: int, seq: int) -> bytes:
    """One dump request for every non-listening TCP socket of `family`, with tcp_info."""
    body = REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1),
                        TCPF_ALL_BUT_LISTEN)
    return HEADER.pack(HEADER.size + len(body), SOCK_DIAG_BY_FAMILY,
                       NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def parse(data: bytes, rows: dict[int, TcpRow]) -> bool:
    """Add the sockets of one netlink read to `rows`; True once the dump is done."""
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind, _, _, _ = HEADER.unpack_from(data, offset)
        if length < HEADER.size or offset + length > len(data):
            raise DiagError(errno.EBADMSG, "a truncated netlink message")
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, offset + HEADER.size)[0]
            raise DiagError(code, os.strerror(code) if code else "netlink error")
        if kind == SOCK_DIAG_BY_FAMILY and length >= HEADER.size + MESSAGE.size:
            start = offset + HEADER.size
            _, _, _, _, _, rqueue, wqueue, _, inode = MESSAGE.unpack_from(data, start)
            rows[inode] = TcpRow(wqueue, rqueue, *_counters(data, start + MESSAGE.size,
                                                            offset + length))
        offset += (length + 3) & ~3
    return False


def _counters(data: bytes, at: int, end: int) -> tuple[int | None, int | None]:
    """tcp_info's two byte counters from the message's attributes, or (None, None)."""
    while at + ATTR.size <= end:
        length, kind = ATTR.unpack_from(data, at)
        if length < ATTR.size:
            break
        if kind == INET_DIAG_INFO and length - ATTR.size >= COUNTERS_AT + COUNTERS.size:
            acked, received = COUNTERS.unpack_from(data, at + ATTR.size + COUNTERS_AT)
            return acked, received
        at += (length + 3) & ~3
    return None, None


def dump() -> dict[int, TcpRow]:
    """Every non-listening TCP socket of this network namespace, by inode. Raises
    DiagError when the kernel cannot be asked or the dump exceeds MAX_DUMP."""
    rows: dict[int, TcpRow] = {}
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_INET_DIAG)
    except OSError as err:
        raise DiagError(err.errno, f"no sock_diag: {err.strerror}") from err
    with sock:
        sock.settimeout(1.0)
        read = 0
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            try:
                sock.sendto(request(family, seq), (0, 0))
                done = False
                while not done:
                    data = sock.recv(1 << 16)
                    read += len(data)
                    if read > MAX_DUMP:
                        raise DiagError(errno.E2BIG, f"over {MAX_DUMP} bytes of sockets")
                    done = not data or parse(data, rows)
            except DiagError:
                raise
            except OSError as err:
                raise DiagError(err.errno, f"sock_diag: {err.strerror or err}") from err
    return rows
