"""The per-node loop: scan records, check identities, sample, judge, act, publish.

Each tick reads every record in the directory, samples the process behind
each one, asks the detector for a verdict, and hands a hung job to the
enforcer (on a worker thread, so the loop keeps scanning while the ladder
runs). The loop never dies: any error is logged, counted and the next tick
comes. What it knows is published as one immutable snapshot (a dict) for the
metrics endpoint, `/status` and `status.json`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from watchdog import __version__, record
from watchdog.daemon import journal, learning
from watchdog.daemon.config import Settings
from watchdog.daemon.detector import Detector, Verdict, hold_reason
from watchdog.daemon.enforcer import (
    GONE,
    KILLED,
    NOT_OURS,
    UNKILLABLE,
    UNKNOWN,
    Enforcer,
    Outcome,
    Signaller,
    Target,
)
from watchdog.daemon.probes import Probe, ProbeError, probe, same_process
from watchdog.daemon.probes.exits import ExitWatcher
from watchdog.daemon.recdir import RecordDir
from watchdog.daemon.view import rank_json
from watchdog.net import cluster, fence
from watchdog.record import Record, RecordError
from watchdog.states import State

log = logging.getLogger(__name__)

SCAN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FINAL = frozenset({State.KILLED, State.UNKILLABLE, State.EXITED})
INVALID_LISTED = 100  # unusable files named in /status; all are counted
JOB_KILLS_KEEP = 3600.0  # seconds a job's kill counter stays after its last rank
LEARNED_SAVE_EVERY = 10.0  # seconds between writes of what the auto deadline learned
HOLD_RECHECK = 5.0  # seconds before a job held by a computing peer node is asked about again


@dataclass
class Rank:
    path: str
    record: Record
    state: State = State.RUNNING
    verdict: Verdict | None = None
    reason: str = ""
    escalating: bool = False
    gone_at: float | None = None  # monotonic seconds when it reached a final state
    acted_on: tuple[int, int] | None = None  # the wait an incident was raised for
    # A peer node said another rank of the job computes: left alone until then
    # (monotonic seconds), when the cluster is asked again.
    held_until: float = 0.0
    held_reason: str = ""
    hold_note: str = ""  # the local hold last logged
    # Its identity was checked against the live process at least once. A record
    # whose pid was already gone at first sight proves nothing (anyone can
    # write one naming a dead pid and any job), so its "crash" fences no one.
    seen_alive: bool = False

    @property
    def key(self) -> tuple[int, float]:
        return (self.record.pid, self.record.start_time)

    def target(self) -> Target:
        rec = self.record
        stacks = self.path[: -len(record.SUFFIX)] + ".stacks"
        return Target(rec.pid, rec.start_time, rec.uid, rec.job, rec.rank, rec.dump_signal,
                      stacks, rec.start_ticks)


@dataclass
class Counters:
    stalls: dict[str, int] = field(default_factory=lambda: {"stalled": 0, "blocked": 0})
    kills: dict[str, int] = field(default_factory=lambda: {"SIGTERM": 0, "SIGKILL": 0})
    job_kills: dict[str, int] = field(default_factory=dict)
    invalid_records: int = 0
    probe_errors: int = 0
    loop_errors: int = 0
    scan_buckets: list[int] = field(default_factory=lambda: [0] * (len(SCAN_BUCKETS) + 1))
    scan_sum: float = 0.0
    scan_count: int = 0


class Daemon:
    def __init__(self, settings: Settings, probe_: Probe | None = None,
                 signaller: Signaller | None = None, *, clock_ns: Any = time.monotonic_ns,
                 wall: Any = time.time) -> None:
        self.settings = settings
        self.probe = probe_ or probe()
        self.signaller = signaller or Signaller(self.probe)
        self.enforcer = Enforcer(settings, self.signaller, self.probe, wall=wall)
        learned, self.learned_at = learning.load(settings.state_dir, wall())
        self.detector = Detector(settings.rules(), learned)
        self.learned_saved = 0.0
        self.clock_ns = clock_ns
        self.wall = wall
        self.host = socket.gethostname()
        self.ranks: dict[tuple[int, float], Rank] = {}
        self.records = RecordDir(settings.dir)
        # path -> why, for files found unusable this scan that may read fine later
        # (those unusable for good are kept by self.records)
        self.invalid: dict[str, str] = {}
        self.job_seen: dict[str, float] = {}  # job -> when a rank of it was last listed
        self._invalid_seen: set[tuple[str, int, int]] = set()
        self.counters = Counters()
        self.pending: dict[Future[Outcome], list[tuple[int, float]]] = {}
        self.pending_since: dict[Future[Outcome], float] = {}
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="escalate")
        self.wired: int | None = None
        self.baseline: int | None = None
        self.last_scan_wall = 0.0
        self.last_scan_mono = 0.0
        self.started = wall()
        # Before the first scan: enough for /metrics to show the start time.
        self.snapshot: dict[str, Any] = {"host": self.host, "version": __version__,
                                         "started": self.started, "time": None, "ranks": []}
        self.stop_event = threading.Event()
        # The scan and an incoming fence (HTTP thread) both touch the rank table.
        self.lock = threading.RLock()
        self.nonces = fence.NonceCache()
        self.wake = threading.Event()  # set by the exit watcher: scan now
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
        self.invalid = {}
        seen: set[tuple[int, float]] = set()
        # A job is its owner's uid with its id: job ids are world-readable and
        # anyone may publish a record naming one, so a hung rank only ever
        # brings down ranks of its own owner.
        due: dict[tuple[int, str], list[Rank]] = {}
        load = self.probe.load_per_cpu()
        watched = {r.path for r in self.ranks.values()}
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
                    rank.state, rank.gone_at = State.KILLED, now  # it went, late
                    rank.reason = "ended after being declared unkillable"
                continue
            try:
                sample = self.probe.sample(rec.pid)
            except ProbeError as err:
                self.counters.probe_errors += 1
                log.warning("probe failed for pid %s: %s", rec.pid, err)
                if rank is not None:
                    seen.add(key)
                continue
            if sample is None:
                seen.add(key)
                self._gone(rank or self._add(path, rec), now, status=rec.status)
                continue
            if not same_process(sample, rec.start_time, rec.uid, rec.start_ticks):
                why = (f"stale or forged: pid {rec.pid} is now another process "
                       "(start time or owner differ)")
                self.records.mark_bad(path, st, why)
                self._report_invalid(path, why, st)
                continue
            seen.add(key)
            rank = rank or self._add(path, rec)
            rank.record, rank.seen_alive = rec, True
            if rec.status != record.STATUS_OPEN and not rank.escalating:
                # A live process behind a closed record: the hook gave up on it
                # (an internal error) or the rank is on its way out. Its words
                # are frozen, so a frozen WAIT is no hang: reported, never judged.
                rank.state, rank.verdict = State.ABANDONED, None
                rank.reason = ("record abandoned by the hook after an internal error; not judged"
                               if rec.status == record.STATUS_ABANDONED
                               else "record closed while the process runs; not judged")
                continue
            verdict = self.detector.observe(rec, sample, now_ns, load)
            rank.verdict, rank.reason = verdict, verdict.reason
            if not rank.escalating:
                rank.state = verdict.state
            wait = (rec.wait_since_ns, rec.waits_completed)
            if verdict.act and not rank.escalating and rank.acted_on != wait:
                due.setdefault((rec.uid, rec.job), []).append(rank)
        due = self._hold(due)
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
        self.exits.watch({r.record.pid for r in self.ranks.values() if r.state not in FINAL})
        self._sample_wired()
        for (uid, job), ranks in due.items():
            self._escalate(uid, job, ranks)
        self._keep_learned()
        self._observe_scan(time.monotonic() - started)
        self.last_scan_wall, self.last_scan_mono = self.wall(), time.monotonic()
        self.publish()

    def _hold(self, due: dict[tuple[int, str], list[Rank]]) -> dict[tuple[int, str], list[Rank]]:
        """Leave alone the due ranks of a job that has a rank still computing."""
        kept: dict[tuple[int, str], list[Rank]] = {}
        now = self.clock_ns() / 1e9
        for (uid, job), ranks in due.items():
            for rank in ranks:
                rec = rank.record
                assert rank.verdict is not None
                if rank.held_until > now:  # a peer node said a rank of the job computes
                    rank.state, rank.reason = State.SUSPECT, rank.held_reason
                    continue
                # Only ranks of the same owner may speak for the job (a job is its owner's).
                mates = [(r.record.rank, r.verdict) for r in self.ranks.values()
                         if r.record.job == job and r.record.uid == rec.uid
                         and r.state not in FINAL and r.verdict is not None]
                why = hold_reason(rank.verdict, mates, self.detector.rules, rec.rank)
                if why:
                    if rank.hold_note != why:  # logged once per change, not every scan
                        rank.hold_note = why
                        log.info("job %s rank %s: %s; %s", job, rec.rank, rank.verdict.reason,
                                 why)
                    rank.state, rank.reason = State.SUSPECT, f"{rank.verdict.reason}; {why}"
                    continue
                rank.hold_note = ""
                rank.acted_on = (rec.wait_since_ns, rec.waits_completed)  # one incident per wait
                kept.setdefault((uid, job), []).append(rank)
        return kept

    def _keep_learned(self, force: bool = False) -> None:
        """Stamp the jobs whose auto deadline learned something; write now and then."""
        wall = self.wall()
        for job in self.detector.changed:
            self.learned_at[job] = wall
        if not self.detector.changed and not force:
            return
        if not force and time.monotonic() - self.learned_saved < LEARNED_SAVE_EVERY:
            return
        self.detector.changed = set()
        learning.prune(self.detector.learned, self.learned_at, wall)
        self.learned_saved = time.monotonic()
        try:
            learning.save(self.settings.state_dir, self.detector.learned, self.learned_at)
        except OSError as err:
            log.warning("cannot write %s: %s", learning.FILE, err)

    def _add(self, path: str, rec: Record) -> Rank:
        rank = Rank(path, rec)
        self.ranks[rank.key] = rank
        # Present from the job's first sight, so increase() sees its first kills.
        self.counters.job_kills.setdefault(rec.job, 0)
        log.info("watching pid %s: job %s rank %s/%s (%s)", rec.pid, rec.job, rec.rank,
                 rec.world_size, rec.backend or "?")
        return rank

    def _gone(self, rank: Rank, now: float, status: int) -> None:
        if rank.state in FINAL or rank.escalating:
            return
        rank.state, rank.gone_at = State.EXITED, now
        rank.reason = {record.STATUS_CLOSED: "exited",
                       record.STATUS_ERROR: "exited on an uncaught exception",
                       record.STATUS_ABANDONED: "exited (its record had been abandoned by the "
                       "hook: how it ended is unknown)"}.get(
            status, "exited without closing its record (crash or signal)")
        # An abandoned record says nothing of how the rank ended: no fence on it.
        crashed = status not in (record.STATUS_CLOSED, record.STATUS_ABANDONED)
        log.info("pid %s (job %s rank %s) %s", rank.record.pid, rank.record.job,
                 rank.record.rank, rank.reason)
        if crashed and rank.record.world_size > 1 and rank.seen_alive:
            self._fence_peers(rank.record.uid, rank.record.job,
                              f"rank {rank.record.rank} died without closing its record",
                              self._culprit_of(rank, "died"))

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
        try:
            rec = record.read_path(rank.path)
        except RecordError:
            return
        if (rec.pid, rec.start_time) == rank.key:
            for path in (rank.path, rank.path[: -len(record.SUFFIX)] + ".stacks"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as err:
                    log.warning("cannot remove %s: %s", path, err)

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

    def _culprit_of(self, rank: Rank, why: str) -> dict[str, Any]:
        return {"host": self.host, "rank": rank.record.rank, "pid": rank.record.pid,
                "state": rank.state.value, "reason": why}

    def _escalate(self, uid: int, job: str, due: list[Rank],
                  fenced: dict[str, Any] | None = None) -> None:
        local = [r for r in self.ranks.values()
                 if r.record.job == job and r.record.uid == uid and r.state not in FINAL
                 and not r.escalating]
        due = [r for r in due if r.record.uid == uid]
        targets = local if self.settings.kill_scope == "job" or fenced else due
        if not targets:
            return
        stopped = [r for r in local if r.state == State.STOPPED]
        worst = max(due, key=lambda r: r.verdict.seconds_in_wait if r.verdict else 0.0)
        if fenced is not None:
            verdict = "fenced"
        else:
            verdict = "stalled" if any(r.state == State.STALLED for r in due) else "blocked"
            self.counters.stalls[verdict] += 1
        incident: dict[str, Any] = {
            "id": time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.wall()))
            + "-" + uuid.uuid4().hex[:6],
            "time": self.wall(),
            "host": self.host,
            "job": job,
            "uid": uid,
            "verdict": verdict,
            "mode": self.settings.mode,
            "kill_scope": self.settings.kill_scope,
            "reason": (f"peer {fenced.get('origin')} fenced the job: {fenced.get('reason')}"
                       if fenced is not None else worst.reason),
            "ranks": [self._incident_rank(r) for r in targets],
            "pids": [r.record.pid for r in targets],
            "seconds_without_progress": max(
                (r.verdict.seconds_since_progress for r in due if r.verdict), default=0.0),
            "busiest_thread_cpu": max(
                (r.verdict.busiest_cpu for r in due if r.verdict), default=0.0),
            "flight_recorder_tail": {str(r.record.rank): [
                {"number": c.number, "op": c.op, "dtype": c.dtype, "bytes": c.nbytes}
                for c in r.record.flight[-8:]] for r in due},
            "culprit": (fenced.get("culprit") if fenced is not None else
                        self._culprit_of(stopped[0], "stopped (SIGSTOP or traced) while its "
                                         "peers wait") if stopped else None),
        }
        log.error("job %s: %s; %s %s ranks %s", job, worst.reason,
                  "ending" if self.settings.mode == "enforce" else "observing",
                  len(targets), sorted(r.record.rank for r in targets))
        for rank in targets:
            rank.escalating = True
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
        future = self.executor.submit(self._respond, uid, job, incident,
                                      [r.target() for r in targets], others_live,
                                      bool(self.settings.peers) and fenced is None, may_hold,
                                      fenced is None)
        self.pending[future] = keys
        self.pending_since[future] = self.clock_ns() / 1e9

    def _respond(self, uid: int, job: str, incident: dict[str, Any], targets: list[Target],
                 others_live: Any, ask_peers: bool, may_hold: bool,
                 evidence: bool) -> Outcome:
        """The escalation thread: with peers, first ask whether a rank of the job
        computes on another node (then hold: a slow peer is not a hang); else
        fence the peers at once and run the enforcer's response, with the
        cluster view in the incident."""
        view: dict[str, Any] | None = None
        if ask_peers:
            try:
                view = self.cluster_view(uid, job)
            except Exception as err:  # noqa: BLE001 - the kill must not wait on peers
                view = {"error": str(err)}
            busy = (view or {}).get("computing") or []
            if busy and may_hold:
                names = ", ".join(f"{b['rank']} on {b['host']}" for b in busy)
                return Outcome(incident, held=f"held: rank {names} of the job is computing "
                                              "(a slow peer, not a hang)")
        if evidence and self.settings.mode == "enforce":  # a verdict of ours, not a fence
            # The peers wait on this job's end: fence them now, not after evidence,
            # grace and wired-memory settling (30 s and more).
            self._fence_peers(uid, job, f"{incident['verdict']}: {incident['reason']}",
                              incident["culprit"])
        return self.enforcer.handle(incident, targets, self.baseline, others_live,
                                    cluster=(lambda: view) if ask_peers else None,
                                    evidence=evidence)

    # -- the cluster: views and fences -------------------------------------------

    def cluster_view(self, uid: int, job: str) -> dict[str, Any] | None:
        """This job of this owner across every node (peers asked within
        peer_timeout), or None."""
        nodes = cluster.gather(self.settings.peers, self.settings.peer_timeout)
        nodes.append({"peer": "local", "ok": True, "status": self.snapshot})
        for view in cluster.analyze(nodes)["jobs"]:
            if view["job"] == job and view.get("uid") == uid:
                computing = [{"rank": r.get("rank"), "host": r.get("host"), "pid": r.get("pid")}
                             for r in view["ranks"]
                             if r.get("node") != "local" and r.get("computing") is True
                             and r.get("state") not in ("stopped", "exited", "killed")]
                return {"culprit": view["culprit"], "evidence": view["evidence"],
                        "unreachable": [n["peer"] for n in nodes if not n["ok"]],
                        "computing": computing}
        return None

    def _fence_peers(self, uid: int, job: str, reason: str,
                     culprit: dict[str, Any] | None) -> None:
        """Tell the peers to end their ranks of `job` owned by `uid` (only with
        a shared secret)."""
        secret, peers = self.settings.secret, self.settings.peers
        if not secret or not peers:
            return
        log.info("fencing job %s of uid %s on %s: %s", job, uid, ", ".join(peers), reason)

        def sent(future: Future[list[dict[str, Any]]]) -> None:
            for answer in future.result():
                log.info("fence of job %s to %s: %s", job, answer["peer"],
                         answer.get("answer") if answer["ok"] else answer.get("error"))

        self.executor.submit(fence.send, peers, secret, job, self.host, reason, culprit,
                             self.settings.peer_timeout, uid).add_done_callback(sent)

    def fence_request(self, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        """An incoming `POST /fence`: authenticate, then end our ranks of that job."""
        if not self.settings.secret:
            return 403, {"error": "fences are off (no secret configured)"}
        try:
            request = fence.verify(self.settings.secret, headers, body, self.nonces,
                                   not_before=self.started)
        except fence.FenceRejected as err:
            log.warning("refused a fence: %s", err)
            return 401, {"error": str(err)}
        job, uid = request["job"], request["uid"]
        with self.lock:
            # Only the ranks of the job's owner: a fence names (uid, job).
            ranks = [r for r in self.ranks.values()
                     if r.record.job == job and r.record.uid == uid and r.state not in FINAL
                     and not r.escalating]
            log.warning("fence from %s: ending %s local ranks of job %s of uid %s (%s)",
                        request.get("origin"), len(ranks), job, uid, request.get("reason"))
            if ranks:
                self._escalate(uid, job, ranks, fenced=request)
        return 202, {"job": job, "uid": uid, "ending": sorted(r.record.pid for r in ranks)}

    def _incident_rank(self, rank: Rank) -> dict[str, Any]:
        v = rank.verdict
        return {"pid": rank.record.pid, "rank": rank.record.rank, "state": rank.state.value,
                "phase": rank.record.phase.label, "op": rank.record.op,
                "seconds_in_wait": round(v.seconds_in_wait, 3) if v else None,
                "busiest_thread_cpu": round(v.busiest_cpu, 3) if v else None,
                "progress": rank.record.waits_completed,
                "collectives": rank.record.collectives}

    def _retry(self, keys: list[tuple[int, float]]) -> None:
        """An escalation that failed did not end its wait: judge those ranks afresh."""
        for key in keys:
            rank = self.ranks.get(key)
            if rank is not None:
                rank.escalating, rank.acted_on = False, None

    def _escalation_bound(self) -> float:
        """Seconds an escalation may take before it is presumed stuck: every
        step's own bound, with room to spare."""
        s = self.settings
        return 2 * (s.peer_timeout + s.evidence_timeout + s.grace + s.kill_timeout
                    + s.settle) + 30.0

    def _collect_finished(self) -> None:
        now = self.clock_ns() / 1e9
        for future, started in list(self.pending_since.items()):
            if not future.done() and now - started > self._escalation_bound():
                # A thread stuck (a sampler that ignores its kill, a hung
                # filesystem) must not leave a hang unhandled: try again beside it.
                keys = self.pending.pop(future)
                del self.pending_since[future]
                log.error("an escalation has run for %.0fs; trying those ranks again",
                          now - started)
                self._retry(keys)
        for future in [f for f in self.pending if f.done()]:
            keys = self.pending.pop(future)
            self.pending_since.pop(future, None)
            try:
                outcome = future.result()
            except Exception:  # noqa: BLE001 - the loop goes on; the ranks are retried
                log.exception("escalation failed; the hung ranks will be tried again")
                self._retry(keys)
                continue
            if outcome.held:
                log.info("job %s: %s", outcome.incident.get("job"), outcome.held)
                self._retry(keys)
                for key in keys:
                    rank = self.ranks.get(key)
                    if rank is not None:
                        rank.held_until, rank.held_reason = now + HOLD_RECHECK, (
                            f"{rank.verdict.reason if rank.verdict else ''}; {outcome.held}")
                        rank.state, rank.reason = State.SUSPECT, rank.held_reason
                continue
            for name in outcome.signals_sent:
                if name in self.counters.kills:
                    self.counters.kills[name] += 1
            for key in keys:
                rank = self.ranks.get(key)
                if rank is None:
                    continue
                result = outcome.results.get(rank.record.pid)
                rank.escalating = False
                if result == KILLED:
                    rank.state, rank.gone_at = State.KILLED, now
                    rank.reason = f"ended by the watchdog (incident {outcome.incident['id']})"
                    self.counters.job_kills[rank.record.job] = (
                        self.counters.job_kills.get(rank.record.job, 0) + 1)
                    self._remove_record(rank)
                elif result == UNKILLABLE:
                    rank.state, rank.gone_at = State.UNKILLABLE, None
                    rank.reason = "survived SIGKILL; node flagged for reboot"
                elif result == UNKNOWN:
                    # Its identity could not be checked, so it was left alone:
                    # judged afresh next scan rather than given up for this wait.
                    rank.acted_on = None

    # -- publishing ------------------------------------------------------------

    def _observe_scan(self, seconds: float) -> None:
        c = self.counters
        c.scan_sum += seconds
        c.scan_count += 1
        for i, bound in enumerate(SCAN_BUCKETS):
            if seconds <= bound:
                c.scan_buckets[i] += 1
                break
        else:
            c.scan_buckets[-1] += 1

    def publish(self) -> None:
        ranks = [rank_json(r.record, r.state, r.verdict, reason=r.reason)
                 for r in sorted(self.ranks.values(),
                                 key=lambda r: (r.record.job, r.record.rank, r.record.pid))]
        c = self.counters
        flag = journal.reboot_flag(self.settings.state_dir)
        transient = {path: why for path, why in self.invalid.items()
                     if os.path.basename(path) not in self.records.bad}
        self.snapshot = {
            "host": self.host,
            "daemon_pid": os.getpid(),
            "version": __version__,
            "mode": self.settings.mode,
            "interval": self.settings.interval,
            "time": self.last_scan_wall or None,
            "scan_monotonic": self.last_scan_mono,
            "dir": os.path.abspath(self.settings.dir),
            "state_dir": os.path.abspath(self.settings.state_dir),
            "started": self.started,
            "wired_bytes": self.wired,
            "wired_baseline_bytes": self.baseline,
            "reboot_required": flag is not None,
            "reboot": flag,
            "ranks": ranks,
            # A directory full of junk must not make every scan write megabytes.
            "invalid_records": {**self.records.unusable(INVALID_LISTED), **transient},
            "invalid_files": len(self.records.bad) + len(transient),
            "counters": {
                "stalls": dict(c.stalls), "kills": dict(c.kills),
                "job_kills": dict(c.job_kills), "invalid_records": c.invalid_records,
                "probe_errors": c.probe_errors, "loop_errors": c.loop_errors,
                "scan_buckets": list(c.scan_buckets), "scan_sum": c.scan_sum,
                "scan_count": c.scan_count,
            },
            "scan_bucket_bounds": list(SCAN_BUCKETS),
        }
        try:
            journal.write_json_atomic(os.path.join(self.settings.state_dir, journal.STATUS),
                                      self.snapshot)
        except OSError as err:
            log.warning("cannot write status.json: %s", err)

    def healthy(self) -> bool:
        """The loop completed a scan recently (used by /healthz and the systemd ping)."""
        return journal.scan_is_recent(self.last_scan_mono, self.settings.interval,
                                      time.monotonic())

    # -- the loop ----------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler or another thread)."""
        self.stop_event.set()
        self.wake.set()

    def run(self) -> None:
        from watchdog.net.notify import notify

        self.exits.start()
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
            # Sleep out the interval, or less when a watched rank exits.
            self.wake.wait(max(0.0, self.settings.interval - (time.monotonic() - began)))
            self.wake.clear()
        self.exits.stop()
        journal.remove_pointer(self.settings.dir)
        notify("STOPPING=1")
        with self.lock:
            self._keep_learned(force=True)
        self.executor.shutdown(wait=False, cancel_futures=True)
        log.info("stopped")
