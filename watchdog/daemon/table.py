"""The rank table: every rank the daemon watches, and one scan's sorting of the records.

Each record the directory gives is one of: junk (reported), a copy of another rank's
record, a rank already final, one whose probe failed (nothing concluded), one gone
(it exited), not ours (a stale or forged record: its pid is another process now), one
over its owner's cap (MAX_RANKS_PER_UID live ranks, and as many ended ones kept: a
record of a pid never seen alive counts), one whose record is closed or abandoned
while it runs (reported, never judged), or live: handed back with its sample, to be
judged. A rank not read this scan is gone only when its record or its process is.
The table also forgets ranks final for `retention`, removes dead ranks' records, and
keeps the deaths that must take their job down (fences.py) until the loop takes them.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from watchdog import record
from watchdog.daemon import attempts
from watchdog.daemon.counters import Counters
from watchdog.daemon.lifecycle import Edge, Key, Rank, transition
from watchdog.daemon.observation import Presence, observe
from watchdog.daemon.probes import Probe, ProcessSample
from watchdog.daemon.recdir import RecordDir, remove_dead_record
from watchdog.daemon.signaller import Result, Signaller
from watchdog.record import Record
from watchdog.states import FINAL, State
from watchdog.status import job_key

log = logging.getLogger(__name__)


JOB_KILLS_KEEP = 3600.0  # seconds a job's kill counter stays after its last rank
# Live ranks watched per owner uid: one user's thousands of records (each a real,
# sleeping process) cost probes every scan; they must not starve another user's.
MAX_RANKS_PER_UID = 256


@dataclass(frozen=True)
class Death:
    """A rank of a multi-rank job died (a crash, a signal, an uncaught exception):
    how, and its job's local ranks alive when it did (its peers)."""

    rank: Rank
    how: str
    peers: frozenset[Key]


@dataclass
class Found:
    """One scan's reading: the live ranks to judge, with their samples, and why the
    scan was blind in part (out of descriptors)."""

    live: list[tuple[Rank, ProcessSample]] = field(default_factory=list)
    trouble: list[str] = field(default_factory=list)


def clash_words(pids: list[int], rank: object, job: object, world_size: object) -> str:
    """Live processes that all claim one rank of one job: what it means, and the fix
    (the daemon's warning, and `status`'s under its table)."""
    return (f"pids {', '.join(str(p) for p in pids)} all claim rank {rank} of job {job} "
            f"(world size {world_size}): they are not one group. An mpirun whose MLX found "
            "no MPI library runs each process alone as rank 0 of 1 (name it with "
            "MLX_MPI_LIBNAME: README, \"Instrumenting a job\"); or two launches share one "
            "MLX_WATCHDOG_JOB")


