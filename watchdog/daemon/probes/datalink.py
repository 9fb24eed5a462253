"""A rank's data path to its peers, probed: is the network between the ranks there?

A ring rank keeps TCP connections to its neighbours (it listens on the address of
the hostfile and connects to theirs; the listeners close after init, so the
addresses are read from its established connections, not from a hostfile that exo
deletes after init). The probe opens a fresh TCP connection to each remote end
(the daemon runs next to the rank, so it takes the same route): an answer, even a
refusal, means the peer's host is reachable on that path; a connect that times out
or finds no route means it is not. An end that times out twice in a row is "down"
(once may be a full accept queue): a firewall that drops only the ranks' port shows
on the connect to that port. A local end where another user listens is no evidence
(that user may have bound the port the rank's peer released and hold its queue
full), and each user's ranks share one probe slot: another user's crowd delays a
probe by at most one probe's time.

JACCL moves its data over RDMA (Thunderbolt), MPI through its own transports (whose
TCP listener a stray connect could upset): only ring ranks are probed; the others,
and a ring rank with no TCP connection to another host, are "not probed" (the
cause then comes from the rest of the evidence).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from watchdog.backends import links_probed
from watchdog.states import Link

UP = Link.UP  # the one answer that says the path is there
# Refused or reset: a host answered on that path (nothing listens on an ephemeral port).
_ANSWERED = (errno.ECONNREFUSED, errno.ECONNRESET)
MAX_ADDRESSES = 8  # a rank with many connections: the first few tell


def peer_addresses(pid: int) -> list[tuple[str, int]]:
    """The remote ends of the rank's established TCP connections (empty: none, or they
    cannot be read)."""
    from watchdog.daemon.probes import platform_psutil

    try:
        conns = platform_psutil().Process(pid).net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    out: list[tuple[str, int]] = []
    for c in conns:
        if c.status == psutil.CONN_ESTABLISHED and c.raddr and (c.raddr.ip, c.raddr.port) \
                not in out:
            out.append((c.raddr.ip, c.raddr.port))
    return out[:MAX_ADDRESSES]


def connect(address: tuple[str, int], timeout: float) -> str:
    """"" when the host answered on this path, else how the connect failed."""
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except TimeoutError:
            return f"connect timed out after {timeout:g}s"
        except OSError as err:
            if err.errno in _ANSWERED:
                return ""
            return os_error(err)
    return ""


def os_error(err: OSError) -> str:
    """An OS error as the probe reports it: its errno's name in lower case (`econnrefused`)."""
    return (errno.errorcode.get(err.errno, str(err.errno)) if err.errno else str(err)).lower()


def listener_uid(address: tuple[str, int]) -> int | None:
    """The uid of the process listening on `address` on this host (a local end), or
    None: no listener here, or it cannot be read (one look: `listeners()` for many)."""
    return listeners()(address)


def listeners() -> Callable[[tuple[str, int]], int | None]:
    """`listener_uid` for the local ends of one probe, the tables read once. On Linux
    the uid that owns the listening socket, from the daemon's own TCP tables; elsewhere
    psutil's every connection of every process, for each end (~7 ms of CPU for 130
    processes: for each remote end of each waiting ring rank every 2 s, it was most of
    the daemon's CPU during a quiet hang on Linux)."""
    from watchdog import host

    if host.os_name() == host.LINUX and not host.simulated():
        from watchdog.daemon.probes.tcptables import tcp_listener_uid

        texts = []
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/self/net/{table}") as f:
                    texts.append(f.read())
            except OSError:
                continue

        def from_tables(address: tuple[str, int]) -> int | None:
            return next((uid for text in texts if (uid := tcp_listener_uid(
                text, address[0], address[1])) is not None), None)

        return from_tables
    return _psutil_listener_uid


def _psutil_listener_uid(address: tuple[str, int]) -> int | None:
    from watchdog.daemon.probes import platform_psutil

    ps = platform_psutil()
    ip, port = address
    try:  # (local address, status, pid) of every TCP connection
        conns = [(c.laddr, c.status, c.pid) for c in ps.net_connections(kind="tcp")]
    except (psutil.Error, OSError):
        # psutil on macOS lists every process's connections in turn and fails whole on
        # the first it may not read: each process then, the refused ones passed over.
        conns = []
        for pid in _pids(ps):
            try:
                conns += [(c.laddr, c.status, pid)
                          for c in ps.Process(pid).net_connections(kind="tcp")]
            except (psutil.Error, OSError):
                continue
    for laddr, status, pid in conns:
        if status == psutil.CONN_LISTEN and laddr and laddr.port == port \
                and laddr.ip in (ip, "0.0.0.0", "::") and pid:
            try:
                return int(ps.Process(pid).uids().real)
            except (psutil.Error, OSError):
                return None
    return None


