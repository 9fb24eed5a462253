"""The per-node loop, and only its wiring: scan, judge, hold, act, publish.

Each tick the rank table (table.py) reads every record and sorts it; the detector
judges the live ranks; holds.py holds the due ranks of a job whose peer computes;
the rest go to a response (act/responses.py), which the loop steps on its own
thread, at every tick and between ticks while one is under way, as it begins the
fences the HTTP thread queued (fences.py). What each response did comes back and
is applied to its ranks. The loop never dies: any error is logged, counted and the
next tick comes. What it knows is published as one immutable snapshot (a
`status.NodeStatus`) for the metrics endpoint, `/status` and `status.json`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from watchdog import __version__
from watchdog.daemon import holds, roomkeeper
from watchdog.daemon.act import told
from watchdog.daemon.act.enforcer import Enforcer, Outcome
from watchdog.daemon.act.incidents import new_incident
from watchdog.daemon.act.peers import Peers
from watchdog.daemon.act.responses import Response, Responses
from watchdog.daemon.act.workers import FairWork
from watchdog.daemon.clock import Clock
from watchdog.daemon.config import KillScope, Live, Settings
from watchdog.daemon.counters import Counters
from watchdog.daemon.fences import Fences
from watchdog.daemon.judge import frames, wedge
from watchdog.daemon.judge.detector import Detector
from watchdog.daemon.judge.stragglers import CLEAR_SLOWDOWN, Stragglers, summary, why
from watchdog.daemon.lifecycle import Edge, Key, Rank, transition
from watchdog.daemon.probes import Probe, ProbeError, probe
from watchdog.daemon.probes.datalink import Prober
from watchdog.daemon.probes.exits import ExitWatcher
from watchdog.daemon.probes.stacksampler import MAX_RUNNING, Identity, StackSampler
from watchdog.daemon.publish import INVALID_LISTED, snapshot
from watchdog.daemon.sample import ProcessSample
from watchdog.daemon.signaller import Result, Signaller
from watchdog.daemon.store import journal, launchlog, learning, pending
from watchdog.daemon.table import RankTable
from watchdog.states import (
    FINAL,
    STOPPED_STATUSES,
    WAITING_LONG,
    FrameKind,
    Mode,
    ProcStatus,
    State,
)
from watchdog.status import Fence, FenceAnswer, NodeStatus, Straggler, job_key

log = logging.getLogger(__name__)

Due = dict[tuple[int, str], list[Rank]]  # (uid, job) -> its ranks due for action
# Seconds a peer's answer speaks for its ranks in a wedge judged across nodes: asked
# every act/peers.PREFETCH_EVERY (2 s) in the background, and the peer's facts were
# current at its last scan.
REMOTE_FRESH = 4.0


class Daemon:
    """One node's watchdog: each scan reads the record directory, judges every live
    rank, starts and steps the responses, and publishes the snapshot every reader gets
    (status.json, /status, /metrics). Only wiring: the judging is `judge/`, the acting
    `act/`, the reading of the OS `probes/`."""

    def __init__(self, settings: Settings, probe_: Probe | None = None,
                 signaller: Signaller | None = None, *, clock: Clock | None = None) -> None:
        # The one holder every part reads its settings from: a reload is one assignment.
        self.live = Live(settings)
        self.clock = clock = clock or Clock()
        self.probe = probe_ or probe()
        self.signaller = signaller or Signaller(self.probe)
        # The responses' workers, each kind its own so none waits behind another:
        # evidence and its parse (one capture in flight per uid: workers.py) and the
        # peers' background asks; a view and a fence each get a thread of their own.
        self.executor = FairWork(4, "evidence")
        self.asking = ThreadPoolExecutor(max_workers=2, thread_name_prefix="peers")
        self.enforcer = Enforcer(self.live, self.signaller, self.probe, wall=clock.wall,
                                 executor=self.executor)
        self.learned = learning.Keeper(settings.state_dir, clock.wall(), clock=clock.monotonic)
        self.detector = Detector(lambda: self.live.rules, self.learned.learned)
        self.host = socket.gethostname()
        self.counters = Counters.zeroed()
        self.table = RankTable(settings.dir, self.probe, self.signaller, self.counters,
                               self.detector.forget)
        self.ranks = self.table.ranks  # the same dict, for every reader
        self.launches = launchlog.Counts(settings.state_dir)  # restarts, refusals, give-ups
        self.wired: int | None = None
        self.baseline: int | None = None
        self.last_scan_wall = 0.0
        self.last_scan_mono = 0.0
        # Why the last scan was blind ("" when it was not): it could not list the
        # directory or ran out of descriptors probing. Such a scan is no sign of health.
        self.scan_trouble = ""
        self.started = clock.wall()
        # Before the first scan: enough for /metrics to show the start time.
        self.snapshot = NodeStatus(host=self.host, version=__version__, started=self.started)
        self.stop_event = threading.Event()
        # The scan and an incoming fence (HTTP thread) both touch the rank table.
        self.lock = threading.RLock()
        self.wake = threading.Event()  # set by the exit watcher or a fence: scan now
        self.peers = Peers(self.live, self.host, self.asking, self.started,
                           clock=clock.monotonic, wall=clock.wall)
        self.fences = Fences(self.live, self.host, self.peers, self.table, self.lock, self.wake)
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
        self.stacks = StackSampler(self.probe, self.sampling.submit, clock.monotonic)
        self.responses = Responses(self.live, self.enforcer, self.peers,
                                   lambda: self.snapshot, lambda: self.baseline)
        self.exits = ExitWatcher(self.wake)
        # Room in the record directory for every user's next rank; why it is full
        # and nothing can free it ("" while there is room), published and alerted on.
        self.keeper = roomkeeper.Keeper(settings.dir, self.probe.deleted_holders)
        self.room_full = ""
        # Each rank's last minute of work and each job's straggler (reported, never ended).
        self.stragglers = Stragglers()
        self.slow: tuple[Straggler, ...] = ()
        self.thermal: tuple[float, str | None] = (-1e9, None)  # (asked at, answer)

    @property
    def settings(self) -> Settings:
        return self.live.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self.live.settings = settings

    # -- one tick --------------------------------------------------------------

    def scan(self) -> None:
        with self.lock:
            self._scan()

    def _scan(self) -> None:
        started = self.clock.monotonic()
        now_ns = self.clock.monotonic_ns()
        now = now_ns / 1e9
        self._collect_finished()
        self._begin_fences()
        self.room_full = self.keeper.keep()  # one statvfs; room for every user's ranks
        found = self.table.read(now)
        self._deaths(now)
        due = self._judge(found.live, now_ns)
        due = holds.hold(due, self.ranks.values(), self.detector.rules, now)
        self._probe_links(now)
        self.table.sweep(now)
        self._deaths(now)
        self.table.expire(now, self.settings.retention)
        self.exits.watch(self.table.live_pids())  # pidfds shared out fairly between the users
        self._sample_wired()
        self.enforcer.backlog.flush()  # what a full or failing disk held back
        for (uid, job), ranks in due.items():
            self._escalate(uid, job, ranks)
        for ending, ranks in self.fences.orphaned(now):
            self._escalate(ending.uid, ending.job, ranks, fenced=ending.fence)
        self._paces(found.live, now)
        self.learned.keep(self.detector, self.clock.wall())
        trouble = found.trouble
        if not self.table.records.listed:
            trouble.append(f"cannot list {self.settings.dir}")
        self.scan_trouble = "; ".join(sorted(set(trouble)))
        self.counters.observe_scan(self.clock.monotonic() - started)
        self.last_scan_wall, self.last_scan_mono = self.clock.wall(), self.clock.monotonic()
        self.publish()

    def _judge(self, live: list[tuple[Rank, ProcessSample]], now_ns: int) -> Due:
        """Each live rank's verdict; the ranks due for action, by job. A job is its
        owner's uid with its id: job ids are world-readable and anyone may publish a
        record naming one, so a hung rank only ever brings down ranks of its owner."""
        load = self.probe.load_per_cpu()
        now = now_ns / 1e9
        due: Due = {}
        jobs: dict[tuple[int, str], list[tuple[Rank, ProcessSample]]] = {}

        def traced(rank: Rank) -> bool:  # by our stack sampler, since the last scan
            return self.stacks.tracing(rank.key, self.last_scan_mono)
        for rank, sample in live:
            if sample.status == ProcStatus.TRACING_STOP and traced(rank):
                # Stopped by our own stack sample, for half a second: not a pause.
                sample = replace(sample, status=ProcStatus.RUNNING)
            jobs.setdefault((rank.record.uid, rank.record.job), []).append((rank, sample))
        sampled: set[tuple[int, float]] = set()
        for members in jobs.values():
            seen = {rank.key: self._seen(rank, sample, now) for rank, sample in members}
            mine = [self._member(r, s, seen[r.key], now) for r, s in members]
            wedged = wedge.decide(mine + self._remote_members(members[0][0], len(mine),
                                                              now_ns))
            if log.isEnabledFor(logging.DEBUG) and any(seen.values()):
                log.debug("job %s: %s; wedged: %s", members[0][0].record.job,
                          [(r.record.rank, seen[r.key], self.stacks.queues.get(r.key))
                           for r, _ in members], wedged)
            for rank, sample in members:
                rec = rank.record
                asleep, still = self._asleep(rank, now)
                verdict = self.detector.observe(rec, sample, now_ns, load,
                                                learn=not rank.escalating,
                                                seen=seen[rank.key], wedge=wedged,
                                                traced=traced(rank), asleep=asleep,
                                                sockets_quiet=still)
                # Judged while a response has it: its verdict shown fresh, its state kept.
                edge = Edge.REJUDGED if rank.escalating else Edge.JUDGED
                transition(rank, edge, now, verdict=verdict)
                wait = (rec.wait_since_ns, rec.waits_completed)
                if verdict.act and not rank.escalating and rank.acted_on != wait:
                    due.setdefault((rec.uid, rec.job), []).append(rank)
            sampled |= self._sample_stacks(members, now)
        self.stacks.forget(sampled)
        return due

    def _seen(self, rank: Rank, sample: ProcessSample, now: float) -> frames.Reading | None:
        """What the rank's busy threads ran at its latest stack sample, if fresh. None
        when it was taken with no thread busy where the OS names the busy threads (Linux):
        nothing spins, so no wedge (a quiet rank is judged by `_asleep`)."""
        found = self.stacks.found.get(rank.key)
        if found is None or now - found.at > wedge.FRESH:
            return None
        if sample.native_ids and not found.busy and found.stacks:
            return None
        if found.stacks is None or found.error:
            return frames.Reading(FrameKind.UNKNOWN, found.error or "no native stack could be read")
        return frames.classify(found.stacks, found.busy, rank.record.backend, found.gpu_moved)

    def _asleep(self, rank: Rank, now: float) -> tuple[frames.Reading | None, float | None]:
        """What the rank waits in at its latest sample, when fresh and taken with no thread
        busy (frames.asleep), and the seconds its sockets' queues stood still (None: not
        read): the quiet hang's facts (detector._quiet)."""
        found = self.stacks.found.get(rank.key)
        queues = self.stacks.queues.get(rank.key)
        still = (now - queues.since if queues is not None and queues.queues is not None
                 else None)
        if found is None or now - found.at > wedge.FRESH or found.busy or found.error:
            return None, still
        return frames.asleep(found.stacks, rank.record.backend, found.gpu_moved,
                             main=rank.record.pid), still

    def _member(self, rank: Rank, sample: ProcessSample, seen: frames.Reading | None,
                now: float) -> wedge.Member:
        rec = rank.record
        queues = self.stacks.queues.get(rank.key)
        known = queues is not None and queues.queues is not None
        # Published (/status) for a peer judging the job across nodes.
        rank.sockets = (now - queues.since, queues.unread) if queues is not None and known \
            else None
        return wedge.Member(
            rank=rec.rank, world_size=rec.world_size, phase=rec.phase,
            waiting_since_ns=rec.wait_since_ns, collectives=rec.collectives,
            op=f"{rec.op} ({rec.flight[-1].op if rec.flight else ''})",
            stopped=sample.status in STOPPED_STATUSES, seen=seen,
            quiet=now - queues.since if queues is not None and known else None,
            unread=queues.unread if queues is not None else 0, link=rank.data_link)

    def _remote_members(self, one: Rank, here: int, now_ns: int) -> list[wedge.Member]:
        """The job's ranks on the other nodes, as members, from every peer's answer to
        the background ask (at most REMOTE_FRESH seconds old; never asked here: the scan
        never waits on the network). None while a peer did not answer (a partition
        keeps today's rules) or all the job's ranks are here. Only with the shared secret:
        then every answer was signed with it (peers.py), and anything else answering at a
        peer's address, whose `/status` is anyone's to fake, makes no wedge."""
        rec = one.record
        peers = self.settings.peers
        if not peers or not self.live.peering.secret or here >= rec.world_size:
            return []
        answers = self.peers.recent(REMOTE_FRESH)
        if answers is None or len(answers) != len(peers) \
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
                    REMOTE_FRESH + (status.interval or self.settings.interval):
                return []
            host = status.host if status.host and status.host != self.host else answer.peer
            for r in status.ranks:
                if r.job == rec.job and r.uid == rec.uid and r.state not in FINAL:
                    member = wedge.remote(r, host, now_ns)
                    if member is None:
                        return []  # a rank of the job unknown: no wedge
                    members.append(member)
        return members

    def _sample_stacks(self, members: list[tuple[Rank, ProcessSample]],
                       now: float) -> set[tuple[int, float]]:
        """A job one of whose ranks waits past its wedge deadline (or its deadline): its
        ranks' stacks sampled and their sockets' queues read; the ranks sampled."""
        def late(rank: Rank) -> bool:
            v = rank.verdict
            return v is not None and v.seconds_in_wait > 0 and \
                v.seconds_in_wait >= (v.wedge_deadline or v.deadline)
        if not any(late(r) for r, _ in members):
            return set()
        keys = set()
        for rank, sample in members:
            rec = rank.record
            if rank.escalating or sample.status in STOPPED_STATUSES or rank.verdict is None:
                continue
            # Busy threads by the OS's ids only (macOS gives list positions: none then).
            busy = rank.verdict.hot if sample.native_ids else ()
            self.stacks.ask(Identity(rec.pid, rec.start_time, rec.uid, rec.start_ticks),
                            busy, now)
            self.stacks.track_queues(rank.key, rec.pid, now, rec.backend)
            keys.add(rank.key)
        return keys

    def _paces(self, live: list[tuple[Rank, ProcessSample]], now: float) -> None:
        """Each live rank's minute of work, each job scored, its straggler named when clear
        (judge/stragglers.py): shown, never acted on. After the responses began, and never
        in their way: an error here is logged and counted, and the scan goes on."""
        try:
            self._judge_paces(live, now)
        except Exception:  # noqa: BLE001 - a report must never stop the hang's response
            self.counters.loop_errors += 1
            log.exception("judging the ranks' pace failed")

    def _judge_paces(self, live: list[tuple[Rank, ProcessSample]], now: float) -> None:
        jobs: dict[tuple[int, str], list[Rank]] = {}
        for rank, sample in live:
            self.stragglers.observe(rank.key, rank.record, sample, now)
            jobs.setdefault((rank.record.uid, rank.record.job), []).append(rank)
        seen = {rank.key for rank, _ in live}
        for key in [k for k in self.stragglers.tracks if k not in seen]:
            self.stragglers.forget(key)
        self.stragglers.forget_jobs(jobs)
        slow = []
        for (uid, job), ranks in jobs.items():
            by_key: dict[object, Rank] = {r.key: r for r in ranks}
            scored, worst = self.stragglers.judge_job((uid, job), list(by_key), now)
            # The rank the others wait for most, when it holds them back at all: the one
            # whose why is shown (the fast ranks' figures need none).
            lowest = min(scored, key=lambda s: (s.score, -s.excess), default=None)
            for r in ranks:
                # Shown once known, on a busy machine too; while not judged, why in words.
                shown = self.stragglers.figures.get(r.key)
                pace = shown.pace if shown is not None else None
                judged = shown is not None and shown.unjudged in (None, "alone", "user_space_wait")
                if judged and pace is not None and now - self.thermal[0] >= 30.0:
                    self.thermal = (now, self.probe.thermal())  # a subprocess on macOS: rarely
                r.pace, r.pace_score = pace, shown.score if shown is not None else None
                r.pace_note = shown.note if shown is not None else None
                r.pace_unjudged = shown.unjudged if shown is not None else None
                held_back = (shown is not None and shown.judged and lowest is not None
                             and lowest.key == r.key and lowest.slowdown >= CLEAR_SLOWDOWN)
                # The only rank of its job here: the cluster view judges it, by this why; a
                # rank with no wait share (MPI, JACCL): the causes the node sees, unscored.
                alone = shown is not None and shown.unjudged in ("alone", "user_space_wait")
                r.pace_why = (why(lowest.pace, self.thermal[1]) if held_back and lowest
                              else why(pace, self.thermal[1]) if alone and pace
                              else "" if pace is not None else None)
            if worst is None or worst.key not in by_key:
                continue
            rec = by_key[worst.key].record
            cause = why(worst.pace, self.thermal[1])
            slow.append(Straggler(
                job=job, uid=uid, rank=rec.rank, host=rec.host or self.host, pid=rec.pid,
                score=round(worst.score, 3), slowdown=round(worst.slowdown, 3),
                others_wait=round(worst.excess, 3), why=cause,
                summary=summary(rec.rank, rec.host or self.host, worst.excess, cause)))
        self.slow = tuple(sorted(slow, key=lambda s: (s.job, s.uid or 0)))

    def _probe_links(self, now: float) -> None:
        """Ranks waiting long: their data path probed (shown); the peers asked ahead."""
        long = [r for r in self.ranks.values() if r.state in WAITING_LONG]
        for r in long:
            self.links.ask(r.key, now, r.record.backend, r.record.uid)
        self.links.forget(r.key for r in long)
        for r in self.ranks.values():
            r.data_link = self.links.found.get(r.key)
        # Past half its wedge deadline too: a job wedged across nodes is judged from the
        # peers' answers (_remote_members), which must be there by its wedge deadline.
        wedging = any(r.verdict is not None and r.verdict.wedge_deadline > 0
                      and r.verdict.seconds_in_wait >= r.verdict.wedge_deadline / 2
                      and r.state not in FINAL for r in self.ranks.values())
        if self.settings.peers and (long or wedging):
            self.peers.prefetch()  # a verdict may come: its peers' answers ready by then

    def _deaths(self, now: float) -> None:
        """Ranks that died taking their job down: the peers fenced, the orphans kept."""
        for death in self.table.take_deaths():
            self.fences.died(death, now)

    def _begin_fences(self) -> None:
        """The peers' fences queued by the HTTP thread: their responses begun here."""
        for ending, ranks in self.fences.queued():
            self._escalate(ending.uid, ending.job, ranks, fenced=ending.fence)
        for uid, job, term_in in self.fences.hurried():
            self.responses.hurry(uid, job, term_in)

    def _sample_wired(self) -> None:
        try:
            self.wired = self.probe.wired_bytes()
        except ProbeError as err:
            self.counters.probe_errors += 1
            log.warning("wired memory probe failed: %s", err)
            return
        live = any(r.state not in FINAL for r in self.ranks.values())
        if self.wired is not None and (self.baseline is None or (not live and not self.pending)):
            self.baseline = self.wired  # the node at rest: what a kill must return to

    # -- acting ----------------------------------------------------------------

    def _escalate(self, uid: int, job: str, due: list[Rank],
                  fenced: Fence | None = None) -> None:
        local = self.table.job(uid, job)
        due = [r for r in due if r.record.uid == uid]
        # A fence names its ranks (a peer's: every live one of the job; a local death's:
        # those alive with the dead rank), the verdict the job's or the due ones.
        named = {r.key for r in due}
        targets = ([r for r in local if r.key in named] if fenced is not None else
                   local if self.settings.kill_scope == KillScope.JOB else due)
        if not targets:
            return
        incident = new_incident(
            wall=self.clock.wall(), host=self.host, uid=uid, job=job,
            mode=self.settings.mode, kill_scope=self.settings.kill_scope, due=due,
            targets=targets, local=local, fenced=fenced)
        ask_peers = bool(self.settings.peers) and fenced is None
        if not ask_peers:  # else the response logs it, once it knows it will not hold
            log.error("%s", told.verdict_line(incident, self.settings.mode == Mode.ENFORCE,
                                              (r.record.rank for r in targets)))
        now = self.clock.monotonic()
        acted = set() if fenced else {r.key for r in due}  # a fence is no verdict on a wait
        for rank in targets:
            if ask_peers:
                holds.shown_held(rank, now)
            rec = rank.record
            transition(rank, Edge.ESCALATED, now, wait=(rec.wait_since_ns, rec.waits_completed)
                       if rank.key in acted else None)
        keys = [r.key for r in targets]
        others = [r for r in self.ranks.values() if r.key not in keys]

        def others_live() -> bool:
            return any(r.state not in FINAL for r in others)

        may_hold = fenced is None and holds.may_hold(due, self.detector.rules)
        self.stacks.settle(keys)  # no rank of it still under our stack sampler's trace
        self.responses.start(keys, now, uid, job, incident,
                             [r.target() for r in targets], others_live,
                             ask_peers=ask_peers, may_hold=may_hold, evidence=fenced is None,
                             term_in=None if fenced is None else self.fences.term_in(fenced))

    def fence_request(self, headers: object, body: bytes,
                      sender: str = "") -> tuple[int, FenceAnswer]:
        """An incoming `POST /fence` from `sender` (the HTTP thread): authenticated and
        queued; the loop's thread ends the ranks (fences.py)."""
        return self.fences.request(headers, body, sender)

    def _retry(self, keys: list[Key]) -> None:
        """An escalation that failed did not end its wait: judge those ranks afresh."""
        self.table.replaying.difference_update(keys)
        for key in keys:
            rank = self.ranks.get(key)
            if rank is not None:
                transition(rank, Edge.RETRIED, self.clock.monotonic())

    @property
    def pending(self) -> list[Response]:
        """Responses under way, each with the ranks it ends."""
        return self.responses.pending

    def step_responses(self) -> None:
        """Between scans: fences queued begun, the responses' steps that are due (a
        grace, a SIGKILL). A response that finished is followed by a scan at once (which
        publishes): its ranks ended, and those that went on their own meanwhile (ending
        on the error the fence caused, seen gone only once the response let them go),
        are what `cluster status` and the peers' judgement read next, not the wait they
        were in until the next scan."""
        with self.lock:
            self._begin_fences()
            if self._collect_finished():
                self._scan()

    def _collect_finished(self) -> bool:
        """Every response's due steps; what each finished one did, applied to its ranks.
        True when one finished."""
        now = self.clock.monotonic()
        finished = self.responses.step(now)
        for keys, outcome in finished:
            if outcome is None:
                self._retry(keys)
            elif outcome.held:
                log.info("job %s: %s", outcome.incident.job, outcome.held)
                self.table.replaying.difference_update(keys)
                holds.peer_held([self.ranks[k] for k in keys if k in self.ranks],
                                outcome.held, now)
                self._acted(keys, outcome.incident.cause)
            else:
                self._ended(keys, outcome, now)
        return bool(finished)

    def _acted(self, keys: list[Key], cause: str | None) -> None:
        """A response is done: its ranks keep its incident's cause, shown with them (while
        it was under way, `publish` read the response's own)."""
        for key in keys:
            rank = self.ranks.get(key)
            if rank is not None and cause:
                rank.cause = cause

    def _ended(self, keys: list[Key], outcome: Outcome, now: float) -> None:
        # A hang acted on (not a fence, not a hold: a hold re-asked every 5 s is no
        # new stall) counts once its response is done.
        verdict = outcome.incident.verdict
        if verdict in self.counters.stalls:
            self.counters.stall(verdict, outcome.incident.cause)
        for name in outcome.signals_sent:
            if name in self.counters.kills:
                self.counters.kills[name] += 1
        self.table.replaying.difference_update(keys)
        self._acted(keys, outcome.incident.cause)
        for key in keys:
            rank = self.ranks.get(key)
            if rank is None:
                if outcome.results.get(key[0]) == State.KILLED:  # a replay's, not yet seen
                    self.table.ended_by_us[key] = outcome.incident.id
                continue
            result = outcome.results.get(rank.record.pid)
            if result == State.KILLED:
                transition(rank, Edge.KILLED, now,
                           f"ended by the watchdog (incident {outcome.incident.id})")
                counted = job_key(rank.record.uid, rank.record.job)  # per (uid, job)
                self.counters.job_kills[counted] = self.counters.job_kills.get(counted, 0) + 1
                self.table.remove_record(rank)
            elif result == State.UNKILLABLE:
                transition(rank, Edge.UNKILLABLE, now, "survived SIGKILL; node flagged for reboot")
            elif result == Result.UNKNOWN:
                # Its identity could not be checked, so it was left alone:
                # judged afresh next scan rather than given up for this wait.
                transition(rank, Edge.RETRIED, now)
            elif not outcome.results and self.settings.mode == Mode.ENFORCE \
                    and outcome.incident.mode == Mode.OBSERVE:
                # Observed while a reload switched to enforce: its wait judged afresh.
                transition(rank, Edge.RETRIED, now)
            else:  # observed, or not ended by us (gone, not ours, denied, its own exit)
                transition(rank, Edge.RELEASED, now)

    def replay(self) -> None:
        """Complete, on the workers, every response an earlier daemon journaled and
        did not close (killed mid-ladder or mid-settle): its kill is recorded as
        one, its flag raised, and its ranks are not judged again meanwhile."""
        for entry in pending.unfinished(self.settings.state_dir):
            keys = [(t.pid, t.start_time) for t in entry.targets]
            self.table.replaying.update(keys)

            def others_live(keys: list[Key] = keys) -> bool:
                return any(r.state not in FINAL for k, r in self.ranks.items() if k not in keys)

            try:
                ladder = self.enforcer.resume(entry, others_live)
            except Exception as err:  # noqa: BLE001 - a bad entry never stops a start
                self.table.replaying.difference_update(keys)
                pending.set_aside(pending.path_of(self.settings.state_dir, entry.incident.id),
                                  repr(err))
                continue
            self.responses.adopt(ladder, keys, self.clock.monotonic())

    # -- publishing ------------------------------------------------------------

    def publish(self) -> None:
        """The snapshot every reader gets (/status, /metrics, status.json)."""
        records = self.table.records
        transient = {path: why for path, why in self.table.invalid.items()
                     if os.path.basename(path) not in records.bad}
        self.snapshot = snapshot(
            host=self.host, settings=self.settings, ranks=self.ranks.values(),
            counters=self.counters, scanned=(self.last_scan_wall, self.last_scan_mono),
            started=self.started, wired=(self.wired, self.baseline),
            # A directory full of junk must not make every scan write megabytes.
            invalid={**records.unusable(INVALID_LISTED), **transient},
            invalid_count=len(records.bad) + len(transient),
            launches=self.launches.get(), backlog=self.enforcer.backlog.state(),
            causes=self.responses.causes(),
            record_dir_full=self.room_full, stragglers=self.slow)
        try:
            journal.write_json_atomic(os.path.join(self.settings.state_dir, journal.STATUS),
                                      self.snapshot.to_json())
        except OSError as err:
            log.warning("cannot write status.json: %s", err)

    def healthy(self) -> bool:
        """The loop completed a scan recently, and that scan could see (used by /healthz
        and the systemd ping): a scan that cannot list or probe watches nothing."""
        return not self.scan_trouble and journal.scan_is_recent(
            self.last_scan_mono, self.settings.interval, self.clock.monotonic())

    # -- the loop ----------------------------------------------------------------

    def apply_settings(self, settings: Settings) -> None:
        """A reload (SIGHUP): the new settings for every part that reads them, between
        two scans (the scan's lock); a response under way goes on under the new ones.

        A switch from observe to enforce rearms every wait only observed: the scan
        that follows at once judges it afresh and ends it if it still hangs (a hang
        already reported must not wait for a restart). A lowered deadline needs no
        mark cleared: the wake below judges every wait by it at once."""
        with self.lock:
            if settings.mode == Mode.ENFORCE and self.settings.mode != Mode.ENFORCE:
                now = self.clock.monotonic()
                rearmed = [r for r in self.ranks.values() if r.acted_on is not None
                           and transition(r, Edge.REARMED, now)]
                if rearmed:
                    log.info("mode enforce: %s judged again now (only observed so far)",
                             _ranks_of_jobs(rearmed))
            self.live.settings = settings  # every part reads its view from it at use
        self.wake.set()

    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler or another thread)."""
        self.stop_event.set()
        self.wake.set()

    def run(self) -> None:
        from watchdog.net.notify import notify

        self.exits.start()
        self.replay()
        try:
            journal.publish_pointer(self.settings.dir, self.settings.state_dir,
                                    self.settings.listen)
        except OSError as err:
            log.warning("cannot publish %s in %s (status given that directory will not find "
                        "this daemon): %s", journal.POINTER, self.settings.dir, err)
        notify("READY=1")
        deadline = self.settings.deadline
        log.info("watching %s every %gs (mode %s, deadline %s, kill scope %s)",
                 self.settings.dir, self.settings.interval, self.settings.mode,
                 f"{deadline:g}s" if deadline else "auto", self.settings.kill_scope)
        while not self.stop_event.is_set():
            began = self.clock.monotonic()
            try:
                self.scan()
            except Exception:  # noqa: BLE001 - the watchdog must outlive any one scan
                self.counters.loop_errors += 1
                log.exception("scan failed; continuing")
            if self.healthy():
                notify("WATCHDOG=1")
            # Sleep out the interval, or less when a watched rank exits; a response
            # under way is stepped every tick meanwhile (its grace ends on time).
            while not self.stop_event.is_set():
                left = self.settings.interval - (self.clock.monotonic() - began)
                if left <= 0 or self.wake.wait(min(left, Enforcer.TICK) if self.pending
                                               else left):
                    break
                try:
                    self.step_responses()
                except Exception:  # noqa: BLE001 - as for a scan
                    self.counters.loop_errors += 1
                    log.exception("stepping a response failed; continuing")
            self.wake.clear()
        self.exits.stop()
        journal.remove_pointer(self.settings.dir)
        notify("STOPPING=1")
        with self.lock:
            self.learned.keep(self.detector, self.clock.wall(), force=True)
            # A fence answered 202 is begun; a response under way ends its ladder first
            # (what a stop cuts short, the next daemon completes from the journal).
            self._begin_fences()
            self.responses.finish(self.clock)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.asking.shutdown(wait=False, cancel_futures=True)
        self.probing.shutdown(wait=False, cancel_futures=True)
        self.sampling.shutdown(wait=False, cancel_futures=True)
        log.info("stopped")


def _ranks_of_jobs(ranks: list[Rank]) -> str:
    """`job a ranks 0, 1; job b rank 2`: ranks named as a person reads them."""
    jobs: dict[str, list[int]] = {}
    for r in ranks:
        jobs.setdefault(r.record.job, []).append(r.record.rank)
    return "; ".join(f"job {job} rank{'s' if len(nums) > 1 else ''} "
                     f"{', '.join(map(str, sorted(nums)))}" for job, nums in sorted(jobs.items()))
