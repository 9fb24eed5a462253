"""The settle's verdict: what wired memory says after a kill, against the idle
baseline, and the reboot flag a response calls for (an unkillable rank, leaked wired
memory). Pure: the probe's reading and the clock's wall time come in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from watchdog.states import End
from watchdog.status import ABSENT, Incident, RebootReason, WiredCheck


def over(baseline: int | None, wired: int | None, threshold: int) -> bool:
    """Wired memory stands more than `threshold` bytes above the baseline."""
    return wired is not None and baseline is not None and wired > baseline + threshold


HELD = "held by live processes"


def held_since(now: int | None, before: int | None) -> int | None:
    """What live processes locked since the response began (`before`, None: not read,
    then all they hold now): only memory wired while the job was ended can be theirs
    and not its leak; what they held already stands in the baseline as well."""
    if now is None or before is None:
        return now
    return max(0, now - before)


def wired_check(baseline: int | None, wired: int | None, threshold: int,
                others_live: Callable[[], bool],
                held: Callable[[], int | None] = lambda: None) -> WiredCheck:
    """What wired memory read `wired` says after a kill, against the idle baseline.

    The reboot flag is the node's, not a user's: memory a live process holds wired
    (any user may `mlock` within RLIMIT_MEMLOCK, or wire Metal buffers on a Mac) is
    that process's, not a leak. `held` reads it (probes: None when it cannot be told);
    what stands above the baseline once it is taken off is leaked. The baseline keeps
    what processes held at rest, so a leak smaller than that plus the threshold goes
    unflagged (docs/operations.md)."""
    if baseline is None:
        return WiredCheck(wired_check="no baseline")
    if wired is None:
        said = "probe failed"
    elif not over(baseline, wired, threshold):
        said = "returned"
    elif others_live():
        # Other ranks hold wired memory legitimately; no verdict on a leak.
        said = "skipped: other ranks are live"
    elif not over(baseline, wired - (held() or 0), threshold):
        said = HELD
    else:
        said = "leaked"
    return WiredCheck(wired_baseline=baseline, wired_after=wired, wired_check=said)


def wired_after(incident: Incident) -> int | None:
    """The node's wired bytes after the settle, None while unread."""
    return None if incident.wired_after is ABSENT else incident.wired_after


def settled(incident: Incident, baseline: int | None, wired: int | None,
            outcome: dict[int, End], *, threshold: int, kill_timeout: float,
            others_live: Callable[[], bool], wall: float,
            held: Callable[[], int | None] = lambda: None
            ) -> tuple[Incident, RebootReason | None]:
    """The incident with the settle's verdict, and the reboot flag it calls for (None:
    none)."""
    said = wired_check(baseline, wired, threshold, others_live, held)
    incident = replace(incident, wired_check=said.wired_check, **{
        key: getattr(said, key) for key in ("wired_baseline", "wired_after")
        if getattr(said, key) is not ABSENT})
    unkillable = [pid for pid, result in outcome.items() if result == End.UNKILLABLE]
    reasons = []
    if unkillable:
        reasons.append(f"pids {unkillable} survived SIGKILL for {kill_timeout:g}s")
    if incident.wired_check == "leaked":
        reasons.append("wired memory stayed above the baseline after the kill")
    if not reasons:
        return incident, None
    reason = "; ".join(reasons)
    flag = RebootReason(reason=reason, time=wall, incident=incident.id,
                        wired_baseline=baseline, wired_after=wired_after(incident))
    return replace(incident, reboot_required=reason), flag
