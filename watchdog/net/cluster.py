"""Asking the nodes: every peer's `/status`, concurrently, within a timeout each.

Only the asking: what the answers say of each job is judged, purely, in
`daemon/judge/cluster.py` (`cluster status` and the daemon both judge there).

Each exchange with a peer (its connect, our request, its head and body) has a
TOTAL bound of its own (`exchange`): a socket timeout bounds one read, and a
peer answering a byte every half second under it would hold the asker for ever.
Each peer is asked on a thread of its own (`each`), waited for no longer than
the bound: one peer never delays, voids or queues another's answer.

`/status` is open to anyone, and anything answering at a peer's address could say
"rank 1 waits" while rank 1 computes. So a daemon with the shared secret asks with a
fresh nonce (`NONCE`), a daemon with the secret signs its answer over that nonce and
the body (`SIGNATURE`, HMAC-SHA256 over "status.<nonce>.<body>": a recorded answer
cannot be replayed), and an answer that is not signed so reads as no answer
(`fetch` with a secret): only what a peer holding the secret said can make a
cross-node wedge (issue 48, defect 3).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import io
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from watchdog.cause import REFUSED
from watchdog.status import NodeAnswer, NodeStatus

__all__ = ["MAX_STATUS_BYTES", "NONCE", "SIGNATURE", "each", "exchange", "fetch", "gather",
           "sign_status"]

MAX_STATUS_BYTES = 16 << 20
MAX_HEAD_BYTES = 64 << 10  # an answer's status line and headers
NONCE = "X-MLX-Watchdog-Nonce"  # the asker's fresh nonce, which the answer is signed over
SIGNATURE = "X-MLX-Watchdog-Signature"  # (fence.py signs its requests under the same name)
MAX_NONCE = 64  # characters of a nonce a server signs over (ours are 32)
SLACK = 0.1  # seconds past a peer's bound its thread is waited for (it ends by then)
T = TypeVar("T")


class _Received:
    """What a peer sent, as the socket `http.client` parses an answer from."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, *_args: object, **_kwargs: object) -> io.BytesIO:
        """The answer's bytes as a file, for `http.client` to parse."""
        return io.BytesIO(self._data)


def _split(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    return host.strip("[]"), int(port)


def sign_status(secret: str, nonce: str, body: bytes) -> str:
    """The signature of a `/status` answer `body` to the question carrying `nonce`."""
    return hmac.new(secret.encode(), b"status." + nonce.encode("utf-8", "surrogatepass")
                    + b"." + body, hashlib.sha256).hexdigest()


def exchange(peer: str, path: str, timeout: float, cap: int, *, body: bytes | None = None,
             headers: dict[str, str] | None = None,
             answer_headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One HTTP exchange with `peer` (HOST:PORT), GET, or POST of `body`: its status
    and body, all of it within `timeout` seconds from now (connect to last byte;
    TimeoutError past it), and at most `cap` bytes of body (ValueError past it).
    `answer_headers`, if given, receives the answer's headers."""
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
    if answer_headers is not None:
        answer_headers.update(response.getheaders())
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


def fetch(peer: str, timeout: float, secret: str | None = None) -> NodeAnswer:
    """One node's `/status`, read through the contract, or why it could not be had
    (all of it within `timeout` seconds). With `secret`, an answer not signed with it
    over a fresh nonce is no answer."""
    try:
        nonce = os.urandom(16).hex()
        said: dict[str, str] = {}
        status, body = exchange(peer, "/status", timeout, MAX_STATUS_BYTES,
                                headers={NONCE: nonce} if secret else None, answer_headers=said)
        if status != 200:
            raise ValueError(f"HTTP {status}")
        if secret:
            given = next((v for k, v in said.items() if k.lower() == SIGNATURE.lower()), "")
            if not hmac.compare_digest(sign_status(secret, nonce, body).encode(),
                                       given.encode("utf-8", "replace")):
                raise ValueError(REFUSED)
        answer = json.loads(body)
        if not isinstance(answer, dict) or not isinstance(answer.get("ranks"), list):
            raise ValueError("not an mlx-watchdog /status")
        return NodeAnswer(peer, True, NodeStatus.from_json(answer))
    except Exception as err:  # noqa: BLE001 - an unreachable node is a result
        return NodeAnswer(peer, False, error=str(err) or type(err).__name__)


def gather(peers: Sequence[str], timeout: float, secret: str | None = None) -> list[NodeAnswer]:
    """Every peer's answer, in the order given, all within `timeout` (+ SLACK); with
    `secret`, only signed answers are answers (`fetch`)."""
    return each(peers, lambda p: fetch(p, timeout, secret), timeout,
                lambda p: NodeAnswer(p, False, error=f"no answer within {timeout:g}s"))
