"""The per-node loop, and only its wiring: scan, judge, hold, act, publish.

Each tick the rank table (table.py) reads every record and sorts it; jobs.py judges
each job (the detector's verdicts, the wedge, the stacks sampled, the links probed,
the paces scored); holds.py holds the due ranks of a job whose peer computes;
the rest go to a response (act/responses.py), which the loop steps on its own
thread, at every tick and between ticks while one is under way, as it begins the
fences the HTTP thread queued (fences.py). What each response did comes back and
is applied to its ranks. The loop never dies: any error is logged, counted and the
next tick comes. What it knows is published as one immutable snapshot (a
`status.NodeStatus`) for the metrics endpoint, `/status` and `status.json`.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from watchdog import __version__
from watchdog.daemon import holds, outcomes, roomkeeper
from watchdog.daemon.act import told
from watchdog.daemon.act.enforcer import Enforcer
from watchdog.daemon.act.incidents import new_incident
from watchdog.daemon.act.peers import Peers
from watchdog.daemon.act.responses import Response, Responses
from watchdog.daemon.act.workers import FairWork
from watchdog.daemon.clock import Clock
from watchdog.daemon.config import KillScope, Live, Settings
from watchdog.daemon.counters import Counters
from watchdog.daemon.fences import Fences
from watchdog.daemon.jobs import Jobs
from watchdog.daemon.lifecycle import Edge, Key, Rank, rearm, transition
from watchdog.daemon.probes import Probe, probe
from watchdog.daemon.probes.exits import ExitWatcher
from watchdog.daemon.publish import INVALID_LISTED, snapshot, write_status
from watchdog.daemon.signaller import Signaller
from watchdog.daemon.store import journal, launchlog, learning, pending
from watchdog.daemon.table import RankTable
from watchdog.daemon.wired import Wired
from watchdog.net import health
from watchdog.net.notify import notify
from watchdog.states import FINAL, Mode
from watchdog.status import Fence, FenceAnswer, NodeStatus

log = logging.getLogger(__name__)

# Seconds a fence must hold its ranks frozen for this node to take their stacks first.
MIN_WINDOW = 0.5


class Daemon:
    """One node's watchdog: each scan reads the record directory, judges every live
    rank, starts and steps the responses, and publishes the snapshot every reader gets
    (status.json, /status, /metrics). Only wiring: the reading of the records is
    `table.py`, a scan's judgement of each job `jobs.py` (over `judge/` and `probes/`),
    the hold `holds.py`, the acting `act/`, the fences `fences.py`, the snapshot
    `publish.py`."""

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
        self.host = socket.gethostname()
        self.counters = Counters.zeroed()
        self.started = clock.wall()
        self.peers = Peers(self.live, self.host, self.asking, self.started,
                           clock=clock.monotonic, wall=clock.wall)
        # One scan's judgement of each job: the detector, the stack sampler, the link
        # prober and the stragglers, with what each rank shows beside its lifecycle.
        self.jobs = Jobs(self.live, self.probe, clock, self.host, self.learned.learned,
                         self.peers.recent, self.counters)
        self.table = RankTable(settings.dir, self.probe, self.signaller, self.counters,
                               self.jobs.forget)
        self.ranks = self.table.ranks  # the same dict, for every reader
        self.launches = launchlog.Counts(settings.state_dir)  # restarts, refusals, give-ups
        self.wired = Wired(self.probe, self.counters)
        self.last_scan_wall = 0.0
        self.last_scan_mono = 0.0
        # Why the last scan was blind ("" when it was not): it could not list the
        # directory or ran out of descriptors probing. Such a scan is no sign of health.
        self.scan_trouble = ""
        # Before the first scan: enough for /metrics to show the start time.
        self.snapshot = NodeStatus(host=self.host, version=__version__, started=self.started)
        self.health = health.Index()  # each job's health, rebuilt with every snapshot
        self.stop_event = threading.Event()
        # The scan and an incoming fence (HTTP thread) both touch the rank table.
        self.lock = threading.RLock()
        self.wake = threading.Event()  # set by the exit watcher or a fence: scan now
        self.fences = Fences(self.live, self.host, self.peers, self.table, self.lock, self.wake)
        self.responses = Responses(self.live, self.enforcer, self.peers,
                                   lambda: self.snapshot, lambda: self.wired.baseline,
                                   lambda: self.wired.held)
        self.exits = ExitWatcher(self.wake)
        # Room in the record directory for every user's next rank; why it is full
        # and nothing can free it ("" while there is room), published and alerted on.
        self.keeper = roomkeeper.Keeper(settings.dir, self.probe.deleted_holders,
                                        clock=clock.monotonic,
                                        unusable=self.table.records.known_bad)
        self.room_full = ""

    @property
    def settings(self) -> Settings:
        """The settings now (`live`'s: a reload replaces them there, `apply_settings`)."""
        return self.live.settings

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
        self.fences.deaths(now)
        due = self.jobs.judge(found.live, now_ns, since=self.last_scan_mono)
        due = holds.hold(due, self.ranks.values(), self.jobs.detector.rules, now)
        if self.jobs.probe_links(self.ranks.values(), now):
            self.peers.prefetch()  # a verdict may come: its peers' answers ready by then
        self.table.sweep(now)
        self.fences.deaths(now)
        self.table.expire(now, self.settings.retention)
        self.exits.watch(self.table.live_pids())  # pidfds shared out fairly between the users
        self.wired.sample(at_rest=not self.pending and all(r.state in FINAL
                                                           for r in self.ranks.values()))
        self.enforcer.backlog.flush()  # what a full or failing disk held back
        for (uid, job), ranks in due.items():
            self._escalate(uid, job, ranks)
        for ending, ranks in self.fences.orphaned(now):
            self._escalate(ending.uid, ending.job, ranks, fenced=ending.fence)
        self.jobs.paces.judge(found.live, now)  # shown only: after the responses began
        if self.jobs.paces.ask_peers_every is not None:  # a job judged with its peers' ranks
            self.peers.prefetch(self.jobs.paces.ask_peers_every)
        self.learned.keep(self.jobs.detector.auto, self.clock.wall())
        trouble = found.trouble
        if not self.table.records.listed:
            trouble.append(f"cannot list {self.settings.dir}")
        self.scan_trouble = "; ".join(sorted(set(trouble)))
        self.counters.observe_scan(self.clock.monotonic() - started)
        self.last_scan_wall, self.last_scan_mono = self.clock.wall(), self.clock.monotonic()
        self.publish()

    def _begin_fences(self) -> None:
        """The peers' fences queued by the HTTP thread: their responses begun here."""
        for ending, ranks in self.fences.queued():
            self._escalate(ending.uid, ending.job, ranks, fenced=ending.fence,
                           incident_id=ending.incident)
        for uid, job, term_in in self.fences.hurried():
            self.responses.hurry(uid, job, term_in)

    # -- acting ----------------------------------------------------------------

    def _escalate(self, uid: int, job: str, due: list[Rank],
                  fenced: Fence | None = None, incident_id: str = "") -> None:
        local = self.table.job(uid, job)
        due = [r for r in due if r.record.uid == uid]
        targets = _targets(local, due, fenced, self.settings.kill_scope)
        if not targets:
            return
        incident = new_incident(
            wall=self.clock.wall(), host=self.host, uid=uid, job=job,
            mode=self.settings.mode, kill_scope=self.settings.kill_scope, due=due,
            targets=targets, local=local, fenced=fenced, links=self.jobs.links_of(),
            incident_id=incident_id)
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
        others_live = _live_beside(dict(self.ranks), keys)  # the ranks beside it now
        may_hold = fenced is None and holds.may_hold(due, self.jobs.detector.rules)
        self.jobs.settle(keys)  # no rank of it still under our stack sampler's trace
        # A peer's fence holds its ranks frozen until the moment it names: their
        # evidence is taken meanwhile (a local death's, ended at once, has none; nor a
        # window too short for a dump: a rank resumed for it would only run on).
        term_in = None if fenced is None else self.fences.term_in(fenced)
        self.responses.start(keys, now, uid, job, incident,
                             [r.target() for r in targets], others_live,
                             ask_peers=ask_peers, may_hold=may_hold, evidence=fenced is None,
                             term_in=term_in,
                             gather=fenced is None or (term_in or 0.0) >= MIN_WINDOW)

    def fence_request(self, headers: object, body: bytes,
                      sender: str = "") -> tuple[int, FenceAnswer]:
        """An incoming `POST /fence` from `sender` (the HTTP thread): authenticated and
        queued; the loop's thread ends the ranks (fences.py)."""
        return self.fences.request(headers, body, sender)

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
                outcomes.retried(self.table, keys, now)
            elif outcome.held:
                log.info("job %s: %s", outcome.incident.job, outcome.held)
                outcomes.held(self.table, keys, outcome, now)
            else:
                outcomes.ended(self.table, self.counters, self.settings.mode, keys, outcome,
                               now)
        return bool(finished)

    def replay(self) -> None:
        """Complete, on the workers, every response an earlier daemon journaled and
        did not close (killed mid-ladder or mid-settle): its kill is recorded as
        one, its flag raised, and its ranks are not judged again meanwhile."""
        for entry in pending.unfinished(self.settings.state_dir):
            keys = [(t.pid, t.start_time) for t in entry.targets]
            self.table.replaying.update(keys)
            try:
                ladder = self.enforcer.resume(entry, _live_beside(self.ranks, keys))
            except Exception as err:  # noqa: BLE001 - a bad entry never stops a start
                self.table.replaying.difference_update(keys)
                pending.set_aside(pending.path_of(self.settings.state_dir, entry.incident.id),
                                  repr(err))
                continue
            self.responses.adopt(ladder, keys, self.clock.monotonic())

    # -- publishing ------------------------------------------------------------

    def publish(self) -> None:
        """The snapshot every reader gets (/status, /metrics, status.json)."""
        invalid, invalid_count = self.table.unusable(INVALID_LISTED)
        self.snapshot = snapshot(
            host=self.host, settings=self.settings, ranks=self.ranks.values(),
            counters=self.counters, scanned=(self.last_scan_wall, self.last_scan_mono),
            started=self.started, wired=(self.wired.now, self.wired.baseline),
            invalid=invalid, invalid_count=invalid_count,
            launches=self.launches.get(), backlog=self.enforcer.backlog.state(),
            causes=self.responses.causes(), shown=self.jobs.shown,
            record_dir_full=self.room_full, stragglers=self.jobs.paces.slow)
        # Each job's health for a load balancer (net/health.py): a rank a response has
        # (judging the peers' view, or ending it) is no healthy rank.
        ending = {key[0] for key in self.responses.causes()}
        self.health = health.Index.build(self.snapshot.ranks, ending)
        write_status(self.settings.state_dir, self.snapshot)

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
                rearmed = rearm(self.ranks.values(), self.clock.monotonic())
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
        self.exits.start()
        self.replay()
        _announce(self.settings)
        notify("READY=1")
        while not self.stop_event.is_set():
            began = self.clock.monotonic()
            try:
                self.scan()
            except Exception:  # noqa: BLE001 - the watchdog must outlive any one scan
                self.counters.loop_failed()
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
                    self.counters.loop_failed()
                    log.exception("stepping a response failed; continuing")
            self.wake.clear()
        self.exits.stop()
        journal.remove_pointer(self.settings.dir)
        notify("STOPPING=1")
        with self.lock:
            self.learned.keep(self.jobs.detector.auto, self.clock.wall(), force=True)
            # A fence answered 202 is begun; a response under way ends its ladder first
            # (what a stop cuts short, the next daemon completes from the journal).
            self._begin_fences()
            self.responses.finish(self.clock)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.asking.shutdown(wait=False, cancel_futures=True)
        self.jobs.shutdown()
        log.info("stopped")


def _targets(local: list[Rank], due: list[Rank], fenced: Fence | None,
             scope: KillScope) -> list[Rank]:
    """The ranks a response ends: a fence's own (a peer's: every live one of the job; a
    local death's: those alive with the dead rank), else the job's or the due ones."""
    named = {r.key for r in due}
    if fenced is not None:
        return [r for r in local if r.key in named]
    return local if scope == KillScope.JOB else due


def _live_beside(ranks: dict[Key, Rank], keys: list[Key]) -> Callable[[], bool]:
    """Whether any rank of `ranks` but those of `keys` is live, asked when a response
    settles (the node's wired memory is compared only with nothing else running)."""
    return lambda: any(r.state not in FINAL for k, r in ranks.items() if k not in keys)


def _announce(settings: Settings) -> None:
    """This daemon made known: its pointer in the record directory (for `status`, `watch`
    and `inspect` given that directory), and what it watches, in the log."""
    try:
        journal.publish_pointer(settings.dir, settings.state_dir, settings.listen)
    except OSError as err:
        log.warning("cannot publish %s in %s (status given that directory will not find "
                    "this daemon): %s", journal.POINTER, settings.dir, err)
    deadline = settings.deadline
    log.info("watching %s every %gs (mode %s, deadline %s, kill scope %s)",
             settings.dir, settings.interval, settings.mode,
             f"{deadline:g}s" if deadline else "auto", settings.kill_scope)


def _ranks_of_jobs(ranks: list[Rank]) -> str:
    """`job a ranks 0, 1; job b rank 2`: ranks named as a person reads them."""
    jobs: dict[str, list[int]] = {}
    for r in ranks:
        jobs.setdefault(r.record.job, []).append(r.record.rank)
    return "; ".join(f"job {job} rank{'s' if len(nums) > 1 else ''} "
                     f"{', '.join(map(str, sorted(nums)))}" for job, nums in sorted(jobs.items()))
