"""A fence ("end your ranks of job J of owner U", signed, net/fence.py), the culprit it
and an incident name, and a node's answer to one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from watchdog.status.codec import Decodable, Encodable, _on_wire, decode, encode


@dataclass(frozen=True)
class Culprit(Encodable):
    """The rank that holds a job up, as an incident (and a fence) names it."""

    host: str | None = None
    rank: int | None = None
    pid: int | None = None
    state: str | None = None
    reason: str | None = None
    # The job's cause (watchdog/cause.py) and its one line: a fence carries them.
    cause: str | None = None
    summary: str | None = None


    @classmethod
    def from_json(cls, data: Any) -> Culprit | None:
        """The culprit read from JSON; None for anything but a non-empty object."""
        return decode(cls, data) if isinstance(data, dict) and data else None


def _text_or_null(name: str) -> Callable[[dict[str, Any]], str | None]:
    """A field read as text whatever it was sent as (its words are only shown)."""
    return lambda data: None if data.get(name) is None else str(data[name])


@dataclass(frozen=True)
class Fence:
    """"End your ranks of job J of owner U": a peer's signed request (net/fence.py), or
    this daemon's own when a local rank of the job died (`local`, never on the wire)."""

    job: str
    uid: int
    origin: str | None = field(metadata=_on_wire(read=_text_or_null("origin")))  # who fenced
    reason: str | None = field(metadata=_on_wire(read=_text_or_null("reason")))
    culprit: Culprit | None
    nonce: str = ""
    time: float | None = None
    # When the origin found the job dead (its wall clock): a rank started after it is
    # a relaunch of the job under its name, never one of the dead job's ranks.
    since: float | None = None
    # Seconds after the signing the origin sends its own ranks SIGTERM: the receiver
    # freezes its ranks of the job at once and ends them then, so no rank of the job
    # runs on after its peers' end. None (an older sender): at once.
    term_in: float | None = field(default=None, metadata=_on_wire(omit="none"))
    # The origin's incident of the job (its id, on its host `origin`): where the
    # evidence of the job's other ranks is. None: an older sender, or a local death's.
    incident: str | None = field(default=None, metadata=_on_wire(
        omit="none", read=_text_or_null("incident")))
    local: bool = field(default=False, metadata=_on_wire(skip=True))

    def to_json(self) -> dict[str, Any]:
        """The body a fence request carries (signed as sent)."""
        return encode(self)

    @classmethod
    def from_json(cls, data: Any) -> Fence:
        """A fence's body; ValueError unless it names a job, its owner and a nonce."""
        if not isinstance(data, dict) or not isinstance(data.get("job"), str) \
                or not isinstance(data.get("nonce"), str) or not data["job"] \
                or type(data.get("uid")) is not int or not 0 <= data["uid"] < 2**32:
            raise ValueError("body lacks job, uid or nonce")
        return decode(cls, data)

    def ends(self, start_time: float) -> bool:
        """Whether a local rank started at `start_time` (wall seconds) may be one of the
        dead job's: it started before the origin found the job dead. A fence from a
        sender that names no `since` is as old as its signature."""
        cutoff = self.since if self.since is not None else self.time
        return cutoff is None or start_time < cutoff


@dataclass(frozen=True)
class FenceAnswer(Decodable):
    """A node's answer to a fence: the job and the pids of its ranks it is ending
    (202), or why it refused (only `error`)."""

    job: str | None = field(default=None, metadata=_on_wire(omit="none"))
    uid: int | None = field(default=None, metadata=_on_wire(omit="none"))
    ending: tuple[int, ...] | None = field(default=None, metadata=_on_wire(omit="none"))
    error: str | None = field(default=None, metadata=_on_wire(omit="none"))
    # The answer to `doctor`'s challenge: proof that the node holds the secret.
    proof: str | None = field(default=None, metadata=_on_wire(omit="none"))
    # The receiver's incident for the ranks it ends, and its host: where their evidence is.
    incident: str | None = field(default=None, metadata=_on_wire(omit="none"))
    host: str | None = field(default=None, metadata=_on_wire(omit="none"))


@dataclass(frozen=True)
class FenceSent:
    """A fence sent to one peer: its answer, or why none came."""

    peer: str
    answer: FenceAnswer | None = None
    error: str | None = None

    def __str__(self) -> str:
        return str(self.answer.to_json()) if self.answer is not None else str(self.error)
