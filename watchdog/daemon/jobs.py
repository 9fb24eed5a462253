"""One scan's judgement of each job: which of its ranks are due for a response, and what
each rank shows beside its lifecycle.

A job is its owner's uid with its id (job ids are world-readable: anyone may publish a
record naming one, so a hung rank only ever brings down ranks of its owner). At each
scan `Jobs.judge` groups the live ranks by job, decides the job's wedge
(judge/wedge.py) from its ranks here and, where every peer answered the background ask
a moment ago, its ranks there, and has the detector judge each rank; a job one of whose
ranks waits past its wedge deadline gets its ranks' native stacks sampled and their
sockets read (probes/stacksampler.py), which the next scans judge by. `probe_links`
probes the data path of every rank waiting long (probes/datalink.py), and `paces` scores
each job's ranks and names its straggler (judge/pacing.py, judge/stragglers.py): shown,
never acted on.

What a rank shows that is no part of its lifecycle (its data link, its sockets, its
pace, score and why) is kept here by rank (a `view.Shown`), read by `publish` and the
incident;
`Rank` (lifecycle.py) keeps only its life. The peers reach this room only as their
recent answers (`recent`), never asked from here: a scan never waits on the network.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from watchdog.backends import bytes_on_sockets
from watchdog.daemon.clock import Clock
from watchdog.daemon.config import Live
from watchdog.daemon.counters import Counters
from watchdog.daemon.judge import across, frames, gpuwork, wedge
from watchdog.daemon.judge.deadlines import Learned
from watchdog.daemon.judge.detector import Detector, foreign_tracer
from watchdog.daemon.judge.pacing import CLEAR_SLOWDOWN, Scored, summary, why
from watchdog.daemon.judge.stragglers import Figures, Stragglers
from watchdog.daemon.lifecycle import Edge, Key, Rank, transition
from watchdog.daemon.probes import Probe
from watchdog.daemon.probes.datalink import PROBE_EVERY, QUIET_PROBE_EVERY, Prober
from watchdog.daemon.probes.stacksampler import (
    HOLD_LEAD,
    MAX_RUNNING,
    QUIET_QUEUES_EVERY,
    Identity,
    Stacks,
    StackSampler,
)
from watchdog.daemon.sample import ProcessSample
from watchdog.daemon.view import Shown
from watchdog.states import (
    ENDED,
    FINAL,
    STOPPED_STATUSES,
    WAITING_LONG,
    FrameKind,
    Phase,
    ProcStatus,
    Unjudged,
)
from watchdog.status import NodeAnswer, RankStatus, Straggler

log = logging.getLogger(__name__)

JobKey = tuple[int, str]  # (uid, job): a job is its owner's
Due = dict[JobKey, list[Rank]]  # a job's ranks due for a response
LiveRanks = list[tuple[Rank, ProcessSample]]  # the scan's live ranks, each with its sample
# Seconds a peer's answer speaks for its ranks in a wedge judged across nodes: asked
# every act/peers.PREFETCH_EVERY (2 s) in the background, and the peer's facts were
# current at its last scan.
REMOTE_FRESH = 4.0
# Seconds before a rank's deadline from which the peers are asked ahead (every 2 s):
# answers fresh (act/peers.FRESH) whenever its verdict comes, confirming scans and all.
ASK_AHEAD = 10.0
# Early samples of one rank in one wait (`_track_early`): a second TWICE_APART after a
# first that read it waiting, another when one read nothing. A job whose sockets stand
# still for another reason (a peer computing) is never sampled more than this ahead of
# its wedge deadline.
EARLY_TRIES = 3
# A rank's byte counters read this lately speak for a transfer under way (holds.py):
# a waiting rank with nothing busy has them read every 3 s (QUIET_QUEUES_EVERY).
FLOW_FRESH = 5.0
# Two samples of one wait this far apart, both reading the rank in its backend's wait,
# before its stillness counts as exact (the lower wedge floor): no single sample decides.
TWICE_APART = 1.0
# A job an early sample found healthy (the wait returned) is not sampled early again for
# this long: a job whose every step has a long wait with its sockets still costs one
# early sample per rank in EARLY_HOLD seconds (~0.2% of a rank's time), and a wedge in
# that window is ended at the queue-based floor, as before issue 58.
EARLY_HOLD = 300.0
THERMAL_EVERY = 30.0  # seconds between two asks of the node's thermal state (macOS: a tool)


class Jobs:
    """One scan's judgement of every job on this node. Owns the detector (each rank's
    verdict), the stack sampler (a late job's stacks and sockets), the link prober (a
    waiting rank's data path) and the stragglers' tracker (each job's pace); reads the
    settings from the daemon's holder at use and the peers only as their recent answers.
    `judge` returns the ranks due for a response; `shown` is what each rank shows."""

    def __init__(self, live: Live, probe: Probe, clock: Clock, host: str,
                 learned: dict[str, dict[str, Learned]],
                 recent: Callable[[float], list[NodeAnswer] | None],
                 counters: Counters) -> None:
        self.live, self.probe, self.clock, self.host = live, probe, clock, host
        self.counters = counters  # a pace that could not be judged is counted there
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
        # Each rank's last minute of work and each job's straggler (reported, never ended).
        self.stragglers: Stragglers[Key, JobKey] = Stragglers()
        # A job whose only rank here is ripe, judged with its ranks on the peers
        # (judge/across.py); the seconds between the peers' asks it wants (None: none).
        self.across: across.Across[JobKey] = across.Across()
        self.ask_peers_every: float | None = None
        self.slow: tuple[Straggler, ...] = ()
        self.thermal: tuple[float, str | None] = (-1e9, None)  # (asked at, answer)
        self.shown: dict[Key, Shown] = {}
        # Each rank's last asleep sample as read (frames.asleep): read once, judged at
        # every scan while the sampler holds a quiet rank.
        self.asleep_read: dict[Key, tuple[Stacks, frames.Reading]] = {}
        # Each rank's last sample's busy threads as read (frames.classify): read once
        # per sample and GPU reading, not at every scan (issue 57, item 6).
        self.seen_read: dict[Key, tuple[Stacks, tuple[bool | None, str], frames.Reading]] = {}
        self.unread: set[Key] = set()  # ranks whose threads could not be read, logged
        # Per job, the last scan (monotonic ns) that saw a rank of it traced by a person:
        # its waits are judged from there (the detach), not from when they began.
        self.traced_at: dict[JobKey, int] = {}
        # Each rank's wait it was sampled early in, and when: a job exactly still
        # is sampled once a wait ahead of its wedge deadline (`_track_early`).
        # (its wait_since_ns, asked at, samples asked in that wait)
        self.early: dict[Key, tuple[int, float, int]] = {}
        self.early_held: dict[JobKey, float] = {}  # until when a job is not sampled early
        # Each rank's first sample read waiting in its current wait: (wait_since_ns, at).
        self.twice: dict[Key, tuple[int, float]] = {}

    def forget(self, key: Key) -> None:
        """A rank the table forgot: nothing of it kept here."""
        self.detector.forget(key)
        self.shown.pop(key, None)
        self.asleep_read.pop(key, None)
        self.seen_read.pop(key, None)
        self.unread.discard(key)
        self.early.pop(key, None)
        self.twice.pop(key, None)

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
        for members in jobs.values():
            seen = {rank.key: self._seen(rank, sample, now) for rank, sample in members}
            asleep_of = {rank.key: self._asleep(rank, now) for rank, _ in members}
            mine = [self._member(r, s, seen[r.key], asleep_of[r.key], now) for r, s in members]
            wedged = wedge.decide(mine + self.remote_members(members[0][0], len(mine),
                                                             now_ns))
            if log.isEnabledFor(logging.DEBUG) and any(seen.values()):
                log.debug("job %s: %s; wedged: %s", members[0][0].record.job,
                          [(r.record.rank, seen[r.key], self.stacks.queues.get(r.key))
                           for r, _ in members], wedged)
            present, where = self._present(members)
            for rank, sample in members:
                rec = rank.record
                if sample.threads_error and rank.key not in self.unread:
                    self.unread.add(rank.key)  # said once; its status says it at every scan
                    log.warning("job %s rank %s pid %s: %s", rec.job, rec.rank, rec.pid,
                                sample.threads_error)
                asleep, still, age = asleep_of[rank.key]
                verdict = self.detector.observe(rec, sample, now_ns, load,
                                                learn=not rank.escalating,
                                                seen=seen[rank.key], wedge=wedged,
                                                traced=traced(rank), asleep=asleep,
                                                sockets_quiet=still, asleep_age=age,
                                                judged_from_ns=self.traced_at.get(
                                                    (rec.uid, rec.job), 0),
                                                seen_ranks=present, seen_where=where,
                                                gpu_behind=self._behind(rank, now))
                flowing = self._flowing(rank, now)
                if flowing is not None:
                    verdict = replace(verdict, flowing=flowing)
                # Judged while a response has it: its verdict shown fresh, its state kept.
                edge = Edge.REJUDGED if rank.escalating else Edge.JUDGED
                transition(rank, edge, now, verdict=verdict)
                wait = (rec.wait_since_ns, rec.waits_completed)
                if verdict.act and not rank.escalating and rank.acted_on != wait:
                    due.setdefault((rec.uid, rec.job), []).append(rank)
            sampled |= self._sample_stacks(members, now)
        self.stacks.forget(sampled)
        return due

    def _flowing(self, rank: Rank, now: float) -> float | None:
        """Seconds since bytes last moved on a socket of the rank open at two reads in a
        row, when its counters (exact) were read lately; None otherwise (holds.py)."""
        queues = self.stacks.queues.get(rank.key)
        if queues is None or not queues.exact or queues.flowed is None \
                or now - queues.read_at > FLOW_FRESH:
            return None
        return now - queues.flowed

    def _behind(self, rank: Rank, now: float) -> str:
        """What the rank's GPU work waits behind (another process's GPU work, macOS), at
        its latest fresh sample; "" when nothing (judge/gpuwork.behind)."""
        found = self.stacks.found.get(rank.key)
        if found is None or not found.gpu_behind or now - found.at > wedge.FRESH:
            return ""
        return gpuwork.behind(found.gpu_behind, found.gpu_power,
                              1000 * self.live.rules.gpu_spin_watts)

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

    def _seen(self, rank: Rank, sample: ProcessSample, now: float) -> frames.Reading | None:
        """What the rank's busy threads ran at its latest stack sample, if fresh. None
        when it was taken with no thread busy where the OS names the busy threads (Linux):
        nothing spins, so no wedge (a quiet rank is judged by `_asleep`)."""
        found = self.stacks.found.get(rank.key)
        if found is None or now - found.at > wedge.FRESH:
            return None
        gpu = gpuwork.read(found.gpu_moved, found.gpu_power,
                           1000 * self.live.rules.gpu_spin_watts, found.gpu_share)
        if gpu[0]:  # its GPU works: computing, whatever its threads did (or were read)
            return frames.Reading(FrameKind.COMPUTING, frames.GPU_ADVANCES, gpu=True)
        if sample.native_ids and not found.busy and found.stacks:
            return None
        unknown = self._gpu_unknown(found)
        if found.stacks is None or found.error:
            return frames.Reading(FrameKind.UNKNOWN,
                                  found.error or "no native stack could be read",
                                  gpu_unknown=unknown)
        read = self.seen_read.get(rank.key)
        if read is None or read[0] is not found or read[1] != gpu:
            read = self.seen_read[rank.key] = (found, gpu, frames.classify(
                found.stacks, found.busy, rank.record.backend, *gpu, unknown=unknown))
        return read[2]

    def _gpu_unknown(self, found: Stacks) -> str:
        """Why the rank's GPU time is unknown where MLX computes on a GPU (macOS); ""
        when it was read both times, or where no GPU time is kept (Linux)."""
        if not self.probe.gpu_clock or found.gpu_moved is not None:
            return ""
        return found.gpu_why or "not read"

    def _asleep(self, rank: Rank, now: float) -> tuple[frames.Reading | None, float | None,
                                                       float]:
        """What the rank waits in at its latest sample taken with no thread busy
        (frames.asleep), the seconds its sockets' queues stood still (None: not read),
        and that sample's age: the quiet hang's facts (detector._quiet)."""
        found = self.stacks.found.get(rank.key)
        queues = self.stacks.queues.get(rank.key)
        still = (now - queues.since if queues is not None and queues.queues is not None
                 else None)
        if found is None or found.busy or found.error:
            return None, still, 0.0
        read = self.asleep_read.get(rank.key)
        if read is None or read[0] is not found:
            works, flat = gpuwork.read(found.gpu_moved, found.gpu_power,
                                       1000 * self.live.rules.gpu_spin_watts,
                                       found.gpu_share)
            read = self.asleep_read[rank.key] = (found, frames.asleep(
                found.stacks, rank.record.backend, works, main=rank.record.pid, flat=flat,
                unknown=self._gpu_unknown(found)))
        return read[1], still, now - found.at

    def _member(self, rank: Rank, sample: ProcessSample, seen: frames.Reading | None,
                asleep: tuple[frames.Reading | None, float | None, float],
                now: float) -> wedge.Member:
        rec = rank.record
        queues = self.stacks.queues.get(rank.key)
        known = queues is not None and queues.queues is not None
        shown = self.shown.setdefault(rank.key, Shown())
        # Nothing busy, its fresh sample finds it parked in its backend's wait: a member
        # as a spinning rank is (a quiet wedge), when its stillness is exact (wedge.py).
        parked = (seen is None and asleep[0] is not None
                  and asleep[0].kind == FrameKind.WAITING and asleep[2] <= wedge.FRESH
                  and not (rank.verdict is not None and rank.verdict.hot))
        if parked:
            seen = asleep[0]
        # Exact only on byte counters and two samples of this wait read in its backend's
        # wait, TWICE_APART apart: no single sample decides a wedge at the lower floor.
        exact = queues is not None and known and queues.exact and self._read_twice(rank, seen)
        # Published (/status) for a peer judging the job across nodes.
        shown.sockets = ((now - queues.since, queues.unread, exact)
                         if queues is not None and known else None)
        return wedge.Member(
            rank=rec.rank, world_size=rec.world_size, phase=rec.phase,
            waiting_since_ns=rec.wait_since_ns, collectives=rec.collectives,
            op=f"{rec.op} ({rec.flight[-1].op if rec.flight else ''})",
            stopped=sample.status in STOPPED_STATUSES or foreign_tracer(sample), seen=seen,
            quiet=now - queues.since if queues is not None and known else None,
            unread=queues.unread if queues is not None else 0, link=shown.data_link,
            exact=wedge.exact_reading(exact, rec.backend, shown.data_link), parked=parked)

    def _read_twice(self, rank: Rank, seen: frames.Reading | None) -> bool:
        """Have two stack samples taken in the rank's current wait, TWICE_APART apart or
        more, both read it in its backend's wait (and none between read anything else)?"""
        rec, found = rank.record, self.stacks.found.get(rank.key)
        if seen is None or seen.kind != FrameKind.WAITING or found is None \
                or rec.wait_since_ns <= 0 or found.at * 1e9 < rec.wait_since_ns:
            self.twice.pop(rank.key, None)
            return False
        first = self.twice.get(rank.key)
        if first is None or first[0] != rec.wait_since_ns:
            first = self.twice[rank.key] = (rec.wait_since_ns, found.at)
        return found.at - first[1] >= TWICE_APART

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
            keys = self._track_early(members, now)
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

    def _track_early(self, members: LiveRanks, now: float) -> set[Key]:
        """A job whose every rank here has waited wedge.TRACK_AFTER in the same collective
        (or a ring neighbour's next): its sockets' byte counters read at every scan (no
        stop of a rank). Exactly still for wedge.EARLY_STILL on every rank: each rank
        sampled in this wait, ahead of its wedge deadline, twice TWICE_APART apart
        (`_early_again`), and its link probed, so that a wedge is decided from the two at
        `wedge_floor_exact`. A slow link or a long all_sum moving bytes is never still and
        never sampled early; a peer computing while the sockets stand still costs at most
        two samples a wait. The ranks tracked."""
        one = members[0][0].record
        job = (one.uid, one.job)
        for rank, _ in members:
            early = self.early.get(rank.key)
            if early is not None and early[0] != rank.record.wait_since_ns:
                # The wait it was sampled early in returned: a healthy job whose sockets
                # stand still while it works (a peer computing each step) is not
                # sampled early again for EARLY_HOLD seconds.
                del self.early[rank.key]
                self.early_held[job] = now + EARLY_HOLD
        if now < self.early_held.get(job, 0.0):
            return set()
        self.early_held.pop(job, None)
        if one.world_size < 2 or (len(members) < one.world_size
                                  and not self.live.peering.peers):
            return set()
        for rank, sample in members:
            v, rec = rank.verdict, rank.record
            if v is None or rank.escalating or rec.phase != Phase.WAIT \
                    or v.wedge_deadline <= 0 or v.seconds_in_wait < wedge.TRACK_AFTER \
                    or sample.status in STOPPED_STATUSES or foreign_tracer(sample) \
                    or not bytes_on_sockets(rec.backend):
                return set()  # a person's debugger on it: never a sample of ours
        numbers = [r.record.collectives for r, _ in members]
        ops = {(r.record.op, r.record.flight[-1].op if r.record.flight else "")
               for r, _ in members}
        if max(numbers) - min(numbers) > 1 or len(ops) != 1:
            return set()
        still = True
        for rank, _ in members:
            rec = rank.record
            queues = self.stacks.track_queues(rank.key, rec.pid, now, rec.backend)
            still = still and queues.exact and queues.queues is not None \
                and now - queues.since >= wedge.EARLY_STILL
        if still:
            for rank, sample in members:
                rec = rank.record
                tries = self.early[rank.key][2] if self.sampled_early(rank) else 0
                if tries >= EARLY_TRIES or (tries and not self._early_again(rank, now)):
                    continue
                assert rank.verdict is not None
                busy = rank.verdict.hot if sample.native_ids else ()
                if self.stacks.ask(Identity(rec.pid, rec.start_time, rec.uid,
                                            rec.start_ticks), busy, now, every=TWICE_APART):
                    self.early[rank.key] = (rec.wait_since_ns, now, tries + 1)
        return {rank.key for rank, _ in members}

    def sampled_early(self, rank: Rank) -> bool:
        """Was the rank sampled early in its current wait (`_track_early`)?"""
        early = self.early.get(rank.key)
        return rank.record.wait_since_ns > 0 and early is not None \
            and early[0] == rank.record.wait_since_ns

    def _early_again(self, rank: Rank, now: float) -> bool:
        """Is the rank sampled early once more in this wait (EARLY_TRIES in all)? When its
        last early sample is in and read nothing (gdb past its time box on a loaded node),
        or read it waiting with no second sample TWICE_APART after a first (`_read_twice`);
        never after one that read it doing anything else."""
        found = self.stacks.found.get(rank.key)
        if found is None or found.at < self.early[rank.key][1]:
            return False  # the last one asked is not in yet
        if found.stacks is None or bool(found.error) or not found.stacks:
            return True
        first = self.twice.get(rank.key)
        return first is not None and first[0] == rank.record.wait_since_ns \
            and found.at - first[1] < TWICE_APART <= now - found.at

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
                or (r.state not in FINAL and self.sampled_early(r))]
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
        wedging = wedging or any(r.state not in FINAL and self.sampled_early(r) for r in ranks)
        return bool(self.live.peering.peers) and (soon or wedging)

    def paces(self, live: LiveRanks, now: float) -> None:
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
            shown = self.shown.setdefault(rank.key, Shown())
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
        shown = self.shown.setdefault(r.key, Shown())
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
