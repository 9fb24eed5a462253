"""A response's writes: its write-ahead entry before each next step (store/pending.py),
and at its close the incident line and the reboot flag, each written or held in the
backlog. A failed write is reported and the response goes on: a hung job must end
whatever the disk does."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from watchdog.daemon.act.ladder import Ladder
from watchdog.daemon.act.wired import wired_after
from watchdog.daemon.store import journal, pending
from watchdog.status import Incident, RebootFlag, RebootReason

log = logging.getLogger(__name__)


class Writes:
    """A node's response writes, into the state directory `state_dir()` names at each
    write (read at use: a reload reaches a response under way)."""

    def __init__(self, state_dir: Callable[[], str], wall: Callable[[], float]) -> None:
        self.state_dir, self.wall = state_dir, wall
        # Incidents and reboot flags a failed write left in memory (pending.py).
        self.backlog = pending.Backlog(state_dir())

    def write_ahead(self, ladder: Ladder) -> None:
        """The response so far, on disk before its next step. A failed write is
        reported and the kill goes on: a hung job must end whatever the disk does."""
        try:
            pending.write_ahead(self.state_dir(), ladder.incident, ladder.targets,
                                ladder.baseline, ladder.held_before)
        except OSError as err:
            self.backlog.failures += 1
            log.error("cannot journal incident %s before acting (%s); acting anyway",
                      ladder.incident.id, err)

    def closed(self, ladder: Ladder) -> Incident:
        """The ladder's incident as closed now (its entry too says so: a restart before
        both writes are done completes only the writes, never the ladder again, never a
        second line)."""
        incident = ladder.incident
        return replace(incident, closed_at=self.wall(), reboot_required=(
            False if incident.reboot_required is None else incident.reboot_required))

    def close(self, incident: Incident, flag: RebootReason | None) -> None:
        """The incident line and the flag, each on its own: one failed write neither
        skips the other nor loses itself (held and retried each scan)."""
        self.backlog.add(incident, flag)

    def reclose(self, incident: Incident, baseline: int | None) -> None:
        """A closed incident an earlier daemon could not finish writing: its line
        and its reboot flag, whichever is not on disk yet (never twice)."""
        state_dir = self.state_dir()
        written = any(i.id == incident.id
                      for i in journal.read_incidents(state_dir)[0])
        flag = None
        reason = incident.reboot_required
        present = journal.reboot_flag(state_dir) or RebootFlag()
        told = present.reasons if isinstance(present.reasons, tuple) else ()
        if reason and not any(r.incident == incident.id for r in told):
            flag = RebootReason(reason=str(reason), time=self.wall(), incident=incident.id,
                                wired_baseline=baseline, wired_after=wired_after(incident))
        if written:
            self.backlog.written(incident.id)
        self.backlog.add(None if written else incident, flag)
