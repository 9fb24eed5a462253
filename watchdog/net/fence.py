"""Job fences between nodes: "job J is dead, end your ranks of it now".

The one request that changes state, so it is off unless a shared secret is
configured. A fence is a JSON body POSTed to a peer's `/fence`, signed with
HMAC-SHA256 over "<timestamp>.<body>"; the body names the job by its owner's
uid and its id (a job id alone is anyone's to claim) and carries a random
nonce. A
receiver accepts it only with a valid signature, a timestamp within
`WINDOW` seconds of its own clock and not before the receiver started, and a
nonce it has not seen in that window. The nonces it accepted are kept on disk
(`<state-dir>/fence-nonces.jsonl`) for twice the window, so a restart does not
forget them: comparing the sender's timestamp with the receiver's start alone
lets the same bytes in again when the sender's clock is ahead. If the file
cannot be read at start, every fence is refused for that long instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import threading
import time
from collections import OrderedDict
from typing import Any

from watchdog.files import open_regular
from watchdog.net import cluster
from watchdog.status import Culprit, Fence, FenceAnswer, FenceSent

WINDOW = 30.0  # seconds a fence stays valid; node clocks must agree this well (NTP)
MAX_BODY = 64 << 10
SIGNATURE = "X-MLX-Watchdog-Signature"
TIMESTAMP = "X-MLX-Watchdog-Timestamp"


# `doctor` proving the secret with a peer: it sends a random challenge in this header,
# unsigned (no signed fence goes to a peer before it has proven the secret), and the
# peer answers with `proof(secret, challenge)`. A job name is no key: no job a user
# can name is told apart from any other (issue 57, item 10).
CHALLENGE = "X-MLX-Watchdog-Challenge"
_PROOF_KEY = b"mlx-watchdog: a peer's proof that it holds the fence secret"


def sender_words(address: str, body: bytes) -> str:
    """Who sent a request, for the log: its address, and the name its body claims
    (unverified: said as a claim)."""
    claimed = None
    try:
        data = json.loads(body[:MAX_BODY])
        if isinstance(data, dict) and isinstance(data.get("origin"), str):
            claimed = data["origin"][:80]
    except (ValueError, RecursionError):  # an unverified body: anything (deep nesting too)
        pass
    where = address or "an unknown address"
    return f"{where} (which says it is {claimed})" if claimed else where


def rejection_words(why: str) -> str:
    """A refusal's reason with what it means and what fixes it."""
    if why == "bad signature":
        return ("bad signature: the sender's secret differs from this node's (or the "
                "request was forged); set the same secret on every node, then reload each "
                "(SIGHUP); `mlx-watchdog doctor` on the sender proves it")
    if why.startswith("stale timestamp"):
        return f"{why}: the two clocks differ by more than {WINDOW:g}s; sync them (NTP)"
    return why


class FenceRejected(Exception):
    """Why a fence request was refused (the HTTP handler answers 401/400)."""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The fence's HMAC-SHA256 over its timestamp and body, in hex."""
    return hmac.new(secret.encode(), timestamp.encode("utf-8", "surrogatepass") + b"." + body,
                    hashlib.sha256).hexdigest()


def make(secret: str, job: str, origin: str, reason: str, culprit: Culprit | None,
         now: float | None = None, uid: int = 0, since: float | None = None,
         term_at: float | None = None, incident: str | None = None
         ) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one fence request: end `uid`'s ranks of `job` that
    started before `since` (when the job was found dead; by default, now): frozen at
    once, SIGTERMed at `term_at` (wall time; by default, at once); `incident`: the
    sender's incident of the job (where its evidence is)."""
    now = time.time() if now is None else now
    term_in = None if term_at is None else round(max(0.0, term_at - now), 3)
    body = json.dumps(Fence(job=job, uid=uid, origin=origin, reason=reason, culprit=culprit,
                            nonce=os.urandom(16).hex(), time=now,
                            since=now if since is None else since,
                            term_in=term_in, incident=incident).to_json(),
                      sort_keys=True).encode()
    timestamp = f"{now:.3f}"
    return body, {"Content-Type": "application/json", TIMESTAMP: timestamp,
                  SIGNATURE: sign(secret, timestamp, body)}


