"""What a response to a hung job must not lose: journaled before it acts, kept in
memory until it is on disk.

Before the enforcer signals anything it writes `<state-dir>/pending/<incident>.json`
(durably): the verdict, the targets' identities, each round of signals before
it is sent, the outcome before the wired-memory settle. The entry goes once the
incident line (and its reboot flag) are on disk. A daemon killed in between
(SIGKILL, a crash, launchd or systemd restarting it mid-settle) leaves the
entry, and the next daemon resumes it at start (`Enforcer.resume`), so a
kill is never taken for a crash and never goes unrecorded.

A write that fails (a full or read-only state disk) loses nothing either: the
incident and the reboot flag are written independently, and whichever failed is
held in memory (`Backlog`), shown in `/status` and the metrics, and tried again
every scan.

An entry that cannot be read or does not hold what it must (a field of the wrong
type, written by hand or by another version) is moved aside to `<name>.bad` with a
log line: kept for a person to read, never resumed, never in the way of a start.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, fields
from typing import Any

from watchdog.daemon.signaller import Target
from watchdog.daemon.store import journal
from watchdog.files import open_regular
from watchdog.status import Incident, RebootReason, Unwritten

log = logging.getLogger(__name__)

PENDING = "pending"  # the directory of unfinished responses, in the state dir
MAX_PENDING = 256  # entries read at start; more is not a watchdog's own doing


def _path(state_dir: str, incident_id: str) -> str:
    # The id is ours (a timestamp and hex), never a rank's text: safe as a file name.
    return os.path.join(state_dir, PENDING, f"{incident_id}.json")


@dataclass(frozen=True)
class Entry:
    """One unfinished response: the incident so far, whom it ends, the wired baseline."""

    incident: Incident
    targets: tuple[Target, ...]
    baseline: int | None
    held: int | None = None  # wired memory live processes held at rest (act/wired.py)


def write_ahead(state_dir: str, incident: Incident, targets: list[Target],
                baseline: int | None, held: int | None = None) -> None:
    """The response as it stands, durably, before its next step; raises OSError."""
    os.makedirs(os.path.join(state_dir, PENDING), mode=0o700, exist_ok=True)
    journal.write_json_atomic(_path(state_dir, incident.id), {
        "incident": incident.to_json(), "targets": [asdict(t) for t in targets],
        "baseline": baseline, "held": held}, durable=True)


def path_of(state_dir: str, incident_id: str) -> str:
    """Where the entry of `incident_id` is."""
    return _path(state_dir, incident_id)


def done(state_dir: str, incident_id: str) -> None:
    """The incident is in the journal: its entry goes."""
    try:
        os.unlink(_path(state_dir, incident_id))
    except FileNotFoundError:
        return


BAD_SUFFIX = ".bad"  # an entry moved aside
_TYPES = {"int": (int,), "float": (int, float), "str": (str,)}


def target_from_json(data: Any) -> Target:
    """A target as journaled; ValueError unless every field has its type."""
    if not isinstance(data, dict):
        raise ValueError("a target is not an object")
    values: dict[str, Any] = {}
    for field in fields(Target):
        if field.name not in data:
            if field.name in ("pid", "start_time", "uid", "job", "rank"):
                raise ValueError(f"a target lacks {field.name}")
            continue
        value = data[field.name]
        if isinstance(value, bool) or not isinstance(value, _TYPES[str(field.type)]):
            raise ValueError(f"a target's {field.name} is {value!r}")
        values[field.name] = value
    return Target(**values)


def set_aside(path: str, why: object) -> None:
    """A bad entry, moved out of the way with a log line (kept to be read)."""
    try:
        os.replace(path, path + BAD_SUFFIX)
        log.error("unfinished response %s is unusable (%s); moved aside to %s%s", path, why,
                  path, BAD_SUFFIX)
    except OSError as err:
        log.error("unfinished response %s is unusable (%s) and could not be moved aside "
                  "(%s); skipped", path, why, err)


def unfinished(state_dir: str) -> list[Entry]:
    """Every entry left by an earlier daemon, oldest first (unusable ones set aside)."""
    folder = os.path.join(state_dir, PENDING)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))[:MAX_PENDING]
    except FileNotFoundError:
        return []
    except OSError as err:
        log.error("cannot list %s: %s", folder, err)
        return []
    entries = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with os.fdopen(open_regular(path), "rb") as f:
                entry = json.loads(f.read(4 << 20))
            targets = tuple(target_from_json(t) for t in entry["targets"])
            incident = Incident.from_json(entry["incident"])
            baseline, held = entry.get("baseline"), entry.get("held")
        except OSError as err:
            log.error("unfinished response %s is unreadable (%s); left in place", path, err)
            continue
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            set_aside(path, err)
            continue
        entries.append(Entry(incident, targets, _count(baseline), _count(held)))
    return entries


def _count(value: object) -> int | None:
    """A byte count read back from an entry, or None (absent, or not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Backlog:
    """Incidents and reboot flags not yet on disk, tried again until they are.

    Shared by the response threads and the scan, hence the lock.
    """

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.incidents: list[Incident] = []
        self.flags: list[RebootReason] = []
        self.failures = 0  # writes that failed (a metric)
        # Incidents written whose flag is not yet: their write-ahead entry stays, so a
        # restart meanwhile still raises the flag (Enforcer.resume).
        self._written: set[str] = set()
        self._lock = threading.Lock()

    def add(self, incident: Incident | None, flag: RebootReason | None) -> None:
        """Hold an unwritten incident or reboot reason, and try to write the backlog now."""
        with self._lock:
            if flag is not None:
                self.flags.append(flag)
            if incident is not None:
                self.incidents.append(incident)
        self.flush()

    def written(self, incident_id: str) -> None:
        """That incident's line is on disk already (an earlier daemon wrote it)."""
        with self._lock:
            self._written.add(incident_id)

    def flush(self) -> None:
        """Write what is held: flags first (the node's safety), then the incidents.
        Each independently of the other; what fails stays for the next scan."""
        with self._lock:
            while self.flags:
                flag = self.flags[0]
                try:
                    journal.set_reboot_flag(self.state_dir, flag)
                except OSError as err:
                    self.failures += 1
                    log.error("cannot write the reboot flag (%s); held in memory, tried "
                              "again each scan: %s", flag.reason, err)
                    break
                self.flags.pop(0)
            while self.incidents:
                incident = self.incidents[0]
                try:
                    journal.append_incident(self.state_dir, incident.to_json())
                except OSError as err:
                    self.failures += 1
                    log.error("cannot write incident %s (%s); held in memory, tried again "
                              "each scan", incident.id, err)
                    break
                self.incidents.pop(0)
                self._written.add(incident.id)
            flagged = {f.incident for f in self.flags}
            for incident_id in sorted(self._written - flagged):
                self._written.discard(incident_id)
                try:
                    done(self.state_dir, incident_id)
                except OSError as err:
                    log.warning("cannot remove the pending entry of incident %s: %s",
                                incident_id, err)

    def state(self) -> Unwritten:
        """For /status and the metrics."""
        with self._lock:
            return Unwritten(tuple(str(f.reason) for f in self.flags),
                             tuple(i.id for i in self.incidents), self.failures)
