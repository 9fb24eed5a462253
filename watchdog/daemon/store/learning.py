"""What the auto deadline learned, kept in the state dir across daemon restarts.

`<state-dir>/learned.json` holds, per job ("<uid>:<job>") and kind of wait, the
longest wait seen and how many were seen, with the wall time the job was last
updated. A relaunch of the same job (same job id, e.g. `MLX_WATCHDOG_JOB`)
starts from what its earlier runs showed, as NVRx keeps its timeouts between
runs. The file is bounded: jobs unseen for `KEEP_SECONDS` and the oldest past
`MAX_JOBS` are dropped, and so are a job's kinds past `MAX_KINDS_PER_JOB` (the
least seen) and a uid's jobs past `MAX_JOBS_PER_UID` (the oldest): any user
may publish records, and one must not crowd out every other user's learning.
What is written always fits `MAX_BYTES`, which the loader refuses past. An
unreadable or malformed file is reported and ignored: learning starts afresh,
the fallback deadline applies meanwhile.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

from watchdog.daemon.judge.deadlines import AutoDeadline, Learned
from watchdog.daemon.store.journal import write_json_atomic
from watchdog.files import open_regular

log = logging.getLogger(__name__)

FILE = "learned.json"
VERSION = 1
MAX_JOBS = 500
KEEP_SECONDS = 30 * 86400.0
MAX_BYTES = 4 << 20
MAX_KINDS_PER_JOB = 48  # the named kinds of wait, "other", "wait" and "native", with room
MAX_JOBS_PER_UID = 64


def _learned(raw: Any) -> Learned | None:
    if not isinstance(raw, dict):
        return None
    longest, count = raw.get("longest"), raw.get("count")
    if (not isinstance(longest, (int, float)) or isinstance(longest, bool)
            or not math.isfinite(longest) or longest < 0
            or not isinstance(count, int) or isinstance(count, bool) or count < 0):
        return None
    return Learned(float(longest), count)


def load(state_dir: str, now: float) -> tuple[dict[str, dict[str, Learned]], dict[str, float]]:
    """(learned per job and kind, when each job was last updated)."""
    path = os.path.join(state_dir, FILE)
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            data = json.loads(f.read(MAX_BYTES))
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"not a version {VERSION} file")
        jobs = data.get("jobs")
        if not isinstance(jobs, dict):
            raise ValueError("no jobs")
    except FileNotFoundError:
        return {}, {}
    except (OSError, ValueError) as err:
        log.warning("ignoring %s (%s): the auto deadline learns afresh", path, err)
        return {}, {}
    learned: dict[str, dict[str, Learned]] = {}
    updated: dict[str, float] = {}
    for job, entry in jobs.items():
        if not isinstance(job, str) or not isinstance(entry, dict):
            continue
        when = entry.get("updated")
        kinds = entry.get("kinds")
        if not isinstance(when, (int, float)) or not isinstance(kinds, dict):
            continue
        if now - when > KEEP_SECONDS:
            continue
        good = {k: v for k, v in ((k, _learned(v)) for k, v in kinds.items())
                if isinstance(k, str) and v is not None}
        if good:
            learned[job], updated[job] = good, float(when)
    return learned, updated


def prune(learned: dict[str, dict[str, Learned]], updated: dict[str, float], now: float) -> None:
    """Drop jobs unseen for KEEP_SECONDS, then the oldest past MAX_JOBS (in place)."""
    for job in [j for j in learned if now - updated.get(j, now) > KEEP_SECONDS]:
        del learned[job]
        updated.pop(job, None)
    for kinds in learned.values():
        if len(kinds) > MAX_KINDS_PER_JOB:
            for kind in sorted(kinds, key=lambda k: kinds[k].count)[
                    : len(kinds) - MAX_KINDS_PER_JOB]:
                del kinds[kind]
    by_uid: dict[str, list[str]] = {}
    for job in learned:
        by_uid.setdefault(job.split(":", 1)[0], []).append(job)  # "<uid>:<job>"
    for jobs in by_uid.values():
        if len(jobs) > MAX_JOBS_PER_UID:
            for job in sorted(jobs, key=lambda j: updated.get(j, now))[
                    : len(jobs) - MAX_JOBS_PER_UID]:
                del learned[job]
                updated.pop(job, None)
    if len(learned) > MAX_JOBS:
        for job in sorted(learned, key=lambda j: updated.get(j, now))[: len(learned) - MAX_JOBS]:
            del learned[job]
            updated.pop(job, None)


def _encoded(learned: dict[str, dict[str, Learned]], updated: dict[str, float]) -> int:
    """The bytes the file would take (as write_json_atomic writes it)."""
    jobs = {job: {"updated": updated.get(job, 0.0),
                  "kinds": {k: {"longest": round(v.longest, 6), "count": v.count}
                            for k, v in kinds.items()}}
            for job, kinds in learned.items()}
    return len(json.dumps({"version": VERSION, "jobs": jobs}, indent=1, sort_keys=True)) + 1


def save(state_dir: str, learned: dict[str, dict[str, Learned]],
         updated: dict[str, float]) -> None:
    """Write what auto learned, atomically, the oldest jobs left out until it fits."""
    # Never a file the loader would refuse: the oldest jobs go until it fits
    # (job ids and kinds are text anyone may choose, up to the record's bounds).
    while learned and _encoded(learned, updated) > MAX_BYTES:
        oldest = sorted(learned, key=lambda j: updated.get(j, 0.0))
        for job in oldest[: max(1, len(oldest) // 8)]:
            del learned[job]
            updated.pop(job, None)
    jobs = {job: {"updated": updated.get(job, 0.0),
                  "kinds": {k: {"longest": round(v.longest, 6), "count": v.count}
                            for k, v in kinds.items()}}
            for job, kinds in learned.items()}
    write_json_atomic(os.path.join(state_dir, FILE), {"version": VERSION, "jobs": jobs})


SAVE_EVERY = 10.0  # seconds between writes of what the auto deadline learned


class Keeper:
    """Stamps the jobs whose auto deadline learned something, and writes it now and then."""

    def __init__(self, state_dir: str, wall: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state_dir = state_dir
        self.learned, self.learned_at = load(state_dir, wall)
        self.clock = clock  # the daemon's monotonic clock: writes at most every SAVE_EVERY
        self.saved: float | None = None  # when it last wrote (never yet: None)

    def keep(self, auto: AutoDeadline, wall: float, force: bool = False) -> None:
        """After a scan (or at stop, `force`): what the `auto` deadline learned, to the
        file."""
        for job in auto.changed:
            self.learned_at[job] = wall
        if not auto.changed and not force:
            return
        now = self.clock()
        if not force and self.saved is not None and now - self.saved < SAVE_EVERY:
            return
        auto.changed = set()
        prune(auto.learned, self.learned_at, wall)
        self.saved = now
        try:
            save(self.state_dir, auto.learned, self.learned_at)
        except OSError as err:
            log.warning("cannot write %s: %s", FILE, err)
