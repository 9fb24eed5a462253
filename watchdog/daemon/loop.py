"""The per-node loop: scan records, check identities, sample, judge, act, publish.

Each tick reads every record in the directory, samples the process behind
each one, asks the detector for a verdict, and hands a hung job to the
enforcer (on a worker thread, so the loop keeps scanning while the ladder
runs). The loop never dies: any error is logged, counted and the next tick
comes. What it knows is published as one immutable snapshot (a `status.NodeStatus`)
for the metrics endpoint, `/status` and `status.json`.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from watchdog import __version__, record
from watchdog.daemon import attempts, roomkeeper
from watchdog.daemon.act.enforcer import Enforcer, Outcome
from watchdog.daemon.act.incidents import death_culprit, new_incident
from watchdog.daemon.act.peers import Peers
from watchdog.daemon.act.responses import Response, Responses
from watchdog.daemon.act.workers import FairWork
from watchdog.daemon.config import Settings
from watchdog.daemon.holds import hold
from watchdog.daemon.judge.detector import Detector
from watchdog.daemon.observation import Seen, observe
from watchdog.daemon.probes import Probe, ProbeError, probe
from watchdog.daemon.probes.datalink import Prober
from watchdog.daemon.probes.exits import ExitWatcher
from watchdog.daemon.publish import INVALID_LISTED, Counters, snapshot
from watchdog.daemon.ranks import Edge, Rank, transition
from watchdog.daemon.recdir import RecordDir, remove_dead_record
from watchdog.daemon.signaller import GONE, KILLED, NOT_OURS, UNKILLABLE, UNKNOWN, Signaller
from watchdog.daemon.store import journal, launchlog, learning, pending
from watchdog.net import fence
from watchdog.record import Record
from watchdog.states import FINAL, WAITING_LONG, State
from watchdog.status import Culprit, Fence, NodeStatus, PeerView

log = logging.getLogger(__name__)

JOB_KILLS_KEEP = 3600.0  # seconds a job's kill counter stays after its last rank
HOLD_RECHECK = 5.0  # seconds before a job held by a computing peer node is asked about again
# A rank of a job died (crash, signal, uncaught exception): its local peers still alive
# this long after are ended too. A ring rank exits on its own within milliseconds of
# "connection to a peer was lost"; mlx_lm.server's rank 0 does not (only its generation
# thread dies: the server stays up, deaf), nor does a rank whose wait never noticed.
PEER_DEATH_GRACE = 5.0
Orphaned = tuple[float, str, Culprit, frozenset[tuple[int, float]]]
# Live ranks watched per owner uid: one user's thousands of records (each a real,
# sleeping process) cost probes every scan; they must not starve another user's.
MAX_RANKS_PER_UID = 256


class Daemon:
    def __init__(self, settings: Settings, probe_: Probe | None = None,
                 signaller: Signaller | None = None, *, clock_ns: Any = time.monotonic_ns,
                 wall: Any = time.time) -> None:
        self.settings = settings
        self.probe = probe_ or probe()
        self.signaller = signaller or Signaller(self.probe)
        # The responses' workers, each kind its own so none waits behind another:
        # evidence and its parse (one capture in flight per uid: workers.py), the
        # peers' views, and fences (what a peer's job waits on).
        self.executor = FairWork(4, "evidence")
        self.asking = ThreadPoolExecutor(max_workers=2, thread_name_prefix="peers")
        self.fencing = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fence")
        self.enforcer = Enforcer(settings, self.signaller, self.probe, wall=wall,
                                 executor=self.executor)
        self.learned = learning.Keeper(settings.state_dir, wall())
        self.detector = Detector(settings.rules(), self.learned.learned)
        self.clock_ns = clock_ns
        self.wall = wall
        self.host = socket.gethostname()
        self.ranks: dict[tuple[int, float], Rank] = {}
        self.records = RecordDir(settings.dir)
        # path -> why, for files found unusable this scan that may read fine later
        # (those unusable for good are kept by self.records)
        self.invalid: dict[str, str] = {}
        self.job_seen: dict[str, float] = {}  # job -> when a rank of it was last listed
        # (uid, job) -> (when its live local ranks are ended, why, the dead rank, those
        # ranks), for jobs one of whose ranks died (PEER_DEATH_GRACE).
        self.orphans: dict[tuple[int, str], Orphaned] = {}
        self._invalid_seen: set[tuple[str, int, int]] = set()
        self.counters = Counters.zeroed()
        self.launches = launchlog.Counts(settings.state_dir)  # restarts, refusals, give-ups
        self.wired: int | None = None
        self.baseline: int | None = None
        self.last_scan_wall = 0.0
        self.last_scan_mono = 0.0
        # Why the last scan was blind ("" when it was not): it could not list the
        # directory or ran out of descriptors probing. Such a scan is no sign of health.
        self.scan_trouble = ""
        self.started = wall()
        # Before the first scan: enough for /metrics to show the start time.
        self.snapshot = NodeStatus(host=self.host, version=__version__, started=self.started)
        self.stop_event = threading.Event()
        # The scan and an incoming fence (HTTP thread) both touch the rank table.
        self.lock = threading.RLock()
        self.peers = Peers(settings, self.host, self.asking, self.started,
                           fencing=self.fencing)
        # A rank waiting long: its data path to its peers probed (a cause's evidence),
        # on workers of its own: a probe never delays a capture, a view or a fence.
        self.probing = ThreadPoolExecutor(max_workers=2, thread_name_prefix="links")
        self.links = Prober(self.probing.submit, min(1.0, settings.peer_timeout))
        self.responses = Responses(
            settings, self.enforcer, self.peers, self.asking,
            lambda *fence: self._fence_peers(*fence),  # looked up late: tests watch it
            lambda: self.snapshot, lambda: self.baseline)
        self.wake = threading.Event()  # set by the exit watcher: scan now
        # Ranks of responses an earlier daemon left unfinished (pending.py): being
        # completed (not judged meanwhile), or ended by it before we saw them.
        self.replaying: set[tuple[int, float]] = set()
        self.ended_by_us: dict[tuple[int, float], str] = {}  # key -> incident id
        self.exits = ExitWatcher(self.wake)

    # -- one tick --------------------------------------------------------------

    def _report_invalid(self, path: str, why: str, st: os.stat_result | None) -> None:
        self.invalid[path] = why
        seen = (path, st.st_mtime_ns if st else 0, st.st_size if st else 0)
        if seen not in self._invalid_seen:
            if len(self._invalid_seen) > 4 * self.records.max_reads:
                self._invalid_seen.clear()  # bounded memory under a flood of junk
            self._invalid_seen.add(seen)
            self.counters.invalid_records += 1
            log.warning("skipping %r: %s", path, why)

    def scan(self) -> None:
        with self.lock:
            self._scan()

    def _scan(self) -> None:
        started = time.monotonic()
        now_ns = self.clock_ns()
        now = now_ns / 1e9
        self._collect_finished()
        roomkeeper.keep_room(self.settings.dir)  # one statvfs; room for every user's ranks
        self.invalid = {}
        seen: set[tuple[int, float]] = set()
        # A job is its owner's uid with its id: job ids are world-readable and
        # anyone may publish a record naming one, so a hung rank only ever
        # brings down ranks of its own owner.
        due: dict[tuple[int, str], list[Rank]] = {}
        load = self.probe.load_per_cpu()
        watched = {r.path for r in self.ranks.values()}
        trouble: list[str] = []
        per_uid: dict[int, int] = {}
        for r in self.ranks.values():
            if r.state not in FINAL:
                per_uid[r.record.uid] = per_uid.get(r.record.uid, 0) + 1
        for path, rec, why, st in self.records.read(watched):
            if rec is None:
                self._report_invalid(path, why, st)
                continue
            key = (rec.pid, rec.start_time)
            rank = self.ranks.get(key)
            if rank is not None and rank.path != path:
                # A process has one record: a second one naming it is a copy.
                why = f"a copy of the record of pid {rec.pid} in {rank.path}"
                self.records.mark_bad(path, st, why)
                self._report_invalid(path, why, st)
                continue
            if rank is not None and rank.state in FINAL:
                seen.add(key)
                if rank.state == State.UNKILLABLE and self.signaller.identify(
                        rank.target()) in (GONE, NOT_OURS):
                    transition(rank, Edge.WENT_LATE, now, "ended after being declared unkillable")
                continue
            look = observe(rec, self.probe)
            if look.seen is Seen.UNKNOWN:
                self.counters.probe_errors += 1
                log.warning("probe failed for pid %s: %s", rec.pid, look.error)
                cause = look.error.__cause__ if look.error is not None else None
                if getattr(cause, "errno", None) in (errno.EMFILE, errno.ENFILE):
                    trouble.append("out of file descriptors while probing")
                if rank is not None:
                    seen.add(key)
                continue
            if look.seen is Seen.GONE:
                seen.add(key)
                self._gone(rank or self._add(path, rec), now, status=rec.status)
                continue
            if look.seen is Seen.NOT_OURS:
                why = (f"stale or forged: pid {rec.pid} is now another process "
                       "(start time or owner differ)")
                self.records.mark_bad(path, st, why)
                self._report_invalid(path, why, st)
                continue
            if rank is None and per_uid.get(rec.uid, 0) >= MAX_RANKS_PER_UID:
                self._report_invalid(path, f"uid {rec.uid} already has {MAX_RANKS_PER_UID} "
                                     "ranks watched (the most per user)", st)
                continue
            seen.add(key)
            if rank is None:
                per_uid[rec.uid] = per_uid.get(rec.uid, 0) + 1
            rank = rank or self._add(path, rec)
            if rank.record.job != rec.job:  # the group formed: the launch's job is known now
                self.counters.job_kills.setdefault(rec.job, 0)
                log.info("pid %s: job %s, rank %s/%s (was job %s before its group formed)",
                         rec.pid, rec.job, rec.rank, rec.world_size, rank.record.job)
            rank.record, rank.seen_alive = rec, True
            if look.seen is Seen.CLOSED and not rank.escalating:
                # A live process behind a closed record: the hook gave up on it
                # (an internal error) or the rank is on its way out. Its words
                # are frozen, so a frozen WAIT is no hang: reported, never judged.
                transition(rank, Edge.ABANDONED, now,
                           "record abandoned by the hook after an internal error; not judged"
                           if rec.status == record.STATUS_ABANDONED
                           else "record closed while the process runs; not judged")
                continue
            sample = look.sample
            assert sample is not None  # LIVE and CLOSED come with their sample
            verdict = self.detector.observe(rec, sample, now_ns, load)
            rank.verdict, rank.reason = verdict, verdict.reason
            transition(rank, Edge.JUDGED, now, verdict=verdict)
            wait = (rec.wait_since_ns, rec.waits_completed)
            if verdict.act and not rank.escalating and rank.acted_on != wait:
                due.setdefault((rec.uid, rec.job), []).append(rank)
        due = hold(due, self.ranks.values(), self.detector.rules, now)
        long = [r for r in self.ranks.values() if r.state in WAITING_LONG]
        for r in long:
            self.links.ask(r.key, now, r.record.backend)
        self.links.forget(r.key for r in long)
        for r in self.ranks.values():
            r.data_link = self.links.found.get(r.key)
        if self.settings.peers and any(r.state in WAITING_LONG for r in self.ranks.values()):
            self.peers.prefetch()  # a verdict may come: its peers' answers ready by then
        for key, rank in self.ranks.items():
            if key in seen or rank.state in FINAL:
                continue
            if self.records.listed and not os.path.lexists(rank.path):
                self._gone(rank, now, status=record.STATUS_CLOSED)  # record removed: clean
                continue
            # Not read this scan (the listing failed, the record was busy or
            # unreadable for now): gone only when its process is.
            if self.signaller.identify(rank.target()) in (GONE, NOT_OURS):
                self._gone(rank, now, status=rank.record.status)
        self._expire(now)
        live: dict[int, list[int]] = {}
        for r in self.ranks.values():
            if r.state not in FINAL:
                live.setdefault(r.record.uid, []).append(r.record.pid)
        self.exits.watch(live)  # pidfds shared out fairly between the users
        self._sample_wired()
        self.enforcer.backlog.flush()  # what a full or failing disk held back
        for (uid, job), ranks in due.items():
            self._escalate(uid, job, ranks)
        self._end_orphans(now)
        self.learned.keep(self.detector, self.wall())
        if not self.records.listed:
            trouble.append(f"cannot list {self.settings.dir}")
        self.scan_trouble = "; ".join(sorted(set(trouble)))
        self.counters.observe_scan(time.monotonic() - started)
        self.last_scan_wall, self.last_scan_mono = self.wall(), time.monotonic()
        self.publish()

    def _add(self, path: str, rec: Record) -> Rank:
        rank = Rank(path, rec, attempt=attempts.attempt_of(rec.pid))
        self.ranks[rank.key] = rank
        if rank.key in self.replaying or rank.key in self.ended_by_us:
            # An earlier daemon's response has it: not judged again.
            transition(rank, Edge.ESCALATED, 0.0)
        # Present from the job's first sight, so increase() sees its first kills.
        self.counters.job_kills.setdefault(rec.job, 0)
        log.info("watching pid %s: job %s rank %s/%s (%s)", rec.pid, rec.job, rec.rank,
                 rec.world_size, rec.backend or "?")
        return rank

    def _gone(self, rank: Rank, now: float, status: int) -> None:
        incident = self.ended_by_us.pop(rank.key, None)
        if incident is not None:
            # Ended by an earlier daemon's response, completed at our start: a kill.
            transition(rank, Edge.KILLED, now, f"ended by the watchdog (incident {incident})")
            self._remove_record(rank)
            return
        if not transition(rank, Edge.EXITED, now, {
                record.STATUS_CLOSED: "exited",
                record.STATUS_ERROR: "exited on an uncaught exception",
                record.STATUS_ABANDONED: "exited (its record had been abandoned by the hook: "
                "how it ended is unknown)"}.get(
                status, "exited without closing its record (crash or signal)")):
            return
        # An abandoned record says nothing of how the rank ended: no fence on it.
        crashed = status not in (record.STATUS_CLOSED, record.STATUS_ABANDONED)
        log.info("pid %s (job %s rank %s) %s", rank.record.pid, rank.record.job,
                 rank.record.rank, rank.reason)
        if crashed and rank.record.world_size > 1 and rank.seen_alive:
            # The reason says what happened: an uncaught exception (often the
            # backend's own error on a lost peer) is not a death without a trace.
            how = ("exited on an uncaught exception" if status == record.STATUS_ERROR
                   else "died without closing its record")
            culprit = death_culprit(self.host, rank, how)
            self._fence_peers(rank.record.uid, rank.record.job,
                              f"rank {rank.record.rank} {how}", culprit)
            # Its peers are the ranks of the job alive now: a rank that starts later
            # (the job relaunched under the same name) is no peer of this one.
            peers = frozenset(r.key for r in self.ranks.values()
                              if r.record.job == rank.record.job
                              and r.record.uid == rank.record.uid and r.live)
            self.orphans.setdefault((rank.record.uid, rank.record.job), (
                now + PEER_DEATH_GRACE,
                f"rank {rank.record.rank} (pid {rank.record.pid}) {rank.reason}: the job "
                "cannot finish without it", culprit, peers))

    def _end_orphans(self, now: float) -> None:
        """End the local ranks still alive of a job one of whose ranks died (those that
        were alive when it died)."""
        for key, (due_at, reason, culprit, peers) in list(self.orphans.items()):
            if now < due_at:
                continue
            del self.orphans[key]
            uid, job = key
            alive = [r for r in self.ranks.values()
                     if r.key in peers and r.state not in FINAL and not r.escalating]
            if alive:
                self._escalate(uid, job, alive, fenced=Fence(
                    job=job, uid=uid, origin=self.host, reason=reason, culprit=culprit,
                    local=True))

    def _expire(self, now: float) -> None:
        """Forget ranks that have been final for `retention`; remove their records."""
        for key, rank in list(self.ranks.items()):
            if rank.gone_at is None or now - rank.gone_at < self.settings.retention:
                continue
            del self.ranks[key]
            self.detector.forget(key)
            self._remove_record(rank)
        for rank in self.ranks.values():
            self.job_seen[rank.record.job] = now
        # A job's kill counter outlives its ranks by an hour (the repeated-kills
        # alert looks back that far), then goes: the series stay bounded.
        # A job never killed has nothing to count once its ranks are forgotten.
        kills = self.counters.job_kills
        for job, seen in list(self.job_seen.items()):
            if now - seen > JOB_KILLS_KEEP or (seen < now and not kills.get(job)):
                del self.job_seen[job]
                kills.pop(job, None)

    def _remove_record(self, rank: Rank) -> None:
        """Delete a dead rank's leftover record, if the file is still that rank's
        and the process is known to be gone (never a live rank's files)."""
        if self.signaller.identify(rank.target()) not in (GONE, NOT_OURS):
            return
        remove_dead_record(rank.path, rank.key)

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
        local = [r for r in self.ranks.values()
                 if r.record.job == job and r.record.uid == uid and r.state not in FINAL
                 and not r.escalating]
        due = [r for r in due if r.record.uid == uid]
        # A fence names its ranks (a peer's: every live one of the job; a local death's:
        # those alive with the dead rank), the verdict the job's or the due ones.
        named = {r.key for r in due}
        targets = ([r for r in local if r.key in named] if fenced is not None else
                   local if self.settings.kill_scope == "job" else due)
        if not targets:
            return
        incident = new_incident(
            wall=self.wall(), host=self.host, uid=uid, job=job, mode=self.settings.mode,
            kill_scope=self.settings.kill_scope, due=due, targets=targets, local=local,
            fenced=fenced)
        ask_peers = bool(self.settings.peers) and fenced is None
        if not ask_peers:  # else the response logs it, once it knows it will not hold
            log.error("job %s: %s; %s %s ranks %s; cause %s: %s", job, incident.reason,
                      "ending" if self.settings.mode == "enforce" else "observing",
                      len(targets), sorted(r.record.rank for r in targets),
                      incident.cause, incident.summary)
        now = self.clock_ns() / 1e9
        acted = set() if fenced else {r.key for r in due}  # a fence is no verdict on a wait
        for rank in targets:
            if ask_peers and rank.held_reason and now - rank.held_until < HOLD_RECHECK:
                # Held by a computing peer before: it stays shown held while the
                # peers are asked again, instead of flipping to the verdict's state.
                transition(rank, Edge.HELD, now, rank.held_reason)
            rec = rank.record
            transition(rank, Edge.ESCALATED, now, wait=(rec.wait_since_ns, rec.waits_completed)
                       if rank.key in acted else None)
            rank.cause = incident.cause
        keys = [r.key for r in targets]
        others = [r for r in self.ranks.values() if r.key not in keys]

        def others_live() -> bool:
            return any(r.state not in FINAL for r in others)

        rules = self.detector.rules
        # A peer computing excuses the wait up to the blocked deadline (detector.hold_reason).
        may_hold = fenced is None and all(
            r.verdict is not None
            and r.verdict.seconds_in_wait < max(r.verdict.deadline, rules.blocked_deadline)
            for r in due)
        self.responses.start(keys, now, uid, job, incident,
                             [r.target() for r in targets], others_live,
                             ask_peers=ask_peers, may_hold=may_hold, evidence=fenced is None)

    # -- the cluster: views and fences -------------------------------------------

    def cluster_view(self, uid: int, job: str) -> PeerView | None:
        return self.peers.view(uid, job, self.snapshot)

    def _fence_peers(self, uid: int, job: str, reason: str,
                     culprit: Culprit | None) -> None:
        self.peers.fence(uid, job, reason, culprit)

    def fence_request(self, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        """An incoming `POST /fence`: authenticate, then end our ranks of that job."""
        if not self.settings.secret:
            return 403, {"error": "fences are off (no secret configured)"}
        try:
            request = self.peers.verify(headers, body)
        except fence.FenceRejected as err:
            log.warning("refused a fence: %s", err)
            return 401, {"error": str(err)}
        job, uid = request.job, request.uid
        with self.lock:
            # Only the ranks of the job's owner (a fence names (uid, job)) that started
            # before the job was found dead: a later one is the job relaunched.
            named = [r for r in self.ranks.values()
                     if r.record.job == job and r.record.uid == uid and r.state not in FINAL
                     and not r.escalating]
            ranks = [r for r in named if request.ends(r.record.start_time)]
            if len(ranks) < len(named):
                log.warning("fence from %s: %s ranks of job %s started after it was found "
                            "dead (a relaunch): left alone", request.origin,
                            len(named) - len(ranks), job)
            log.warning("fence from %s: ending %s local ranks of job %s of uid %s (%s)",
                        request.origin, len(ranks), job, uid, request.reason)
            if ranks:
                self._escalate(uid, job, ranks, fenced=request)
                self.wake.set()  # the loop, maybe asleep for its interval, steps it
        return 202, {"job": job, "uid": uid, "ending": sorted(r.record.pid for r in ranks)}

    def _retry(self, keys: list[tuple[int, float]]) -> None:
        """An escalation that failed did not end its wait: judge those ranks afresh."""
        self.replaying.difference_update(keys)
        for key in keys:
            rank = self.ranks.get(key)
            if rank is not None:
                transition(rank, Edge.RETRIED, self.clock_ns() / 1e9)

    @property
    def pending(self) -> list[Response]:
        """Responses under way, each with the ranks it ends."""
        return self.responses.pending

    def _escalation_bound(self) -> float:
        return self.responses.bound()

    def step_responses(self) -> None:
        """Between scans: the responses' steps that are due (a grace, a SIGKILL)."""
        with self.lock:
            self._collect_finished()

    def _collect_finished(self) -> None:
        """Every response's due steps; what each finished one did, applied to its ranks."""
        now = self.clock_ns() / 1e9
        for keys, outcome in self.responses.step(now):
            if outcome is None:
                self._retry(keys)
            elif outcome.held:
                self._hold_for_peers(keys, outcome, now)
            else:
                self._ended(keys, outcome, now)

    def _hold_for_peers(self, keys: list[tuple[int, float]], outcome: Outcome,
                        now: float) -> None:
        """A rank of the job computes on another node: leave these alone a while."""
        log.info("job %s: %s", outcome.incident.job, outcome.held)
        self.replaying.difference_update(keys)
        for key in keys:
            rank = self.ranks.get(key)
            if rank is not None:
                transition(rank, Edge.PEER_HELD, now,
                           f"{rank.verdict.reason if rank.verdict else ''}; {outcome.held}",
                           until=now + HOLD_RECHECK)

    def _ended(self, keys: list[tuple[int, float]], outcome: Outcome, now: float) -> None:
        # A hang acted on (not a fence, not a hold: a hold re-asked every 5 s is no
        # new stall) counts once its response is done.
        verdict = outcome.incident.verdict
        if verdict in self.counters.stalls:
            self.counters.stall(verdict, outcome.incident.cause)
        for name in outcome.signals_sent:
            if name in self.counters.kills:
                self.counters.kills[name] += 1
        self.replaying.difference_update(keys)
        for key in keys:
            rank = self.ranks.get(key)
            if rank is None:
                if outcome.results.get(key[0]) == KILLED:  # a replay's, not yet seen
                    self.ended_by_us[key] = outcome.incident.id
                continue
            result = outcome.results.get(rank.record.pid)
            rank.cause = outcome.incident.cause or rank.cause
            if result == KILLED:
                transition(rank, Edge.KILLED, now,
                           f"ended by the watchdog (incident {outcome.incident.id})")
                self.counters.job_kills[rank.record.job] = (
                    self.counters.job_kills.get(rank.record.job, 0) + 1)
                self._remove_record(rank)
            elif result == UNKILLABLE:
                transition(rank, Edge.UNKILLABLE, now, "survived SIGKILL; node flagged for reboot")
            elif result == UNKNOWN:
                # Its identity could not be checked, so it was left alone:
                # judged afresh next scan rather than given up for this wait.
                transition(rank, Edge.RETRIED, now)
            else:  # observed, or not ended by us (gone, not ours, denied, its own exit)
                transition(rank, Edge.RELEASED, now)

    def replay(self) -> None:
        """Complete, on the workers, every response an earlier daemon journaled and
        did not close (killed mid-ladder or mid-settle): its kill is recorded as
        one, its flag raised, and its ranks are not judged again meanwhile."""
        for entry in pending.unfinished(self.settings.state_dir):
            keys = [(t.pid, t.start_time) for t in entry.targets]
            self.replaying.update(keys)

            def others_live(keys: list[tuple[int, float]] = keys) -> bool:
                return any(r.state not in FINAL for k, r in self.ranks.items() if k not in keys)

            try:
                ladder = self.enforcer.resume(entry, others_live)
            except Exception as err:  # noqa: BLE001 - a bad entry never stops a start
                self.replaying.difference_update(keys)
                pending.set_aside(pending.path_of(self.settings.state_dir, entry.incident.id),
                                  repr(err))
                continue
            self.responses.adopt(ladder, keys, self.clock_ns() / 1e9)

    # -- publishing ------------------------------------------------------------

    def publish(self) -> None:
        """The snapshot every reader gets (/status, /metrics, status.json)."""
        transient = {path: why for path, why in self.invalid.items()
                     if os.path.basename(path) not in self.records.bad}
        for response in self.responses.pending:  # the cause as the peers refined it
            acting = response.ladder.incident if response.ladder else response.incident
            for key in response.keys:
                if key in self.ranks:
                    self.ranks[key].cause = acting.cause
        self.snapshot = snapshot(
            host=self.host, settings=self.settings, ranks=self.ranks.values(),
            counters=self.counters, scanned=(self.last_scan_wall, self.last_scan_mono),
            started=self.started, wired=(self.wired, self.baseline),
            # A directory full of junk must not make every scan write megabytes.
            invalid={**self.records.unusable(INVALID_LISTED), **transient},
            invalid_count=len(self.records.bad) + len(transient),
            launches=self.launches.get(), backlog=self.enforcer.backlog.state())
        try:
            journal.write_json_atomic(os.path.join(self.settings.state_dir, journal.STATUS),
                                      self.snapshot.to_json())
        except OSError as err:
            log.warning("cannot write status.json: %s", err)

    def healthy(self) -> bool:
        """The loop completed a scan recently, and that scan could see (used by /healthz
        and the systemd ping): a scan that cannot list or probe watches nothing."""
        return not self.scan_trouble and journal.scan_is_recent(
            self.last_scan_mono, self.settings.interval, time.monotonic())

    # -- the loop ----------------------------------------------------------------

    def apply_settings(self, settings: Settings) -> None:
        """A reload (SIGHUP): the new settings for every part that reads them, between
        two scans (the scan's lock); a response under way goes on under the new ones."""
        with self.lock:
            self.settings = settings
            self.enforcer.settings = self.peers.settings = self.responses.settings = settings
            self.detector.rules = settings.rules()
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
        log.info("watching %s every %gs (mode %s, deadline %s, kill scope %s)",
                 self.settings.dir, self.settings.interval, self.settings.mode,
                 self.settings.deadline or "auto", self.settings.kill_scope)
        while not self.stop_event.is_set():
            began = time.monotonic()
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
                left = self.settings.interval - (time.monotonic() - began)
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
            self.learned.keep(self.detector, self.wall(), force=True)
            # A response under way ends its ladder first (what a stop cuts short, the
            # next daemon completes from the journal).
            self.responses.finish(lambda: self.clock_ns() / 1e9)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.asking.shutdown(wait=False, cancel_futures=True)
        self.probing.shutdown(wait=False, cancel_futures=True)
        self.fencing.shutdown(wait=False)  # a fence under way still reaches its peers
        log.info("stopped")
