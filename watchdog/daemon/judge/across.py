"""Pure: a job whose ranks sit one per node, judged as a whole from every node's figures.

A daemon that holds one rank of a job cannot score it: its pace means something only
beside its peers'. With `peers` configured, the daemon lines up its rank's figures
with those the peers publish (their `/status`, asked in the background every
`ASK_EVERY` seconds while such a rank is ripe: act/peers.py), scored as `cluster status`
scores them (`stragglers.scored_ranks`), and names the slowest with hysteresis: once
clear (`NAME_SLOWDOWN`) over `SUSTAIN` seconds of answers (asked every `ASK_FORMING`
seconds meanwhile), until its slowdown falls under `CLEAR_SLOWDOWN`. Every node
reaches the same answer from the same figures; the node holding the named rank
exports it (`mlx_watchdog_job_slowdown_ratio`, so the alert's instance is the slow
rank's node), and every node names it in `status`.

A job is judged only when every one of its ranks is reported (a peer that does not
answer, or a rank its node does not judge yet, leaves it unjudged: never a name from
part of a job). Shown, never acted on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from watchdog.daemon.judge.stragglers import (
    CLEAR_SLOWDOWN,
    NAME_SLOWDOWN,
    Named,
    scored_ranks,
    straggler_of,
)
from watchdog.status import RankStatus, Straggler

ASK_EVERY = 10.0  # seconds between the peers' asks while a job's only rank here is ripe
ASK_FORMING = 3.0  # ...while a straggler is clear and not named yet (it needs fresh answers)
SUSTAIN = 6.0  # seconds a straggler stays clear before it is named (two asks at least)
FRESH = ASK_EVERY + 5.0  # seconds a background answer speaks for the peers' ranks


@dataclass(frozen=True)
class Judged:
    """One judgement of a job across nodes: each rank's score by (host, pid), the named
    straggler, and whether one is forming (clear, not named yet)."""

    scores: dict[tuple[str | None, int | None], float] = field(default_factory=dict)
    straggler: Straggler | None = None
    forming: bool = False


class Across:
    """Each job's straggler across nodes, named with hysteresis."""

    def __init__(self, sustain: float = SUSTAIN) -> None:
        self.sustain = sustain
        self.named: dict[object, Named] = {}

    def judge(self, key: object, job: str, uid: int | None, ranks: Sequence[RankStatus],
              now: float) -> Judged:
        """The job's ranks (every one, as their nodes report them) scored together, and
        its straggler once named; `key` names the job (its owner's uid with its id)."""
        live, scored, worst = scored_ranks(ranks)
        scores = {(live[s.key].host, live[s.key].pid): s.score for s in scored
                  if isinstance(s.key, int)}
        held = self.named.get(key)
        if worst is None or not isinstance(worst.key, int):
            self.named.pop(key, None)
            return Judged(scores)
        r = live[worst.key]
        who = (r.host, r.pid)
        if held is not None and held.key == who:
            if worst.slowdown < (CLEAR_SLOWDOWN if held.named else NAME_SLOWDOWN):
                self.named.pop(key, None)
                return Judged(scores)
        elif worst.slowdown >= NAME_SLOWDOWN:
            held = self.named[key] = Named(who, now)
        else:
            self.named.pop(key, None)
            return Judged(scores)
        if not held.named and now - held.since >= self.sustain:
            held.named = True
        if not held.named:
            return Judged(scores, forming=True)
        return Judged(scores, straggler_of(job, uid, r, worst))

    def forget_jobs(self, live: Iterable[object]) -> None:
        keep = set(live)
        for key in [k for k in self.named if k not in keep]:
            del self.named[key]
