"""Each job's pace, shown and never acted on: each live rank's last minute of work, each
job's ranks scored and its straggler named when clear (judge/pacing.py, judge/stragglers.py),
a job whose only rank here is ripe judged with its ranks on the peers (judge/across.py)
from their recent answers, never asked from here. What each rank shows of it (its pace,
score, why, or why not judged) is written into its `view.Shown`, kept by `jobs.py`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from watchdog.daemon.config import Live
from watchdog.daemon.counters import Counters
from watchdog.daemon.judge import across
from watchdog.daemon.judge.pacing import CLEAR_SLOWDOWN, Scored, summary, why
from watchdog.daemon.judge.stragglers import Figures, Stragglers
from watchdog.daemon.lifecycle import JobKey, Key, LiveRanks, Rank
from watchdog.daemon.probes import Probe
from watchdog.daemon.view import Shown
from watchdog.states import ENDED, Unjudged
from watchdog.status import NodeAnswer, RankStatus, Straggler

log = logging.getLogger(__name__)

THERMAL_EVERY = 30.0  # seconds between two asks of the node's thermal state (macOS: a tool)


class Paces:
    """Each job's pace at each scan (`judge`): owns the stragglers' tracker and the
    judgement across nodes; `slow` is the stragglers named, `ask_peers_every` the seconds
    between the peers' asks a job judged across nodes wants (None: none)."""

    def __init__(self, live: Live, probe: Probe, host: str,
                 recent: Callable[[float], list[NodeAnswer] | None], counters: Counters,
                 shown: Callable[[Key], Shown]) -> None:
        self.live, self.probe, self.host = live, probe, host
        self.counters = counters  # a pace that could not be judged is counted there
        self.recent = recent  # the peers' background answers no older than the seconds given
        self.shown = shown  # what a rank shows, kept by jobs.py (made when first asked)
        # Each rank's last minute of work and each job's straggler (reported, never ended).
        self.stragglers: Stragglers[Key, JobKey] = Stragglers()
        # A job whose only rank here is ripe, judged with its ranks on the peers
        # (judge/across.py); the seconds between the peers' asks it wants (None: none).
        self.across: across.Across[JobKey] = across.Across()
        self.ask_peers_every: float | None = None
        self.slow: tuple[Straggler, ...] = ()
        self.thermal: tuple[float, str | None] = (-1e9, None)  # (asked at, answer)

    def judge(self, live: LiveRanks, now: float) -> None:
        """Each live rank's minute of work, each job scored, its straggler named when clear
        (judge/stragglers.py): shown, never acted on, and never in the way of a response:
        an error here is logged and counted, and the scan goes on."""
        try:
            self._paces(live, now)
        except Exception:  # noqa: BLE001 - a report must never stop the hang's response
            self.counters.loop_failed()
            log.exception("judging the ranks' pace failed")

    def _paces(self, live: LiveRanks, now: float) -> None:
        jobs: dict[JobKey, list[Rank]] = {}
        for rank, sample in live:
            self.stragglers.observe(rank.key, rank.record, sample, now)
            jobs.setdefault((rank.record.uid, rank.record.job), []).append(rank)
        seen = {rank.key for rank, _ in live}
        for key in [k for k in self.stragglers.tracks if k not in seen]:
            self.stragglers.forget(key)
        self.stragglers.forget_jobs(jobs)
        judged = {job: self.stragglers.judge_job(job, [r.key for r in ranks], now)
                  for job, ranks in jobs.items()}
        self._ask_thermal(now)
        slow = []
        for (uid, job), ranks in jobs.items():
            scored, worst = judged[(uid, job)]
            # The rank the others wait for most, when it holds them back at all: the one
            # whose why is shown (the fast ranks' figures need none).
            lowest = min(scored, key=lambda s: (s.score, -s.excess), default=None)
            for r in ranks:
                self._show_pace(r, lowest)
            by_key = {r.key: r for r in ranks}
            if worst is None or worst.key not in by_key:
                continue
            rec = by_key[worst.key].record
            cause = why(worst.pace, self.thermal[1])
            slow.append(Straggler(
                job=job, uid=uid, rank=rec.rank, host=rec.host or self.host, pid=rec.pid,
                score=round(worst.score, 3), slowdown=round(worst.slowdown, 3),
                others_wait=round(worst.excess, 3), why=cause,
                summary=summary(rec.rank, rec.host or self.host, worst.excess, cause)))
        slow += self._across(jobs, now)
        self.slow = tuple(sorted(slow, key=lambda s: (s.job, s.uid or 0)))

    def _across(self, jobs: Mapping[JobKey, list[Rank]], now: float) -> list[Straggler]:
        """Each job whose only rank here is ripe ("alone"), judged with its ranks on the
        peers (judge/across.py) from their recent answers: its rank's score shown, and
        the job's straggler, wherever it is, named (the node holding it exports it:
        net/metrics.py). Without peers, the rank's note says where it is judged."""
        single = {key: ranks[0] for key, ranks in jobs.items()
                  if len(ranks) == 1 and ranks[0].record.world_size > 1}
        alone = {key: rank for key, rank in single.items()
                 if (f := self.stragglers.figures.get(rank.key)) is not None
                 and f.unjudged is Unjudged.ALONE}
        self.across.forget_jobs(single)
        peers = self.live.peering.peers
        self.ask_peers_every = across.ASK_EVERY if alone and peers else None
        answers = self.recent(across.FRESH) if alone and peers else None
        named = []
        for key in single.keys() - alone.keys():  # not ripe now: a name given holds a while
            if (held := self.across.held(key, now)) is not None:
                named.append(held)
        for (uid, job), rank in alone.items():
            shown = self.shown(rank.key)
            if not peers:
                shown.pace_note = ("judged only by `cluster status`: the only rank of its "
                                   "job on this node, and no `peers` configured to judge it "
                                   "with (docs/cluster.md)")
                continue
            mine = self._as_reported(rank, shown)
            ranks = _job_across(mine, uid, job, answers)
            if isinstance(ranks, str):
                shown.pace_note = f"not judged yet: {ranks}"
                if (held := self.across.held((uid, job), now)) is not None:
                    named.append(held)
                continue
            if any(r.pace_unjudged in across.RIPENING for r in ranks):
                # A rank there is about to be judged: its figures asked for soon.
                self.ask_peers_every = across.ASK_FORMING
            judged = self.across.judge((uid, job), job, uid, ranks, now)
            if judged.forming:
                self.ask_peers_every = across.ASK_FORMING
            score = judged.scores.get((mine.host, mine.pid))
            if score is None:
                shown.pace_note = ("not judged yet: a rank of its job on another node is "
                                   "not judged by its node")
                if judged.straggler is not None:
                    named.append(judged.straggler)
                continue
            shown.pace_score, shown.pace_unjudged, shown.pace_note = score, None, None
            if score >= 1.0 or score > min(judged.scores.values()):
                shown.pace_why = ""  # not the rank the others wait for: no why to give
            if judged.straggler is not None:
                named.append(judged.straggler)
        return named

    def _as_reported(self, rank: Rank, shown: Shown) -> RankStatus:
        """This node's rank as a peer reads it in our /status (its figures rounded as
        published), so every node scores the job from the same numbers."""
        rec, pace = rank.record, shown.pace
        return RankStatus(
            pid=rec.pid, host=rec.host or self.host, job=rec.job, uid=rec.uid, rank=rec.rank,
            world_size=rec.world_size, state=str(rank.state), pace_why=shown.pace_why,
            wait_share=round(pace.wait_share, 3) if pace and pace.wait_known else None,
            pace=round(pace.pace, 3) if pace else None,
            run_queue=round(pace.run_queue, 3) if pace else None,
            active_share=round(pace.active, 3) if pace else None,
            pace_unjudged=Unjudged.ALONE)

    def _ask_thermal(self, now: float) -> None:
        """The node's thermal state, asked at most every `THERMAL_EVERY` seconds (a
        subprocess on macOS: rarely) and only while a rank's figures are shown with a
        why it may belong to (judged, or judged elsewhere or unscored)."""
        if now - self.thermal[0] < THERMAL_EVERY:
            return
        if any(_why_shown(f) and f.pace is not None for f in self.stragglers.figures.values()):
            self.thermal = (now, self.probe.thermal())

    def _show_pace(self, r: Rank, lowest: Scored[Key] | None) -> None:
        """One rank's pace as shown: its figures once known (on a busy machine too), and
        while not judged why, in words."""
        figures = self.stragglers.figures.get(r.key)
        pace = figures.pace if figures is not None else None
        shown = self.shown(r.key)
        shown.pace = pace
        shown.pace_score = figures.score if figures is not None else None
        shown.pace_note = figures.note if figures is not None else None
        shown.pace_unjudged = figures.unjudged if figures is not None else None
        held_back = (figures is not None and figures.judged and lowest is not None
                     and lowest.key == r.key and lowest.slowdown >= CLEAR_SLOWDOWN)
        # The only rank of its job here: the cluster view judges it, by this why; a
        # rank with no wait share (MPI, JACCL): the causes the node sees, unscored.
        alone = figures is not None and figures.unjudged in (Unjudged.ALONE,
                                                             Unjudged.USER_SPACE_WAIT)
        shown.pace_why = (why(lowest.pace, self.thermal[1]) if held_back and lowest
                          else why(pace, self.thermal[1]) if alone and pace
                          else "" if pace is not None else None)


def _why_shown(figures: Figures) -> bool:
    """Are these figures shown with a why (judged, the only rank of its job here, or a
    backend polling in user space)?"""
    return figures.unjudged in (None, Unjudged.ALONE, Unjudged.USER_SPACE_WAIT)


def _job_across(mine: RankStatus, uid: int, job: str,
                answers: list[NodeAnswer] | None) -> list[RankStatus] | str:
    """The job's live ranks, ours and the peers' (each once), when every one of them is
    reported; else why not, in words."""
    if answers is None:
        return "its ranks on the peers are not asked for yet"
    down = [n.peer for n in answers if not n.ok or n.status is None]
    if down:
        return f"no answer from {', '.join(down)} (its ranks there unknown)"
    seen = {(mine.host, mine.pid)}
    ranks = [mine]
    for answer in answers:
        assert answer.status is not None
        for r in answer.status.ranks:
            if r.job == job and r.uid == uid and r.state not in ENDED \
                    and (r.host, r.pid) not in seen:
                seen.add((r.host, r.pid))
                ranks.append(r)
    world = mine.world_size or 0
    if len(ranks) != world or len({r.rank for r in ranks}) != world:
        return f"{len(ranks)} of its {world} ranks reported by the nodes"
    return ranks