class RankTable:
    """The watched ranks by identity: a scan's sorting of the record directory into
    ranks new, live, ended and refused (per-user caps), and what is kept of the ended."""

    def __init__(self, directory: str, probe: Probe, signaller: Signaller,
                 counters: Counters, forget: Callable[[Key], None]) -> None:
        self.probe, self.signaller, self.counters, self.forget = (
            probe, signaller, counters, forget)
        self.ranks: dict[Key, Rank] = {}
        self.records = RecordDir(directory)
        # path -> why, for files found unusable this scan that may read fine later
        # (those unusable for good are kept by self.records)
        self.invalid: dict[str, str] = {}
        self._invalid_seen: set[tuple[str, int, int]] = set()
        self.job_seen: dict[str, float] = {}  # job_key -> when a rank of it was last listed
        # Ranks of responses an earlier daemon left unfinished (pending.py): being
        # completed (not judged meanwhile), or ended by it before we saw them.
        self.replaying: set[Key] = set()
        self.ended_by_us: dict[Key, str] = {}  # key -> incident id
        self.deaths: list[Death] = []  # taken by the loop (fences.py)
        self._seen: set[Key] = set()
        self._clashes: set[tuple[int, str, int]] = set()  # slots claimed twice, warned

    # -- the ranks ---------------------------------------------------------------

    def live(self) -> Iterator[Rank]:
        """The ranks not in a final state."""
        return (r for r in self.ranks.values() if r.state not in FINAL)

    def job(self, uid: int, job: str) -> list[Rank]:
        """The job's local ranks a response may take: live, not taken by one already.
        A job is its owner's uid with its id (job ids are world-readable)."""
        return [r for r in self.ranks.values()
                if r.record.job == job and r.record.uid == uid and r.state not in FINAL
                and not r.escalating]

    def live_pids(self) -> dict[int, list[int]]:
        """uid -> the pids of its live ranks (the exit watcher's, shared out by uid)."""
        live: dict[int, list[int]] = {}
        for r in self.live():
            live.setdefault(r.record.uid, []).append(r.record.pid)
        return live

    def take_deaths(self) -> list[Death]:
        """The deaths seen since the last call, handed over once."""
        deaths, self.deaths = self.deaths, []
        return deaths

    # -- one scan ----------------------------------------------------------------

    def read(self, now: float) -> Found:
        """Every record read this scan, sorted; the live ones back with their sample."""
        self.invalid = {}
        self._seen = set()
        found = Found()
        # An ended rank's file is not read again (while it holds the file last read):
        # its owner's 256 ended ranks kept cost a scan nothing. One declared unkillable
        # is looked at each scan, for the moment it goes after all.
        watched = {r.path for r in self.ranks.values()
                   if r.state not in FINAL or r.state == State.UNKILLABLE}
        settled = {r.path for r in self.ranks.values() if r.path not in watched}
        per_uid: dict[int, int] = {}
        for r in self.live():
            per_uid[r.record.uid] = per_uid.get(r.record.uid, 0) + 1
        for r in self.ranks.values():  # the ended ones kept: their own cap, per owner
            if r.gone_at is not None:
                per_uid[-1 - r.record.uid] = per_uid.get(-1 - r.record.uid, 0) + 1
        for path, rec, why, st in self.records.read(watched, settled=settled):
            if rec is None:
                self.report_invalid(path, why, st)
                continue
            rank = self.ranks.get((rec.pid, rec.start_time))
            if rank is not None and rank.path != path:
                self._copy(path, rec, rank, st)
            elif rank is not None and rank.state in FINAL:
                self._final(rank, now)
            else:
                self._look(path, rec, rank, st, per_uid, now, found)
        self._check_slots()
        return found

    def _check_slots(self) -> None:
        """Warn once when two live processes claim one rank of one job: they are not
        one group. Under `mpirun`, ranks whose MLX found no MPI library each run alone,
        rank 0 of 1, under the one job id mpirun gives them. Both are still watched."""
        claims: dict[tuple[int, str, int], list[Rank]] = {}
        for r in self.live():
            if r.record.rank >= 0 and not r.escalating:
                claims.setdefault((r.record.uid, r.record.job, r.record.rank), []).append(r)
        clashes = {slot for slot, ranks in claims.items() if len(ranks) > 1}
        for slot in sorted(clashes - self._clashes):
            ranks = sorted(claims[slot], key=lambda r: r.record.pid)
            log.warning("%s", clash_words([r.record.pid for r in ranks], slot[2], slot[1],
                                          ranks[0].record.world_size))
        self._clashes = clashes

    def _copy(self, path: str, rec: Record, rank: Rank, st: os.stat_result | None) -> None:
        """A process has one record: a second one naming it is a copy."""
        why = f"a copy of the record of pid {rec.pid} in {rank.path}"
        self.records.mark_bad(path, st, why, by_file=False)  # the name is the fault
        self.report_invalid(path, why, st)

    def _final(self, rank: Rank, now: float) -> None:
        self._seen.add(rank.key)
        if rank.state == State.UNKILLABLE and self.signaller.identify(
                rank.target()) in (Result.GONE, Result.NOT_OURS):
            transition(rank, Edge.WENT_LATE, now, "ended after being declared unkillable")

    def _look(self, path: str, rec: Record, rank: Rank | None, st: os.stat_result | None,
              per_uid: dict[int, int], now: float, found: Found) -> None:
        key = (rec.pid, rec.start_time)
        if rank is None and per_uid.get(rec.uid, 0) >= MAX_RANKS_PER_UID:
            # Over its owner's cap: refused before its process is probed (a probe reads
            # every thread), so an owner's records past the cap cost a scan no probe.
            self.report_invalid(path, f"uid {rec.uid} already has {MAX_RANKS_PER_UID} "
                                "ranks watched (the most per user)", st)
            return
        look = observe(rec, self.probe, glance=rank is None)
        if look.seen is Presence.UNKNOWN:
            self.counters.probe_errors += 1
            log.warning("probe failed for pid %s: %s", rec.pid, look.error)
            cause = look.error.__cause__ if look.error is not None else None
            if getattr(cause, "errno", None) in (errno.EMFILE, errno.ENFILE):
                found.trouble.append("out of file descriptors while probing")
            if rank is not None:
                self._seen.add(key)
            return
        if look.seen is Presence.GONE:
            if rank is None:
                # A record of a process never seen alive: any user can write thousands
                # naming dead pids, each a rank "exited", its series and its reads at
                # every scan; they count against their owner's cap of final ranks.
                final = -1 - rec.uid  # per_uid's key of the owner's final ranks
                if per_uid.get(final, 0) >= MAX_RANKS_PER_UID:
                    why = (f"uid {rec.uid} already has {MAX_RANKS_PER_UID} ended ranks kept "
                           "(the most per user): a record of a pid not running")
                    self.records.mark_bad(path, st, why)
                    self.report_invalid(path, why, st)
                    return
                per_uid[final] = per_uid.get(final, 0) + 1
            self._seen.add(key)
            self.gone(rank or self._add(path, rec), now, status=rec.status)
            return
        if look.seen is Presence.NOT_OURS:
            why = (f"pid {rec.pid} is a thread of process {look.thread_of}: a record names "
                   "a process" if look.thread_of else
                   f"stale or forged: pid {rec.pid} is now another process "
                   "(start time or owner differ)")
            self.records.mark_bad(path, st, why)
            self.report_invalid(path, why, st)
            return
        self._seen.add(key)
        if rank is None:
            per_uid[rec.uid] = per_uid.get(rec.uid, 0) + 1
        rank = rank or self._add(path, rec)
        if rank.record.job != rec.job:  # the group formed: the launch's job is known now
            self.counters.job_kills.setdefault(job_key(rec.uid, rec.job), 0)
            log.info("pid %s: job %s, rank %s/%s (was job %s before its group formed)",
                     rec.pid, rec.job, rec.rank, rec.world_size, rank.record.job)
        rank.record, rank.seen_alive = rec, True
        if look.seen is Presence.CLOSED and not rank.escalating:
            # A live process behind a closed record: the hook gave up on it
            # (an internal error) or the rank is on its way out. Its words are
            # frozen, so a frozen WAIT is no hang: reported, never judged.
            transition(rank, Edge.ABANDONED, now,
                       "record abandoned by the hook after an internal error; not judged"
                       if rec.status == record.STATUS_ABANDONED
                       else "record closed while the process runs; not judged")
            return
        assert look.sample is not None  # LIVE and CLOSED come with their sample
        found.live.append((rank, look.sample))

    def sweep(self, now: float) -> None:
        """The ranks not read this scan: gone when their record was removed (a clean
        exit) or their process is (the listing failed, the record was busy)."""
        for key, rank in self.ranks.items():
            if key in self._seen or rank.state in FINAL:
                continue
            if self.records.listed and not os.path.lexists(rank.path):
                self.gone(rank, now, status=record.STATUS_CLOSED)  # record removed: clean
                continue
            if self.signaller.identify(rank.target()) in (Result.GONE, Result.NOT_OURS):
                self.gone(rank, now, status=rank.record.status)

    def unusable(self, limit: int) -> tuple[dict[str, str], int]:
        """The unusable files to name (at most `limit` of those unusable for good, so a
        directory full of junk does not make every scan write megabytes, and every one
        unusable this scan only) and how many there are in all."""
        bad = self.records.bad
        transient = {path: why for path, why in self.invalid.items()
                     if os.path.basename(path) not in bad}
        return {**self.records.unusable(limit), **transient}, len(bad) + len(transient)

    def report_invalid(self, path: str, why: str, st: os.stat_result | None) -> None:
        """Note an unusable record: shown in the snapshot, counted and logged once per file."""
        self.invalid[path] = why
        seen = (path, st.st_mtime_ns if st else 0, st.st_size if st else 0)
        if seen not in self._invalid_seen:
            if len(self._invalid_seen) > 4 * self.records.max_reads:
                self._invalid_seen.clear()  # bounded memory under a flood of junk
            self._invalid_seen.add(seen)
            self.counters.invalid_records += 1
            log.warning("skipping %r: %s", path, why)

    def _add(self, path: str, rec: Record) -> Rank:
        rank = Rank(path, rec, attempt=attempts.attempt_of(rec.pid))
        self.ranks[rank.key] = rank
        if rank.key in self.replaying or rank.key in self.ended_by_us:
            # An earlier daemon's response has it: not judged again.
            transition(rank, Edge.ESCALATED, 0.0)
        # Present from the job's first sight, so increase() sees its first kills.
        self.counters.job_kills.setdefault(job_key(rec.uid, rec.job), 0)
        log.info("watching pid %s: job %s %s (%s)", rec.pid, rec.job,
                 f"rank {rec.rank}/{rec.world_size}" if rec.rank >= 0 and rec.world_size > 0
                 else "rank not known yet", f"backend {rec.backend}" if rec.backend
                 else "no backend yet")
        return rank

    def gone(self, rank: Rank, now: float, status: int) -> None:
        """The rank's process is gone: ended by an earlier daemon's response, or on its
        own; a death that leaves its job unable to finish is kept (`deaths`)."""
        incident = self.ended_by_us.pop(rank.key, None)
        if incident is not None:
            # Ended by an earlier daemon's response, completed at our start: a kill.
            transition(rank, Edge.KILLED, now, f"ended by the watchdog (incident {incident})")
            self.remove_record(rank)
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
            # Its peers are the ranks of the job alive now: a rank that starts later
            # (the job relaunched under the same name) is no peer of this one.
            peers = frozenset(r.key for r in self.ranks.values()
                              if r.record.job == rank.record.job
                              and r.record.uid == rank.record.uid and r.live)
            self.deaths.append(Death(rank, how, peers))

    def expire(self, now: float, retention: float) -> None:
        """Forget ranks that have been final for `retention`, and an owner's oldest past
        MAX_RANKS_PER_UID final ones (one user's churn never grows the table, /metrics
        and the scan's reads without bound); remove their records."""
        final: dict[int, list[Rank]] = {}
        for rank in self.ranks.values():
            if rank.gone_at is not None:
                final.setdefault(rank.record.uid, []).append(rank)
        early = {r.key for ranks in final.values() if len(ranks) > MAX_RANKS_PER_UID
                 for r in sorted(ranks, key=lambda r: r.gone_at or 0.0)[
                     :len(ranks) - MAX_RANKS_PER_UID]}
        for key, rank in list(self.ranks.items()):
            if rank.gone_at is None or (now - rank.gone_at < retention and key not in early):
                continue
            del self.ranks[key]
            self.forget(key)
            self.remove_record(rank)
        for rank in self.ranks.values():
            self.job_seen[job_key(rank.record.uid, rank.record.job)] = now
        # A job's kill counter outlives its ranks by an hour (the repeated-kills
        # alert looks back that far), then goes: the series stay bounded.
        # A job never killed has nothing to count once its ranks are forgotten.
        kills = self.counters.job_kills
        for job, seen in list(self.job_seen.items()):
            if now - seen > JOB_KILLS_KEEP or (seen < now and not kills.get(job)):
                del self.job_seen[job]
                kills.pop(job, None)

    def remove_record(self, rank: Rank) -> None:
        """Delete a dead rank's leftover record, if the file is still that rank's
        and the process is known to be gone (never a live rank's files)."""
        if self.signaller.identify(rank.target()) not in (Result.GONE, Result.NOT_OURS):
            return
        remove_dead_record(rank.path, rank.key)