def _pids(ps: Any) -> list[int]:
    try:
        return list(ps.pids())
    except (psutil.Error, OSError):
        return []


def probe(pid: int, timeout: float,
          addresses: Callable[[int], Iterable[tuple[str, int]]] = peer_addresses,
          connector: Callable[[tuple[str, int], float], str] = connect,
          owner: int | None = None,
          listener: Callable[[tuple[str, int]], int | None] | None = None) -> str:
    """`up`, `down <ip:port> (<how>)`, or `not probed: <why>`.

    What another user controls is no evidence against `owner`'s rank: a local end
    where another uid listens (it may have bound the port the rank's peer released,
    and hold its accept queue full) is passed over. And one timeout is not "down":
    a full accept queue drops a connect too; the end is asked again, and "down"
    only when that times out as well."""
    ends = list(addresses(pid))
    if not ends:
        return "not probed: no TCP connection to a peer (JACCL or MPI, or none yet)"
    others = 0
    if owner is not None and listener is None:
        listener = listeners()
    for address in ends:
        if owner is not None and listener is not None:
            uid = listener(address)
            if uid is not None and uid != owner:
                others += 1
                continue
        failed = connector(address, timeout)
        if failed.startswith("connect timed out"):
            failed = connector(address, timeout)  # once more: a full queue, not a path
        if failed:
            return f"{Link.DOWN} {address[0]}:{address[1]} ({failed})"
    if others == len(ends):
        return "not probed: another user listens where the rank's peers were"
    return UP


PROBE_EVERY = 2.0  # seconds between probes of one rank while it waits long
# ... and of a rank with no thread busy: no wedge to hold for a link blip (it needs a
# spinning thread), only the cause to name at its deadline.
QUIET_PROBE_EVERY = 8.0
# Probes under way at once, every rank together: any user can have many ranks wait, and
# a probe may take its timeout per remote end; past this, ranks wait for a later scan.
MAX_RUNNING = 8


class Prober:
    """Probes of waiting ranks' data paths on the daemon's workers, at most one under
    way per rank and per uid, and one every PROBE_EVERY seconds; `found` gives each rank's last
    result (its key: pid and start time)."""

    def __init__(self, submit: Callable[..., object], timeout: Callable[[], float],
                 probe_: Callable[..., str] = probe) -> None:
        # `timeout`: seconds a probe may wait for each remote end, asked as each probe
        # starts (a reload's peer_timeout reaches the next probe).
        self.submit, self.timeout, self.probe = submit, timeout, probe_
        self.asked: dict[tuple[int, float], float] = {}  # key -> when last asked
        self.found: dict[tuple[int, float], str] = {}
        self.running: set[tuple[int, float]] = set()  # probes submitted, not yet done
        self.running_uids: dict[tuple[int, float], int] = {}  # their owners

    def ask(self, key: tuple[int, float], now: float, backend: str = "ring",
            uid: int | None = None, every: float = PROBE_EVERY) -> None:
        """Probe the rank's link on a worker, unless probed lately, under way or over a bound."""
        if now - self.asked.get(key, -every) < every:
            return
        if key in self.running or len(self.running) >= MAX_RUNNING:
            return  # never a queue that grows: asked again at a later scan
        if uid is not None and uid in self.running_uids.values():
            # One probe under way per uid: another user's crowd of ranks waiting on a
            # full accept queue delays a probe by at most one probe's time.
            return
        self.asked[key] = now
        if not links_probed(backend):
            # Only the ring's sockets are known safe to knock on (backends.py): its
            # listeners close after init, while MPI's TCP transport keeps accepting.
            self.found[key] = f"not probed: the {backend or 'unknown'} backend"
            return

        def run() -> None:
            try:
                timeout = self.timeout()
                self.found[key] = (self.probe(key[0], timeout) if uid is None
                                   else self.probe(key[0], timeout, owner=uid))
            except Exception as err:  # noqa: BLE001 - a failed probe is a result
                self.found[key] = f"not probed: {err}"
            finally:
                self.running.discard(key)
                self.running_uids.pop(key, None)

        self.running.add(key)
        if uid is not None:
            self.running_uids[key] = uid
        try:
            self.submit(run)
        except RuntimeError:  # the executor is shut down: the daemon is stopping
            self.running.discard(key)
            self.running_uids.pop(key, None)

    def forget(self, keep: Iterable[tuple[int, float]]) -> None:
        """Drop what is known of every rank but `keep` (those still waiting long)."""
        keep = set(keep)
        for table in (self.asked, self.found):
            for key in [k for k in table if k not in keep]:
                table.pop(key, None)
