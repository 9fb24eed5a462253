"""The escalation ladder: evidence, SIGCONT, SIGTERM, grace, SIGKILL, confirm.

Every signal goes through a `Signaller` (signaller.py), which re-checks the
process identity right before it signals; evidence comes from `Evidence`
(evidence.py). After the kill, wired memory gets the settle time to come back,
and an unkillable rank or leaked memory flags the node for reboot. Tests pass a
fake signaller and a fake clock.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from watchdog import record
from watchdog.daemon.act.evidence import Evidence
from watchdog.daemon.config import Settings
from watchdog.daemon.probes import Probe, ProbeError
from watchdog.daemon.signaller import (
    EXITED,
    KILLED,
    OURS,
    SENT,
    UNKILLABLE,
    UNKNOWN,
    Signaller,
    Target,
)
from watchdog.daemon.store import journal, pending
from watchdog.record import RecordError, read_path
from watchdog.record.layout import STACKS_SUFFIX, SUFFIX
from watchdog.status import ABSENT, Incident, SignalSent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What one response to a hung job did, handed back to the daemon's loop."""

    incident: Incident  # as written to incidents.jsonl
    # pid -> KILLED, UNKILLABLE, UNKNOWN, or what stopped the ladder early (GONE,
    # NOT_OURS, DENIED); empty when nothing was signalled (observe mode, a hold)
    results: dict[int, str] = field(default_factory=dict)
    signals_sent: tuple[str, ...] = ()  # names of the signals that reached a rank
    held: str = ""  # not acted on: why (a rank of the job computes on another node)


