"""The escalation ladder: evidence, SIGCONT, SIGTERM, grace, SIGKILL, confirm.

Every signal goes through a `Signaller`, the one seam to the OS for acting:
it re-checks the process identity (pid, start time, uid) right before it
signals, so a pid that was recycled is never hit. "Already gone" is a result,
not an error. Tests pass a fake signaller and a fake clock.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from watchdog.daemon import journal
from watchdog.daemon.config import Settings
from watchdog.daemon.probes import STOPPED_STATUSES, Probe, ProbeError, same_process

log = logging.getLogger(__name__)

# Signals a record may name for its stack dump. Anything else (a forged record
# asking for SIGKILL, say) is ignored.
DUMP_SIGNALS = frozenset(
    {int(signal.SIGUSR1), int(signal.SIGUSR2)}
    | set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1) if hasattr(signal, "SIGRTMIN") else ()))

SENT, GONE, NOT_OURS, DENIED = "sent", "gone", "not-ours", "denied"
# What an identity check can say besides GONE and NOT_OURS. UNKNOWN (the probe
# failed) is never taken as a match: nothing is signalled on it, and it is
# never taken as proof that a process ended or survived either.
OURS, UNKNOWN = "ours", "unknown"


def _copy_dump(target: Target, offset: int, out: str) -> None:
    """Copy what the rank appended to its dump file, and nothing else: the
    directory is shared, so a link or another user's file there is refused."""
    fd = os.open(target.stacks_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != target.uid:
            raise OSError(f"{target.stacks_path} is not the rank's own regular file")
        src.seek(offset)
        with open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)


NATIVE_READ_LIMIT = 8 << 20  # a sample report is ~100 kB; a runaway one is cut here


def _native_path(folder: str, target: Target) -> str:
    return os.path.join(folder, f"rank{target.rank}-pid{target.pid}-native.txt")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


@dataclass(frozen=True)
class Target:
    """A rank process the ladder may signal: identity first."""

    pid: int
    start_time: float
    uid: int
    job: str
    rank: int
    dump_signal: int = 0
    stacks_path: str = ""
    start_ticks: int = 0  # clock ticks since boot (Linux); 0: unknown, compare start_time


