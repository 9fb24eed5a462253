"""What a finished response did, applied to its ranks: each one's edge of its lifecycle
(lifecycle.py: `killed`, `unkillable`, `retried`, `released`, `peer_held`), the cause of
the incident that acted on it (kept once its response is done; while one is under way
`publish` shows the response's own), and what the counters count of it.

`Outcome.results` says, per pid, how the ladder left each rank, an `End`: KILLED or
UNKILLABLE, EXITED (its own error), UNKNOWN (its identity could not be checked), or
GONE, NOT_OURS, DENIED (the ladder stopped early): the enforcer writes it, and only
this module reads it.
"""

from __future__ import annotations

from watchdog.daemon import holds
from watchdog.daemon.act.enforcer import Outcome
from watchdog.daemon.counters import Counters
from watchdog.daemon.lifecycle import Edge, Key, transition
from watchdog.daemon.table import RankTable
from watchdog.states import End, Mode


def retried(table: RankTable, keys: list[Key], now: float) -> None:
    """A response that failed did not end its wait: its ranks judged afresh."""
    table.replaying.difference_update(keys)
    for key in keys:
        rank = table.ranks.get(key)
        if rank is not None:
            transition(rank, Edge.RETRIED, now)


def held(table: RankTable, keys: list[Key], outcome: Outcome, now: float) -> None:
    """A peer node said a rank of the job computes: its ranks left alone a while."""
    table.replaying.difference_update(keys)
    holds.peer_held([table.ranks[k] for k in keys if k in table.ranks], outcome.held, now)
    _keep_cause(table, keys, outcome.incident.cause)


def ended(table: RankTable, counters: Counters, mode: Mode, keys: list[Key],
          outcome: Outcome, now: float) -> None:
    """A response ran its ladder (or only observed): each rank's end as it came, the
    hang and the signals counted. `mode` is the daemon's now (a reload may have
    switched it while the response ran)."""
    counters.response_done(outcome.incident.verdict, outcome.incident.cause,
                           outcome.signals_sent)
    table.replaying.difference_update(keys)
    _keep_cause(table, keys, outcome.incident.cause)
    for key in keys:
        rank = table.ranks.get(key)
        if rank is None:
            if outcome.results.get(key[0]) == End.KILLED:  # a replay's, not yet seen
                table.ended_by_us[key] = outcome.incident.id
            continue
        result = outcome.results.get(rank.record.pid)
        if result == End.KILLED:
            transition(rank, Edge.KILLED, now,
                       f"ended by the watchdog (incident {outcome.incident.id})")
            counters.job_killed(rank.record.uid, rank.record.job)
            table.remove_record(rank)
        elif result == End.UNKILLABLE:
            transition(rank, Edge.UNKILLABLE, now, "survived SIGKILL; node flagged for reboot")
        elif result == End.UNKNOWN:
            # Its identity could not be checked, so it was left alone:
            # judged afresh next scan rather than given up for this wait.
            transition(rank, Edge.RETRIED, now)
        elif not outcome.results and mode == Mode.ENFORCE \
                and outcome.incident.mode == Mode.OBSERVE:
            # Observed while a reload switched to enforce: its wait judged afresh.
            transition(rank, Edge.RETRIED, now)
        else:  # observed, or not ended by us (gone, not ours, denied, its own exit)
            transition(rank, Edge.RELEASED, now)


def _keep_cause(table: RankTable, keys: list[Key], cause: str | None) -> None:
    """Its ranks keep the incident's cause, shown with them from now on."""
    for key in keys:
        rank = table.ranks.get(key)
        if rank is not None and cause:
            rank.cause = cause
