"""A line of the launcher's journal (`launches.jsonl`): what `mlx-watchdog launch`
decided for an attempt of a job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from watchdog.status.codec import ABSENT, Absent, Encodable, _on_wire, decode

_SAID = _on_wire(omit="absent")  # an event carries only its own facts


@dataclass(frozen=True, kw_only=True)
class LaunchEvent(Encodable):
    """One line of `launches.jsonl` (store/launchlog.py): what `mlx-watchdog launch`
    decided for an attempt of a job. Each event writes its own facts (docs/operations.md,
    "The journal"); a fact it does not carry is ABSENT, a null one None. Fields in
    the file's (sorted) key order."""

    argv: tuple[str, ...] | None | Absent = field(default=ABSENT, metadata=_SAID)  # launch
    attempt: int | None | Absent = field(default=ABSENT, metadata=_SAID)
    backoff: float | None | Absent = field(default=ABSENT, metadata=_SAID)  # restart
    ending: str | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    event: str  # launch, ended, restart, refused, gave_up
    exit_code: int | None | Absent = field(default=ABSENT, metadata=_SAID)
    host: str | None | Absent = field(default=ABSENT, metadata=_SAID)
    incident: str | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    job: str | None | Absent = field(default=ABSENT, metadata=_SAID)
    launcher_code: int | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    progressed: bool | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    reason: str | None | Absent = field(default=ABSENT, metadata=_SAID)
    restarts_left: int | None | Absent = field(default=ABSENT, metadata=_SAID)  # restart
    steps: int | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended
    time: float | None | Absent = field(default=ABSENT, metadata=_SAID)  # wall seconds
    uid: int | None | Absent = field(default=ABSENT, metadata=_SAID)
    waits: int | None | Absent = field(default=ABSENT, metadata=_SAID)  # ended


    @classmethod
    def from_json(cls, data: Any) -> LaunchEvent:
        """ValueError unless it names its event."""
        if not isinstance(data, dict) or not isinstance(data.get("event"), str):
            raise ValueError("not a launch event")
        return decode(cls, data)