NONCES = "fence-nonces.jsonl"
COMPACT_EVERY = 1000  # appended lines before the file is rewritten with the live ones


class NonceCache:
    """Nonces seen within the window; bounded, oldest forgotten first.

    With `path`, each accepted nonce is also appended there (one JSON line, fsynced)
    and the fresh ones are read back at start, so a restarted receiver still knows
    them. `blind_until` (wall time) is set when that file could not be read: until
    then the caller refuses every fence.
    """

    def __init__(self, limit: int = 100_000, path: str | None = None,
                 now: float | None = None) -> None:
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()
        self._path = path
        self._appended = 0
        self.blind_until = 0.0
        if path is not None:
            self._load(path, time.time() if now is None else now)

    def _load(self, path: str, now: float) -> None:
        try:
            with os.fdopen(open_regular(path), "rb") as f:
                lines = f.read(64 << 20).splitlines()
        except FileNotFoundError:
            return
        except OSError:
            self.blind_until = now + 2 * WINDOW  # what it held is unknown: refuse meanwhile
            return
        for line in lines:
            try:
                nonce, seen = json.loads(line)
            except (ValueError, TypeError):
                continue  # a torn last line: its fence was not acknowledged
            if isinstance(nonce, str) and isinstance(seen, (int, float)) \
                    and seen >= now - 2 * WINDOW:
                self._seen[nonce] = float(seen)
        self._compact()

    def _compact(self) -> None:
        """Rewrite the file with the nonces still in the window (atomic)."""
        assert self._path is not None
        tmp = self._path + ".tmp"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # whatever is there (ours from a cut run, or planted)
            fd = open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                for nonce, seen in self._seen.items():
                    f.write(json.dumps([nonce, seen]) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
            self._appended = 0
        except OSError:
            return  # the appended file still holds them all

    def _persist(self, nonce: str, now: float) -> None:
        assert self._path is not None
        fd = open_regular(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps([nonce, now]) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._appended += 1
        if self._appended >= COMPACT_EVERY:
            self._compact()

    def add(self, nonce: str, now: float) -> bool:
        """False if the nonce was already used (a replay), or cannot be kept.

        A nonce that cannot be written down is refused: accepted, it could be
        replayed after the next restart."""
        with self._lock:
            while self._seen and (next(iter(self._seen.values())) < now - 2 * WINDOW
                                  or len(self._seen) >= self._limit):
                self._seen.popitem(last=False)
            if nonce in self._seen:
                return False
            if self._path is not None:
                try:
                    self._persist(nonce, now)
                except OSError as err:
                    raise FenceRejected(f"cannot keep the nonce ({err.strerror})") from None
            self._seen[nonce] = now
            return True


def verify(secret: str, headers: Any, body: bytes, nonces: NonceCache,
           now: float | None = None, not_before: float | None = None) -> Fence:
    """The fence's content if the request is authentic and fresh; else FenceRejected."""
    now = time.time() if now is None else now
    timestamp, signature = headers.get(TIMESTAMP, ""), headers.get(SIGNATURE, "")
    if not timestamp or not signature:
        raise FenceRejected("unsigned request")
    # Bytes, not str: compare_digest refuses non-ASCII text, which a header may hold.
    given = signature.encode("utf-8", "surrogatepass")
    if not hmac.compare_digest(sign(secret, timestamp, body).encode(), given):
        raise FenceRejected("bad signature")
    try:
        sent = float(timestamp)
    except ValueError:
        raise FenceRejected("bad timestamp") from None
    if not abs(now - sent) <= WINDOW:
        raise FenceRejected(f"stale timestamp ({now - sent:+.1f}s)")
    if now < nonces.blind_until:
        raise FenceRejected("the nonces seen before this daemon started are unknown; "
                            "fences are refused until they would be stale")
    if not_before is not None and sent < not_before:
        # The nonce cache lives in memory: a fence signed before this receiver
        # started may have been seen by its previous run, so it is replayable.
        raise FenceRejected("signed before this daemon started")
    try:
        data = json.loads(body)
    except ValueError:
        raise FenceRejected("body is not JSON") from None
    try:
        fence = Fence.from_json(data)
    except ValueError as err:
        raise FenceRejected(str(err)) from None
    if not nonces.add(fence.nonce, now):
        raise FenceRejected("replayed nonce")
    # On our clock: the sender's `since` is its wall time, and its clock may be off
    # ours by up to the window. How long before signing it found the job dead is
    # measured on its clock alone (skew cancels); that age is taken back from now.
    age = max(0.0, sent - (fence.since if fence.since is not None else sent))
    return dataclasses.replace(fence, time=now, since=now - age)


def post(peer: str, body: bytes, headers: dict[str, str], timeout: float) -> FenceSent:
    """One fence to one peer and its answer, all of it within `timeout` seconds."""
    try:
        code, answer = cluster.exchange(peer, "/fence", timeout, MAX_BODY, body=body,
                                        headers=headers)
        try:
            return FenceSent(peer, FenceAnswer.from_json(json.loads(answer)))
        except (ValueError, TypeError):
            return FenceSent(peer, error=f"HTTP {code}")
    except Exception as err:  # noqa: BLE001 - an unreachable peer is a result
        return FenceSent(peer, error=str(err) or type(err).__name__)


def proof(secret: str, challenge: str) -> str:
    """A peer's answer to a challenge: an HMAC under a key derived from the secret for
    this alone, so a proof can never be a fence's signature (nor the other way)."""
    key = hmac.new(secret.encode(), _PROOF_KEY, hashlib.sha256).digest()
    return hmac.new(key, challenge.encode("utf-8", "surrogatepass"),
                    hashlib.sha256).hexdigest()


def challenged(headers: Any) -> str | None:
    """The challenge of an unsigned request that asks for a proof (`doctor`), or None."""
    challenge = headers.get(CHALLENGE, "")
    if not challenge or headers.get(SIGNATURE, ""):
        return None
    if len(challenge) != 32 or any(c not in "0123456789abcdef" for c in challenge):
        raise FenceRejected("a challenge is 32 hex digits")
    return str(challenge)


def prove(peer: str, secret: str, origin: str, timeout: float) -> tuple[FenceSent, bool]:
    """Ask one peer (`doctor`) to prove it holds our secret: a random challenge, sent
    unsigned (an answerer that cannot prove the secret is handed nothing signed); its
    answer and whether the proof in it is ours. A peer with fences off answers 403 or
    405; an older daemon, which takes no challenge, 401 "unsigned request"."""
    challenge = os.urandom(16).hex()
    body = json.dumps({"origin": origin, "challenge": challenge}).encode()
    sent = post(peer, body, {"Content-Type": "application/json", CHALLENGE: challenge},
                timeout)
    given = sent.answer.proof if sent.answer is not None else None
    proven = isinstance(given, str) and hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), proof(secret, challenge).encode())
    return sent, proven


def send(peers: tuple[str, ...], secret: str, job: str, origin: str, reason: str,
         culprit: Culprit | None, timeout: float, uid: int = 0,
         since: float | None = None, term_at: float | None = None,
         incident: str | None = None) -> list[FenceSent]:
    """Fence `uid`'s `job` (its ranks started before `since`, to be SIGTERMed at
    `term_at`, wall time) on every peer, each on its own thread within `timeout` (a slow
    peer never holds another's fence back); each answer or error."""
    def one(peer: str) -> FenceSent:
        body, headers = make(secret, job, origin, reason, culprit, uid=uid,  # a nonce each
                             since=since, term_at=term_at, incident=incident)
        return post(peer, body, headers, timeout)

    return cluster.each(peers, one, timeout,
                        lambda p: FenceSent(p, error=f"no answer within {timeout:g}s"))
