"""Pure: a job whose ranks sit one per node, judged as a whole from every node's figures.

A daemon that holds one rank of a job cannot score it: its pace means something only
beside its peers'. With `peers` configured, the daemon lines up its rank's figures
with those the peers publish (their `/status`, asked in the background every
`ASK_EVERY` seconds while such a rank is ripe: act/peers.py), scored as `cluster status`
scores them (`pacing.scored_ranks`), and names the slowest with hysteresis: once
clear (`NAME_SLOWDOWN`) over `SUSTAIN` seconds of answers, until its slowdown falls
under `CLEAR_SLOWDOWN`; the peers are asked every `ASK_FORMING` seconds while one
forms, and while a peer's rank is about to be judged (`RIPENING`). Every node
reaches the same answer from the same figures; the node holding the named rank
exports it (`mlx_watchdog_job_slowdown_ratio`, so the alert's instance is the slow
rank's node), and every node names it in `status`.

A job is judged only when every one of its ranks is reported (a peer that does not
answer, or a rank its node does not judge yet, leaves it unjudged: never a name from
part of a job). A name already given outlives such a gap by `HOLD` seconds (`held`):
a window counting a few seconds short, or one late answer, must not drop the series
the alert's `for: 10m` waits on. Shown, never acted on.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from watchdog.daemon.judge.pacing import Named, named_after, scored_ranks, straggler_of
from watchdog.states import Unjudged
from watchdog.status import RankStatus, Straggler

J = TypeVar("J", bound=Hashable)  # what a job is known by: the daemon's (uid, job)
Where = tuple[str | None, int | None]  # a rank across nodes: (host, pid)

ASK_EVERY = 10.0  # seconds between the peers' asks while a job's only rank here is ripe
ASK_FORMING = 3.0  # ...while a straggler is clear and not named yet (it needs fresh answers)
SUSTAIN = 6.0  # seconds a straggler stays clear before it is named (two asks at least)
FRESH = ASK_EVERY + 5.0  # seconds a background answer speaks for the peers' ranks
HOLD = 30.0  # seconds a named straggler stays named while its job cannot be judged
# A peer's rank not judged for these reasons will be in seconds (its window filling):
# the peers are asked at ASK_FORMING meanwhile. A rank that sleeps between steps or
# polls in user space will not: asked at ASK_EVERY.
RIPENING = frozenset({Unjudged.TOO_FEW_SECONDS, Unjudged.PEER_UNJUDGED})


@dataclass(frozen=True)
class Judged:
    """One judgement of a job across nodes: each rank's score by (host, pid), the named
    straggler, and whether one is forming (clear, not named yet)."""

    scores: dict[Where, float] = field(default_factory=dict)
    straggler: Straggler | None = None
    forming: bool = False


class Across(Generic[J]):
    """Each job's straggler across nodes (by its key `J`), named with hysteresis."""

    def __init__(self, sustain: float = SUSTAIN, hold: float = HOLD) -> None:
        self.sustain, self.hold = sustain, hold
        self.named: dict[J, Named[Where]] = {}
        self.last: dict[J, tuple[Straggler, float]] = {}  # as last named, and when

    def held(self, key: J, now: float) -> Straggler | None:
        """The job cannot be judged now (a rank short of its counted seconds, a peer's
        answer missing): its straggler as last named, for `hold` seconds."""
        last = self.last.get(key)
        if last is None or now - last[1] > self.hold:
            self.last.pop(key, None)
            self.named.pop(key, None)
            return None
        return last[0]

    def judge(self, key: J, job: str, uid: int | None, ranks: Sequence[RankStatus],
              now: float) -> Judged:
        """The job's ranks (every one, as their nodes report them) scored together, and
        its straggler once named; `key` names the job (its owner's uid with its id)."""
        live, scored, worst = scored_ranks(ranks)
        if not scored:  # a rank its node does not judge (yet): no judgement, a gap
            return Judged(straggler=self.held(key, now))
        scores = {(live[s.key].host, live[s.key].pid): s.score for s in scored}
        if worst is None:
            self._clear(key)
            return Judged(scores)
        r = live[worst.key]
        was = self.named.get(key)
        held = named_after(was, (r.host, r.pid), worst.slowdown, now, self.sustain)
        if held is None:
            self._clear(key)
            return Judged(scores)
        if held is not was:  # a new one: the name last given is no longer its
            self.last.pop(key, None)
        self.named[key] = held
        if not held.named:
            return Judged(scores, forming=True)
        named = straggler_of(job, uid, r, worst)
        self.last[key] = (named, now)
        return Judged(scores, named)

    def _clear(self, key: J) -> None:
        self.named.pop(key, None)
        self.last.pop(key, None)

    def forget_jobs(self, live: Iterable[J]) -> None:
        """Every job not in `live`: its straggler, named or forming."""
        keep = set(live)
        for key in [k for k in self.named if k not in keep]:
            del self.named[key]
        for key in [k for k in self.last if k not in keep]:
            del self.last[key]
