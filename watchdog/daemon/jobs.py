"""One scan's judgement of each job: which of its ranks are due for a response, and what
each rank shows beside its lifecycle.

A job is its owner's uid with its id (job ids are world-readable: anyone may publish a
record naming one, so a hung rank only ever brings down ranks of its owner). At each
scan `Jobs.judge` groups the live ranks by job, takes what the scan saw of each rank
(one `Sighting`, daemon/sightings.py), decides the job's wedge (judge/wedge.py) from its
ranks here and, where every peer answered the background ask a moment ago, its ranks
there, and has the detector judge each rank from its sighting; a job one of whose ranks
waits past its wedge deadline gets its ranks' native stacks sampled and their sockets
read (probes/stacksampler.py; a still job ahead of that: daemon/early.py), which the
next scans see. `probe_links` probes the data path of every rank waiting long
(probes/datalink.py), and `paces` (daemon/paces.py) scores each job's ranks and names
its straggler: shown, never acted on.

What a rank shows that is no part of its lifecycle (its data link, its sockets, its
pace, score and why) is kept here by rank (a `view.Shown`: the one table of ranks here),
read by `publish` and the incident; `Rank` (lifecycle.py) keeps only its life. The peers
reach this room only as their recent answers (`recent`), never asked from here: a scan
never waits on the network.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from watchdog.daemon.clock import Clock
from watchdog.daemon.config import Live
from watchdog.daemon.counters import Counters
from watchdog.daemon.early import Early
from watchdog.daemon.judge import wedge
from watchdog.daemon.judge.deadlines import Learned
from watchdog.daemon.judge.detector import Detector, foreign_tracer
from watchdog.daemon.judge.sighting import Sighting
from watchdog.daemon.lifecycle import Edge, JobKey, Key, LiveRanks, Rank, transition
from watchdog.daemon.paces import Paces
from watchdog.daemon.probes import Probe
from watchdog.daemon.probes.datalink import PROBE_EVERY, QUIET_PROBE_EVERY, Prober
from watchdog.daemon.probes.stacksampler import (
    HOLD_LEAD,
    MAX_RUNNING,
    QUIET_QUEUES_EVERY,
    Identity,
    StackSampler,
)
from watchdog.daemon.sightings import Sightings, member
from watchdog.daemon.view import Shown
from watchdog.states import FINAL, STOPPED_STATUSES, WAITING_LONG, Phase, ProcStatus
from watchdog.status import NodeAnswer

log = logging.getLogger(__name__)

Due = dict[JobKey, list[Rank]]  # a job's ranks due for a response
# Seconds a peer's answer speaks for its ranks in a wedge judged across nodes: asked
# every act/peers.PREFETCH_EVERY (2 s) in the background, and the peer's facts were
# current at its last scan.
REMOTE_FRESH = 4.0
# Seconds before a rank's deadline from which the peers are asked ahead (every 2 s):
# answers fresh (act/peers.FRESH) whenever its verdict comes, confirming scans and all.
ASK_AHEAD = 10.0


class Jobs:
    """One scan's judgement of every job on this node. Owns the detector (each rank's
    verdict), the stack sampler (a late job's stacks and sockets) and its early samples,
    what each scan saw of each rank (`sightings`), the link prober (a waiting rank's data
    path) and each job's pace (`paces`); reads the settings from the daemon's holder at
    use and the peers only as their recent answers. `judge` returns the ranks due for a
    response; `shown` is what each rank shows."""

    def __init__(self, live: Live, probe: Probe, clock: Clock, host: str,
                 learned: dict[str, dict[str, Learned]],
                 recent: Callable[[float], list[NodeAnswer] | None],
                 counters: Counters) -> None:
        self.live, self.probe, self.clock, self.host = live, probe, clock, host
        self.recent = recent  # the peers' background answers no older than the seconds given
        self.detector = Detector(lambda: self.live.rules, learned)
        # A rank waiting long: its data path to its peers probed (a cause's evidence),
        # on workers of its own: a probe never delays a capture, a view or a fence.
        self.probing = ThreadPoolExecutor(max_workers=2, thread_name_prefix="links")
        self.links = Prober(self.probing.submit, lambda: min(1.0, self.live.peering.peer_timeout))
        # A job whose rank waited past its wedge deadline: its ranks' native stacks
        # sampled (bounded: stacksampler.py), to tell a rank that computes from one that
        # spins on nothing (judge/frames.py, judge/wedge.py). A healthy job: none.
        # A worker per slot: an owner's share of the slots (stacksampler.share) runs at
        # once, never queued behind another user's samples that wait out their time box.
        self.sampling = ThreadPoolExecutor(max_workers=MAX_RUNNING, thread_name_prefix="stacks")
        self.stacks = StackSampler(probe, self.sampling.submit, clock.monotonic)
        self.sightings = Sightings(live, probe, self.stacks)
        # A still job sampled ahead of its deadline, twice (what the first read: sightings).
        self.early = Early(live, self.stacks, self.sightings.first_waiting)
        # Each rank's last minute of work and each job's straggler (reported, never ended).
        self.paces = Paces(live, probe, host, recent, counters, self._shown)
        self.shown: dict[Key, Shown] = {}  # by rank: the one table of ranks kept here
        # Per job, the last scan (monotonic ns) that saw a rank of it traced by a person:
        # its waits are judged from there (the detach), not from when they began.
        self.traced_at: dict[JobKey, int] = {}

    def forget(self, key: Key) -> None:
        """A rank the table forgot: nothing of it kept here, or by the parts."""
        self.detector.forget(key)
        self.shown.pop(key, None)
        self.sightings.forget(key)
        self.early.forget(key)

    def _shown(self, key: Key) -> Shown:
        """What the rank shows (made at first use)."""
        return self.shown.setdefault(key, Shown())

    def links_of(self) -> Mapping[Key, str | None]:
        """Each rank's data link as last probed (the incident's cause reads it)."""
        return {key: shown.data_link for key, shown in self.shown.items()}

    def shutdown(self) -> None:
        self.probing.shutdown(wait=False, cancel_futures=True)
        self.sampling.shutdown(wait=False, cancel_futures=True)

    # -- the verdicts ----------------------------------------------------------------

    def judge(self, live: LiveRanks, now_ns: int, since: float) -> Due:
        """Each live rank's verdict; the ranks due for action, by job. `since`: the
        previous scan's monotonic time (a rank our sampler stopped since is not paused)."""
        load = self.probe.load_per_cpu()
        now = now_ns / 1e9
        due: Due = {}
        jobs: dict[JobKey, LiveRanks] = {}

        def traced(rank: Rank) -> bool:  # by our stack sampler, since the last scan
            return self.stacks.tracing(rank.key, since)
        for rank, sample in live:
            if sample.tracer and (sample.tracer_own is True
                                  or (sample.tracer_own is None and traced(rank))):
                # Our own stack sampler (its gdb, its `sample`): not a person's tracer.
                sample = replace(sample, tracer=0, tracer_name="")
            if sample.status == ProcStatus.TRACING_STOP and traced(rank) \
                    and not foreign_tracer(sample):
                # Stopped by our own stack sample, for half a second: not a pause.
                sample = replace(sample, status=ProcStatus.RUNNING)
            jobs.setdefault((rank.record.uid, rank.record.job), []).append((rank, sample))
        for key, members in jobs.items():  # a job one of whose ranks a person traces
            if any(foreign_tracer(sample) for _, sample in members):
                self.traced_at[key] = now_ns
        for key in [k for k in self.traced_at if k not in jobs]:
            del self.traced_at[key]
        sampled: set[Key] = set()
        for key, members in jobs.items():
            present, where = self._present(members)
            job = Sighting(load=load, judged_from_ns=self.traced_at.get(key, 0),
                           present=present, where=where)
            sights = {r.key: self.sightings.of(r, s, now, job, traced=traced(r),
                                             link=self._shown(r.key).data_link)
                    for r, s in members}
            for rank, _ in members:  # published (/status) for a peer judging the job
                self.shown[rank.key].sockets = sights[rank.key].sockets
            mine = [member(r, s, sights[r.key]) for r, s in members]
            wedged = wedge.decide(mine + self.remote_members(members[0][0], len(mine),
                                                             now_ns))
            if log.isEnabledFor(logging.DEBUG) and any(s.seen for s in sights.values()):
                log.debug("job %s: %s; wedged: %s", members[0][0].record.job,
                          [(r.record.rank, sights[r.key].seen, self.stacks.queues.get(r.key))
                           for r, _ in members], wedged)
            for rank, sample in members:
                rec = rank.record
                verdict = self.detector.observe(rec, sample, now_ns, sights[rank.key], wedged,
                                                learn=not rank.escalating)
                # Judged while a response has it: its verdict shown fresh, its state kept.
                edge = Edge.REJUDGED if rank.escalating else Edge.JUDGED
                transition(rank, edge, now, verdict=verdict)
                wait = (rec.wait_since_ns, rec.waits_completed)
                if verdict.act and not rank.escalating and rank.acted_on != wait:
                    due.setdefault((rec.uid, rec.job), []).append(rank)
            sampled |= self._sample_stacks(members, now)
        self.stacks.forget(sampled)
        return due

    def _present(self, members: LiveRanks) -> tuple[frozenset[int] | None, str]:
        """A job at bring-up: the ranks of it seen (its records here, and the peers' last
        answers), and where it was looked; (None, "") when no rank of it is at bring-up."""
        one = members[0][0].record
        if not any(r.record.phase == Phase.INIT for r, _ in members):
            return None, ""
        present = {r.record.rank for r, _ in members}
        where = "on this node"
        answers = self.recent(REMOTE_FRESH) if self.live.peering.peers else None
        if answers:
            for answer in answers:
                if answer.ok and answer.status is not None:
                    present |= {r.rank for r in answer.status.ranks
                                if r.job == one.job and r.uid == one.uid and r.rank is not None
                                and r.state not in FINAL}
            where = ("on this node or its peers" if all(a.ok for a in answers)
                     and len(answers) == len(self.live.peering.peers)
                     else "on this node or the peers that answered")
        return frozenset(present), where

    def remote_members(self, one: Rank, here: int, now_ns: int) -> list[wedge.Member]:
        """The job's ranks on the other nodes, as members, from every peer's answer to
        the background ask (at most REMOTE_FRESH seconds old; never asked here: the scan
        never waits on the network). None while a peer did not answer (a partition
        keeps today's rules) or all the job's ranks are here. Only with the shared secret:
        then every answer was signed with it (peers.py), and anything else answering at a
        peer's address, whose `/status` is anyone's to fake, makes no wedge."""
        rec = one.record
        peering = self.live.peering
        if not peering.peers or not peering.secret or here >= rec.world_size:
            return []
        answers = self.recent(REMOTE_FRESH)
        if answers is None or len(answers) != len(peering.peers) \
                or not all(n.ok and n.status is not None for n in answers):
            return []
        members = []
        wall = self.clock.wall()
        for answer in answers:
            status = answer.status
            assert status is not None
            # Its facts as of its last scan: a peer whose loop stalls (or whose clock is
            # seconds off ours) speaks for nothing current.
            if status.time is None or abs(wall - status.time) > \
                    REMOTE_FRESH + (status.interval or self.live.settings.interval):
                return []
            host = status.host if status.host and status.host != self.host else answer.peer
            for r in status.ranks:
                if r.job == rec.job and r.uid == rec.uid and r.state not in FINAL:
                    member = wedge.remote(r, host, now_ns)
                    if member is None:
                        return []  # a rank of the job unknown: no wedge
                    members.append(member)
        return members

    def _sample_stacks(self, members: LiveRanks, now: float) -> set[Key]:
        """A job one of whose ranks waits past its wedge deadline (or its deadline): its
        ranks' stacks sampled and their sockets' queues read; the ranks sampled."""
        def late(rank: Rank) -> bool:
            v = rank.verdict
            return v is not None and v.seconds_in_wait > 0 and \
                v.seconds_in_wait >= (v.wedge_deadline or v.deadline)
        if not any(late(r) for r, _ in members):
            keys = self.early.track(members, now)
            if self.probe.gpu_clock and any(
                    r.verdict is not None and r.verdict.seconds_in_wait > 0
                    and r.verdict.seconds_in_wait >= (r.verdict.wedge_deadline
                                                      or r.verdict.deadline) / 2
                    for r, _ in members):
                for rank, sample in members:  # their GPU time read once ahead (macOS)
                    rec = rank.record
                    if not rank.escalating and sample.status not in STOPPED_STATUSES:
                        self.stacks.prime(Identity(rec.pid, rec.start_time, rec.uid,
                                                   rec.start_ticks), now)
                keys |= {r.key for r, _ in members}
            return keys
        # No thread busy in any rank of the job: no wedge to tell (it needs a spinning
        # thread), only a quiet hang to confirm at its deadline.
        quiet = not any(r.verdict is not None and r.verdict.hot for r, _ in members)
        keys = set()
        for rank, sample in members:
            rec = rank.record
            if rank.escalating or sample.status in STOPPED_STATUSES or rank.verdict is None:
                continue
            # Busy threads by the OS's ids only (macOS gives list positions: none then).
            busy = rank.verdict.hot if sample.native_ids else ()
            v = rank.verdict
            hold = now + v.deadline - v.seconds_in_wait - HOLD_LEAD if quiet else 0.0
            self.stacks.ask(Identity(rec.pid, rec.start_time, rec.uid, rec.start_ticks),
                            busy, now, hold)
            self.stacks.track_queues(rank.key, rec.pid, now, rec.backend,
                                     QUIET_QUEUES_EVERY if quiet else 0.0)
            keys.add(rank.key)
        return keys

    def settle(self, keys: list[Key]) -> None:
        """Ranks a response takes: none left under our stack sampler's trace."""
        self.stacks.settle(keys)

    # -- what is shown ---------------------------------------------------------------

    def probe_links(self, ranks: Iterable[Rank], now: float) -> bool:
        """Ranks waiting long: their data path probed (shown). True when the peers should
        be asked ahead: a verdict may come, and its peers' answers must be ready by then."""
        ranks = list(ranks)
        # Past half a deadline, or sampled early (its wedge may be decided at the lower
        # floor, which needs its link found up first).
        long = [r for r in ranks if r.state in WAITING_LONG
                or (r.state not in FINAL and self.early.sampled_early(r))]
        # Least lately asked first: with one probe under way per uid, a rank due again
        # first in the list would take the uid's turn at every scan, and a rank after it
        # never be probed (its wedge never at the exact floor, which needs its link up).
        for r in sorted(long, key=lambda r: self.links.asked.get(r.key, float("-inf"))):
            busy = r.verdict is not None and bool(r.verdict.hot)
            self.links.ask(r.key, now, r.record.backend, r.record.uid,
                           PROBE_EVERY if busy else QUIET_PROBE_EVERY)
        self.links.forget(r.key for r in long)
        for r in ranks:
            link = self.links.found.get(r.key)
            if link is not None or r.key in self.shown:
                self.shown.setdefault(r.key, Shown()).data_link = link
        # Within ASK_AHEAD of its deadline (or past it): a response's first signal must
        # not wait out an unreachable peer's timeout. Past half its wedge deadline with
        # a thread busy too: a job wedged across nodes is judged from the peers' answers
        # (remote_members), which must be there by its wedge deadline; a job with no
        # thread busy cannot be wedged, and is not asked for every 2 s of a quiet wait.
        soon = any(r.verdict is not None
                   and r.verdict.deadline - r.verdict.seconds_in_wait <= ASK_AHEAD
                   for r in long)
        wedging = any(r.verdict is not None and r.verdict.wedge_deadline > 0
                      and r.verdict.seconds_in_wait >= r.verdict.wedge_deadline / 2
                      and bool(r.verdict.hot) and r.state not in FINAL for r in ranks)
        wedging = wedging or any(r.state not in FINAL and self.early.sampled_early(r)
                                 for r in ranks)
        return bool(self.live.peering.peers) and (soon or wedging)