class Signaller:
    """Signals a process only if it is still the one the record describes."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def identify(self, target: Target) -> str:
        """OURS, GONE, NOT_OURS, or UNKNOWN when the probe failed."""
        try:
            sample = self.probe.sample(target.pid)
        except ProbeError:
            return UNKNOWN
        if sample is None:
            return GONE
        return OURS if same_process(sample, target.start_time, target.uid,
                                    target.start_ticks) else NOT_OURS

    def alive(self, target: Target) -> bool:
        """Positively still the process the record describes (a failed probe is not)."""
        return self.identify(target) == OURS

    def send(self, target: Target, signum: int) -> str:
        pidfd = -1
        if hasattr(os, "pidfd_open"):
            # A pidfd pins the process: once the identity is checked through it,
            # the signal cannot reach a recycled pid.
            try:
                pidfd = os.pidfd_open(target.pid)
            except ProcessLookupError:
                return GONE
            except OSError:
                pidfd = -1
        try:
            # Fail closed: only a positive match (pid, start, uid) is signalled.
            who = self.identify(target)
            if who != OURS:
                return who
            if pidfd >= 0:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(target.pid, signum)
            return SENT
        except ProcessLookupError:
            return GONE
        except PermissionError:
            return DENIED
        finally:
            if pidfd >= 0:
                os.close(pidfd)


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

    # -- evidence --------------------------------------------------------------

    def capture(self, incident_id: str, targets: list[Target]) -> list[str]:
        """Stack dumps (Python and native) of every target, time-boxed; their files.

        Python dumps are asked of all targets at once, then collected; a
        stopped rank is not asked (its handler cannot run until resumed).
        Native samplers run one per target, side by side, in what time is left.
        """
        folder = os.path.join(self.settings.state_dir, "evidence", incident_id)
        os.makedirs(folder, exist_ok=True)
        until = self.clock() + self.settings.evidence_timeout
        files = self._python_stacks(targets, folder, min(until, self.clock() + 2.0))
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(targets)))) as pool:
            native = pool.map(lambda t: self._native_stacks(t, folder, until), targets)
            files += [path for path in native if path]
        return files

    def _running(self, target: Target) -> bool:
        try:
            sample = self.probe.sample(target.pid)
        except ProbeError:
            return False
        return (same_process(sample, target.start_time, target.uid, target.start_ticks)
                and sample is not None and sample.status not in STOPPED_STATUSES)

    def _python_stacks(self, targets: list[Target], folder: str, until: float) -> list[str]:
        asked: dict[Target, int] = {}  # target -> size of its dump file before asking
        for target in targets:
            if target.dump_signal not in DUMP_SIGNALS or not target.stacks_path:
                continue
            if not self._running(target):
                continue
            before = _size(target.stacks_path)
            if self.signaller.send(target, target.dump_signal) == SENT:
                asked[target] = before
        grown: dict[Target, int] = {}
        while asked and self.clock() < until:
            grown = {t: b for t, b in asked.items() if _size(t.stacks_path) > b}
            if len(grown) == len(asked):
                break
            self.sleep(0.05)
        if grown:
            self.sleep(0.1)  # let faulthandler finish writing every thread
        files = []
        for target, before in grown.items():
            out = os.path.join(folder, f"rank{target.rank}-pid{target.pid}-python.txt")
            try:
                _copy_dump(target, before, out)
            except OSError as err:
                log.warning("copying stack dump of pid %s failed: %s", target.pid, err)
                continue
            files.append(out)
        return files

    def _native_stacks(self, target: Target, folder: str, until: float) -> str | None:
        command = self.probe.stack_command(target.pid)
        timeout = until - self.clock()
        if not command or timeout <= 0.5 or not self.signaller.alive(target):
            return None
        out = _native_path(folder, target)
        try:
            with open(out, "wb") as dst:
                subprocess.run(command, stdout=dst, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            log.info("%s timed out after %.1fs on pid %s", command[0], timeout, target.pid)
        except OSError as err:
            log.warning("%s failed on pid %s: %s", command[0], target.pid, err)
            return None
        return out

    def hot_frames(self, incident_id: str, targets: list[Target], evidence: list[str]
                   ) -> list[dict[str, Any]]:
        """Each native dump the probe can parse, as threads and their hot frames."""
        folder = os.path.join(self.settings.state_dir, "evidence", incident_id)
        parsed = []
        for target in targets:
            path = _native_path(folder, target)
            if path not in evidence:
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read(NATIVE_READ_LIMIT)
            except OSError as err:
                log.warning("reading %s failed: %s", path, err)
                continue
            threads = self.probe.hot_frames(text)
            if threads is None:
                continue
            entry: dict[str, Any] = {"rank": target.rank, "pid": target.pid}
            if threads:
                entry["threads"] = threads
            else:  # a sampler that failed or was cut short: say what it said
                first = next((line for line in text.splitlines() if line.strip()), "")
                entry["error"] = f"no call graph in the output: {first[:200] or 'empty'}"
            parsed.append(entry)
        return parsed

    # -- the ladder ------------------------------------------------------------

    def _signal(self, incident: dict[str, Any], target: Target, signum: int) -> str:
        result = self.signaller.send(target, signum)
        incident["signals"].append({"pid": target.pid, "rank": target.rank,
                                    "signal": signal.Signals(signum).name,
                                    "time": self.wall(), "result": result})
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

    def end(self, incident: dict[str, Any], targets: list[Target]) -> dict[int, str]:
        """SIGCONT, SIGTERM, grace, SIGKILL, confirm. Returns pid -> outcome."""
        incident.setdefault("signals", [])
        outcome = {}
        for target in targets:
            # SIGCONT first: a stopped rank would not act on SIGTERM until resumed.
            result = self._signal(incident, target, signal.SIGCONT)
            if result != SENT:
                outcome[target.pid] = result
        live = [t for t in targets if t.pid not in outcome]
        for target in live:
            result = self._signal(incident, target, signal.SIGTERM)
            if result != SENT:
                outcome[target.pid] = result
        left = self._wait_gone([t for t in live if t.pid not in outcome],
                               self.settings.grace)
        for target in left:
            self._signal(incident, target, signal.SIGKILL)
        left = self._wait_gone(left, self.settings.kill_timeout)
        # "unkillable" (and the reboot flag) only on a positive match: a
        # process that could not be probed is "unknown", never a false alarm.
        survivors = {t.pid for t in left if self.signaller.identify(t) == OURS}
        for target in live:
            outcome.setdefault(target.pid, "killed" if target not in left else
                               "unkillable" if target.pid in survivors else UNKNOWN)
        return outcome

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

    def handle(self, incident: dict[str, Any], targets: list[Target],
               baseline: int | None = None,
               others_live: Callable[[], bool] = lambda: False,
               cluster: Callable[[], dict[str, Any] | None] | None = None,
               evidence: bool = True) -> dict[str, Any]:
        """Run the whole response to one hung job; journal it; return the incident.

        `cluster` asks the peers which rank holds the job up (bounded by the
        peer timeout); `evidence=False` skips stack dumps (a fenced job is
        known dead, and its peers wait on its end).
        """
        state_dir = self.settings.state_dir
        incident["signals"] = []
        incident["wired_before"] = self._wired()
        if cluster is not None:
            try:
                incident["cluster"] = cluster()
            except Exception as err:  # noqa: BLE001 - the kill must not wait on peers
                incident["cluster"] = {"error": str(err)}
        if self.settings.mode == "observe":
            # Observe signals nothing, not even the stack-dump signal, and does
            # not ptrace: the thread CPU and flight recorder are the evidence.
            incident["evidence"] = []
            incident["action"] = "observed (mode observe: nothing signalled)"
            incident["outcome"] = {}
        else:
            try:
                incident["evidence"] = self.capture(incident["id"], targets) if evidence else []
            except Exception as err:  # noqa: BLE001 - evidence is never worth a missed kill
                log.error("gathering evidence for incident %s failed: %s", incident["id"], err)
                incident["evidence"] = []
                incident["evidence_error"] = str(err)
            incident["action"] = "ended"
            outcome = self.end(incident, targets)
            incident["outcome"] = {str(pid): result for pid, result in outcome.items()}
            # Parsed after the kill, which must not wait on it.
            hot = self.hot_frames(incident["id"], targets, incident["evidence"])
            if hot:
                incident["native_hot"] = hot
            unkillable = [pid for pid, result in outcome.items() if result == "unkillable"]
            incident.update(self.settle_wired(baseline, others_live))
            reasons = []
            if unkillable:
                reasons.append(f"pids {unkillable} survived SIGKILL for "
                               f"{self.settings.kill_timeout:g}s")
            if incident.get("wired_check") == "leaked":
                reasons.append("wired memory stayed above the baseline after the kill")
            if reasons:
                flag = journal.set_reboot_flag(
                    state_dir, "; ".join(reasons), time=self.wall(), incident=incident["id"],
                    wired_baseline=baseline, wired_after=incident.get("wired_after"))
                incident["reboot_required"] = flag["reason"]
                log.error("node flagged for reboot: %s", "; ".join(reasons))
        incident["reboot_required"] = incident.get("reboot_required", False)
        incident["closed_at"] = self.wall()
        journal.append_incident(state_dir, incident)
        return incident