class Enforcer:
    def __init__(self, settings: Settings, signaller: Signaller, probe: Probe, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.signaller = signaller
        self.probe = probe
        self.clock = clock
        self.sleep = sleep
        self.wall = wall
        self.evidence = Evidence(settings.state_dir, settings.evidence_timeout, signaller,
                                 probe, clock=clock, sleep=sleep)
        # Incidents and reboot flags a failed write left in memory (pending.py).
        self.backlog = pending.Backlog(settings.state_dir)
        # incident id -> (targets, baseline): what write-ahead entries hold
        self._responses: dict[str, tuple[list[Target], int | None]] = {}

    def capture(self, incident_id: str, targets: list[Target]) -> list[str]:
        """Stack dumps of every target, time-boxed; their files."""
        return self.evidence.capture(incident_id, targets)

    # -- the ladder ------------------------------------------------------------

    def write_ahead(self, incident: Incident) -> None:
        """The response so far, on disk before its next step. A failed write is
        reported and the kill goes on: a hung job must end whatever the disk does."""
        response = self._responses.get(incident.id)
        if response is None:
            return  # a ladder run on its own (tests): nothing to journal
        targets, baseline = response
        try:
            pending.write_ahead(self.settings.state_dir, incident, targets, baseline)
        except OSError as err:
            self.backlog.failures += 1
            log.error("cannot journal incident %s before acting (%s); acting anyway",
                      incident.id, err)

    def _signal(self, sent: list[SignalSent], target: Target, signum: int) -> str:
        result = self.signaller.send(target, signum)
        sent.append(SignalSent(pid=target.pid, rank=target.rank,
                               signal=signal.Signals(signum).name, time=self.wall(),
                               result=result))
        log.info("%s to pid %s (job %s rank %s): %s", signal.Signals(signum).name,
                 target.pid, target.job, target.rank, result)
        return result

    def _not_gone(self, target: Target) -> bool:
        # A failed probe proves neither an end nor a survival: keep waiting on it.
        return self.signaller.identify(target) in (OURS, UNKNOWN)

    def _wait_gone(self, targets: list[Target], seconds: float) -> list[Target]:
        """The targets not known to be gone after up to `seconds`."""
        until = self.clock() + seconds
        left = [t for t in targets if self._not_gone(t)]
        while left and self.clock() < until:
            self.sleep(0.05)
            left = [t for t in left if self._not_gone(t)]
        return left

    def _ending_itself(self, target: Target) -> bool:
        """Its record says the rank is leaving on an uncaught exception (the backend's
        own error: "[ring] connection to a peer was lost"). The hook writes that at
        exit, which a SIGTERM's default action never reaches: so a rank found so
        after the ladder ended on its own error, not by the watchdog's signal."""
        if not target.record_path:
            return False
        try:
            rec = record.read_path(target.record_path)
        except (record.RecordError, OSError):
            return False  # removed, or unreadable: nothing proves it
        return (rec.status == record.STATUS_ERROR and rec.pid == target.pid
                and rec.start_time == target.start_time)

    def end(self, incident: Incident, targets: list[Target]
            ) -> tuple[Incident, dict[int, str]]:
        """SIGCONT, SIGTERM, grace, SIGKILL, confirm. Returns the incident with its
        signals, and pid -> outcome."""
        sent = list(incident.signals or ())
        # Journaled before the first signal of each round, not before each signal:
        # a write (an fsync) between a SIGCONT and the SIGTERM that follows would
        # let a resumed rank see its peer die and exit first. A target gone after
        # the ladder began was ended by it (Enforcer.complete).
        incident = replace(incident, signals=tuple(sent), ladder="begun")
        self.write_ahead(incident)
        outcome = {}
        # A rank already leaving on its own error gets the grace to finish, unsignalled.
        ending = [t for t in targets if self._ending_itself(t)]
        if ending:
            left = self._wait_gone(ending, self.settings.grace)
            for target in ending:
                if target not in left:
                    outcome[target.pid] = EXITED
                    log.info("pid %s (job %s rank %s) ended on its own error; not signalled",
                             target.pid, target.job, target.rank)
        targets = [t for t in targets if t.pid not in outcome]
        for target in targets:
            # SIGCONT first: a stopped rank would not act on SIGTERM until resumed.
            result = self._signal(sent, target, signal.SIGCONT)
            if result != SENT:
                outcome[target.pid] = result
        live = [t for t in targets if t.pid not in outcome]
        for target in live:
            result = self._signal(sent, target, signal.SIGTERM)
            if result != SENT:
                outcome[target.pid] = result
        left = self._wait_gone([t for t in live if t.pid not in outcome],
                               self.settings.grace)
        if left:  # SIGCONT and SIGTERM as sent, before the SIGKILLs
            self.write_ahead(replace(incident, signals=tuple(sent)))
        for target in left:
            self._signal(sent, target, signal.SIGKILL)
        left = self._wait_gone(left, self.settings.kill_timeout)
        # "unkillable" (and the reboot flag) only on a positive match: a
        # process that could not be probed is "unknown", never a false alarm.
        survivors = {t.pid for t in left if self.signaller.identify(t) == OURS}
        # A rank found leaving on its own error *before* the ladder was left alone above.
        # One that reached its error exit while the ladder ran is still the ladder's: its
        # peers' signals caused that error, and SIGTERM often ends it mid-exit (it then
        # dies of the signal), so which came first cannot be told apart reliably.
        for target in live:
            outcome.setdefault(target.pid, KILLED if target not in left else
                               UNKILLABLE if target.pid in survivors else UNKNOWN)
        return replace(incident, signals=tuple(sent)), outcome

    def settle_wired(self, baseline: int | None, others_live: Callable[[], bool]
                     ) -> dict[str, Any]:
        """After a kill: does wired memory come back to the idle baseline?"""
        if baseline is None:
            return {"wired_check": "no baseline"}
        threshold = self.settings.wired_threshold
        until = self.clock() + self.settings.settle
        wired = self._wired()
        while wired is not None and wired > baseline + threshold and self.clock() < until:
            self.sleep(0.25)
            wired = self._wired()
        result: dict[str, Any] = {"wired_baseline": baseline, "wired_after": wired}
        if wired is None:
            result["wired_check"] = "probe failed"
        elif wired <= baseline + threshold:
            result["wired_check"] = "returned"
        elif others_live():
            # Other ranks hold wired memory legitimately; no verdict on a leak.
            result["wired_check"] = "skipped: other ranks are live"
        else:
            result["wired_check"] = "leaked"
        return result

    def _wired(self) -> int | None:
        try:
            return self.probe.wired_bytes()
        except ProbeError as err:
            log.warning("wired memory probe failed: %s", err)
            return None

    def handle(self, incident: Incident, targets: list[Target],
               baseline: int | None = None,
               others_live: Callable[[], bool] = lambda: False,
               cluster: Callable[[], dict[str, Any] | None] | None = None,
               evidence: bool = True) -> Outcome:
        """Run the whole response to one hung job; journal it; say what it did.

        `cluster` asks the peers which rank holds the job up (bounded by the
        peer timeout); `evidence=False` skips stack dumps (a fenced job is
        known dead, and its peers wait on its end).
        """
        outcome: dict[int, str] = {}
        incident = replace(incident, signals=(), wired_before=self._wired(),
                           wired_baseline=baseline)
        self._responses[incident.id] = (targets, baseline)
        try:
            return self._handle(incident, targets, baseline, others_live, cluster, evidence,
                                outcome)
        finally:
            self._responses.pop(incident.id, None)

    def _handle(self, incident: Incident, targets: list[Target], baseline: int | None,
                others_live: Callable[[], bool],
                cluster: Callable[[], dict[str, Any] | None] | None, evidence: bool,
                outcome: dict[int, str]) -> Outcome:
        flag: dict[str, Any] | None = None
        if cluster is not None:
            try:
                view = cluster()
            except Exception as err:  # noqa: BLE001 - the kill must not wait on peers
                view = {"error": str(err)}
            incident = replace(incident, cluster=view)
        if self.settings.mode == "observe":
            # Observe signals nothing, not even the stack-dump signal, and does
            # not ptrace: the thread CPU and flight recorder are the evidence.
            incident = replace(incident, evidence=(), outcome={},
                               action="observed (mode observe: nothing signalled)")
        else:
            incident = replace(incident, action="ending")
            self.write_ahead(incident)  # the verdict, before the first signal (evidence's)
            try:
                files = tuple(self.capture(incident.id, targets)) if evidence else ()
            except Exception as err:  # noqa: BLE001 - evidence is never worth a missed kill
                log.error("gathering evidence for incident %s failed: %s", incident.id, err)
                files = ()
                incident = replace(incident, evidence_error=str(err))
            incident = replace(incident, evidence=files, action="ended")
            incident, ended = self.end(incident, targets)
            outcome.update(ended)
            incident = replace(incident, outcome={str(pid): result
                                                  for pid, result in outcome.items()})
            # Parsed after the kill, which must not wait on it.
            hot = self.evidence.hot_frames(incident.id, targets, list(files))
            if hot:
                incident = replace(incident, native_hot=tuple(hot))
            self.write_ahead(incident)  # the outcome, before the settle (up to minutes)
            incident, flag = self._settle(incident, outcome, baseline, others_live)
        incident = self.close(incident, flag)
        return Outcome(incident, outcome, _sent(incident))

    def _settle(self, incident: Incident, outcome: dict[int, str], baseline: int | None,
                others_live: Callable[[], bool]
                ) -> tuple[Incident, dict[str, Any] | None]:
        """The wired-memory settle after a kill; the reboot flag it calls for, if any."""
        unkillable = [pid for pid, result in outcome.items() if result == UNKILLABLE]
        settled = self.settle_wired(baseline, others_live)
        incident = replace(incident, wired_check=settled["wired_check"], **{
            key: settled[key] for key in ("wired_baseline", "wired_after") if key in settled})
        reasons = []
        if unkillable:
            reasons.append(f"pids {unkillable} survived SIGKILL for "
                           f"{self.settings.kill_timeout:g}s")
        if incident.wired_check == "leaked":
            reasons.append("wired memory stayed above the baseline after the kill")
        if not reasons:
            return incident, None
        reason = "; ".join(reasons)
        flag = {"reason": reason, "time": self.wall(), "incident": incident.id,
                "wired_baseline": baseline, "wired_after": _wired_after(incident)}
        log.error("node flagged for reboot: %s", reason)
        return replace(incident, reboot_required=reason), flag

    def replay_within(self) -> float:
        """Seconds after its verdict an interrupted response is still completed at
        start: every step's bound, as for a response presumed stuck."""
        s = self.settings
        return 2 * (s.peer_timeout + s.evidence_timeout + s.grace + s.kill_timeout
                    + s.settle) + 30.0

    def complete(self, entry: pending.Entry, others_live: Callable[[], bool]) -> Outcome:
        """At start: finish a response an earlier daemon journaled and never closed.

        A target still ours, whose wait has not returned, goes down the rest of
        the ladder (its verdict stands, and an interrupted SIGTERM must not
        leave it half-ended); one gone after a signal was journaled was ended
        by us, never a crash. The settle and the flag follow as usual.
        """
        incident, targets, baseline = entry.incident, list(entry.targets), entry.baseline
        if incident.closed_at is not None:  # all done but the journal line, or the flag
            self._reclose(incident, baseline)
            return Outcome(incident, {}, ())
        log.warning("completing incident %s of job %s left unfinished by an earlier daemon",
                    incident.id, incident.job)
        incident = replace(incident, signals=incident.signals or (),
                           completed_at_start=self.wall())
        self._responses[incident.id] = (targets, baseline)
        try:
            # The ladder had begun: every target may have had its signals (they are
            # journaled per round); else only those the journal names.
            signalled = ({t.pid for t in targets} if incident.ladder else
                         {s.pid for s in incident.signals or ()
                          if s.signal in ("SIGTERM", "SIGKILL")})
            fresh = self.wall() - incident.time < self.replay_within()
            outcome: dict[int, str] = {}
            live = []
            for target in targets:
                who = self.signaller.identify(target)
                if who == OURS and (fresh and self.settings.mode == "enforce"
                                    and incident.action in ("ending", "ended")
                                    and not _progressed(incident, target)):
                    live.append(target)
                elif who == OURS:
                    outcome[target.pid] = UNKNOWN  # left to the scan to judge afresh
                else:
                    outcome[target.pid] = KILLED if target.pid in signalled else who
            if live:
                incident, ended = self.end(replace(incident, action="ended"), live)
                outcome.update(ended)
            incident = replace(incident, outcome={str(pid): result
                                                  for pid, result in outcome.items()})
            flag = None
            if any(r in (KILLED, UNKILLABLE) for r in outcome.values()):
                incident, flag = self._settle(incident, outcome, baseline, others_live)
            incident = self.close(incident, flag)
        finally:
            self._responses.pop(incident.id, None)
        return Outcome(incident, outcome, _sent(incident))

    def _reclose(self, incident: Incident, baseline: int | None) -> None:
        """A closed incident an earlier daemon could not finish writing: its line
        and its reboot flag, whichever is not on disk yet (never twice)."""
        state_dir = self.settings.state_dir
        written = any(i.get("id") == incident.id
                      for i in journal.read_incidents(state_dir)[0])
        flag = None
        reason = incident.reboot_required
        present = journal.reboot_flag(state_dir) or {}
        if reason and not any(r.get("incident") == incident.id
                              for r in present.get("reasons", []) if isinstance(r, dict)):
            flag = {"reason": reason, "time": self.wall(), "incident": incident.id,
                    "wired_baseline": baseline, "wired_after": _wired_after(incident)}
        if written:
            self.backlog.written(incident.id)
        self.backlog.add(None if written else incident, flag)

    def close(self, incident: Incident, flag: dict[str, Any] | None) -> Incident:
        """Journal the incident and the flag, each on its own: one failed write
        neither skips the other nor loses itself (held and retried each scan)."""
        incident = replace(incident, closed_at=self.wall(), reboot_required=(
            False if incident.reboot_required is None else incident.reboot_required))
        # Closed in its entry too: a restart before both writes are done completes
        # only the writes (never the ladder again, never a second line).
        self.write_ahead(incident)
        self.backlog.add(incident, flag)
        return incident


def _sent(incident: Incident) -> tuple[str, ...]:
    """The names of the signals that reached a rank."""
    return tuple(s.signal for s in incident.signals or () if s.result == SENT and s.signal)


def _wired_after(incident: Incident) -> int | None:
    return None if incident.wired_after is ABSENT else incident.wired_after


def _progressed(incident: Incident, target: Target) -> bool:
    """The target's wait returned since the verdict (its record counts more
    completed waits than the incident saw): no longer hung, not to be ended."""
    seen = next((r.progress for r in incident.ranks if r.pid == target.pid), None)
    if seen is None or not target.stacks_path:
        return False
    path = target.stacks_path[: -len(STACKS_SUFFIX)] + SUFFIX
    try:
        rec = read_path(path)
    except RecordError:
        return False  # unreadable or removed: the identity check decides
    return rec.pid == target.pid and rec.waits_completed > seen
