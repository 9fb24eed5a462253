"""Evidence of a hang, time-boxed: every rank's Python stacks (faulthandler, on the
dump signal its record names) and native stacks (`sample`, `py-spy` or `gdb`),
copied under `<state-dir>/evidence/<incident>/`, and the hot frames the probe
can parse from them."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from watchdog.daemon.probes import STOPPED_STATUSES, Probe, ProbeError, same_process
from watchdog.daemon.signaller import DUMP_SIGNALS, SENT, Signaller, Target

log = logging.getLogger(__name__)


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


class Evidence:
    """Gathers the stacks of the ranks of one incident, within `timeout` seconds."""

    def __init__(self, state_dir: str, timeout: float, signaller: Signaller, probe: Probe, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.state_dir, self.timeout = state_dir, timeout
        self.signaller, self.probe = signaller, probe
        self.clock, self.sleep = clock, sleep

    def capture(self, incident_id: str, targets: list[Target]) -> list[str]:
        """Stack dumps (Python and native) of every target, time-boxed; their files.

        Python dumps are asked of all targets at once, then collected; a
        stopped rank is not asked (its handler cannot run until resumed).
        Native samplers run one per target, side by side, in what time is left.
        """
        folder = os.path.join(self.state_dir, "evidence", incident_id)
        os.makedirs(folder, exist_ok=True)
        until = self.clock() + self.timeout
        files = self._python_stacks(targets, folder, min(until, self.clock() + 2.0))
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(targets)))) as pool:
            native = pool.map(lambda t: self._native_stacks(t, folder, until), targets)
            files += [path for path in native if path]
        return files

    def _running(self, target: Target) -> bool:
        try:
            sample = self.probe.sample(target.pid)
        except ProbeError as err:
            log.info("not asking pid %s for its stacks: %s", target.pid, err)
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
        folder = os.path.join(self.state_dir, "evidence", incident_id)
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
