"""A response's ladder driven alone on the test's thread, on the enforcer's production API.

The daemon's loop takes a ladder's due steps once per tick (`Enforcer.step`, through
`Responses.step`); a test wants the whole response at once. `drive` is that loop
with nothing else in it: step, then wait on the worker step under way (its own time
box ends it) or sleep one tick of the enforcer's clock (a fake one moves at once).
Everything here goes through `Enforcer.begin`, `resume` and `step`, as the daemon's
loop does: no ladder here skips the journal or a step the daemon would take.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import wait

from watchdog.daemon.act.enforcer import Enforcer
from watchdog.daemon.act.ladder import Ladder, Outcome
from watchdog.daemon.signaller import Target
from watchdog.daemon.store import pending
from watchdog.status import Incident


def never() -> bool:
    return False


def drive(enforcer: Enforcer, ladder: Ladder) -> Outcome:
    """Step `ladder` to its end on this thread; its outcome."""
    while (outcome := enforcer.step(ladder)) is None:
        if ladder.work is not None and ladder.working:
            wait([ladder.work])  # its own bound ends it (the evidence's time box)
        else:
            enforcer.sleep(enforcer.TICK)
    return outcome


def respond(enforcer: Enforcer, incident: Incident, targets: list[Target],
            baseline: int | None = None, others_live: Callable[[], bool] = never,
            evidence: bool = True) -> Outcome:
    """The whole response to one hung job: `begin`, then `drive`."""
    return drive(enforcer, enforcer.begin(incident, targets, baseline, others_live,
                                          evidence=evidence))


def complete(enforcer: Enforcer, entry: pending.Entry,
             others_live: Callable[[], bool] = never) -> Outcome:
    """An earlier daemon's unfinished response, finished: `resume`, then `drive`."""
    return drive(enforcer, enforcer.resume(entry, others_live))


def end(enforcer: Enforcer, targets: list[Target], incident: Incident | None = None
        ) -> tuple[Incident, dict[int, str]]:
    """The signal ladder of a response without evidence: SIGCONT, SIGTERM, the grace,
    SIGKILL, the confirmation (no baseline, so no settle). The incident with its
    signals, and pid -> outcome."""
    if incident is None:
        incident = Incident(id="signals-only", job=targets[0].job if targets else "")
    outcome = respond(enforcer, incident, targets, evidence=False)
    return outcome.incident, outcome.results
