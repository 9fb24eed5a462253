"""Asking the nodes: every peer's `/status`, concurrently, within a timeout each.

Only the asking: what the answers say of each job is judged, purely, in
`daemon/judge/cluster.py` (`cluster status` and the daemon both judge there).

Each exchange with a peer (its connect, our request, its head and body) has a
TOTAL bound of its own (`exchange`): a socket timeout bounds one read, and a
peer answering a byte every half second under it would hold the asker for ever.
Each peer is asked on a thread of its own (`each`), waited for no longer than
the bound: one peer never delays, voids or queues another's answer.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from watchdog.status import NodeAnswer, NodeStatus

__all__ = ["MAX_STATUS_BYTES", "each", "exchange", "fetch", "gather"]

MAX_STATUS_BYTES = 16 << 20
MAX_HEAD_BYTES = 64 << 10  # an answer's status line and headers
SLACK = 0.1  # seconds past a peer's bound its thread is waited for (it ends by then)
T = TypeVar("T")


class _Received:
    """What a peer sent, as the socket `http.client` parses an answer from."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, *_args: object, **_kwargs: object) -> io.BytesIO:
        return io.BytesIO(self._data)


def _split(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    return host.strip("[]"), int(port)


def exchange(peer: str, path: str, timeout: float, cap: int, *, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One HTTP exchange with `peer` (HOST:PORT), GET, or POST of `body`: its status
    and body, all of it within `timeout` seconds from now (connect to last byte;
    TimeoutError past it), and at most `cap` bytes of body (ValueError past it)."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no whole answer within {timeout:g}s")
        return remaining

    host, port = _split(peer)
    lines = [f"{'GET' if body is None else 'POST'} {path} HTTP/1.1", f"Host: {peer}",
             "Connection: close", "Accept-Encoding: identity"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    received = bytearray()
    try:
        with socket.create_connection((host, port), timeout=left()) as sock:
            sock.settimeout(left())
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
            while chunk := _recv(sock, left()):
                received += chunk
                if len(received) > cap + MAX_HEAD_BYTES:
                    raise ValueError(f"answer larger than {cap} bytes")
    except TimeoutError:
        raise TimeoutError(f"no whole answer within {timeout:g}s") from None
    response = http.client.HTTPResponse(_Received(bytes(received)))  # type: ignore[arg-type]
    response.begin()
    return response.status, response.read()


def _recv(sock: socket.socket, remaining: float) -> bytes:
    sock.settimeout(remaining)
    return sock.recv(1 << 16)


def each(peers: Sequence[str], ask: Callable[[str], T], timeout: float,
         late: Callable[[str], T]) -> list[T]:
    """`ask(peer)` for every peer at once, each on a thread of its own; in the
    order given. One that has not returned `timeout` (+ SLACK) seconds from now
    is `late(peer)`; its thread is left to end by its own bound (a daemon thread:
    it never holds the process's exit)."""
    results: dict[int, T] = {}
    done = threading.Condition()

    def run(n: int, peer: str) -> None:
        result = ask(peer)
        with done:
            results[n] = result
            done.notify_all()

    until = time.monotonic() + timeout + SLACK
    for n, peer in enumerate(peers):
        threading.Thread(target=run, args=(n, peer), name=f"peer-{peer}", daemon=True).start()
    with done:
        while len(results) < len(peers) and (left := until - time.monotonic()) > 0:
            done.wait(left)
        return [results[n] if n in results else late(peer) for n, peer in enumerate(peers)]


def fetch(peer: str, timeout: float) -> NodeAnswer:
    """One node's `/status`, read through the contract, or why it could not be had
    (all of it within `timeout` seconds)."""
    try:
        status, body = exchange(peer, "/status", timeout, MAX_STATUS_BYTES)
        if status != 200:
            raise ValueError(f"HTTP {status}")
        answer = json.loads(body)
        if not isinstance(answer, dict) or not isinstance(answer.get("ranks"), list):
            raise ValueError("not an mlx-watchdog /status")
        return NodeAnswer(peer, True, NodeStatus.from_json(answer))
    except Exception as err:  # noqa: BLE001 - an unreachable node is a result
        return NodeAnswer(peer, False, error=str(err) or type(err).__name__)


def gather(peers: Sequence[str], timeout: float) -> list[NodeAnswer]:
    """Every peer's answer, in the order given, all within `timeout` (+ SLACK)."""
    return each(peers, lambda p: fetch(p, timeout), timeout,
                lambda p: NodeAnswer(p, False, error=f"no answer within {timeout:g}s"))
