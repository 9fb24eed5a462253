"""Evidence of a hang, time-boxed: every rank's Python stacks (faulthandler, on the
dump signal its record names) and native stacks (`sample`, `py-spy` or `gdb`),
copied under `<state-dir>/evidence/<incident>/`, and the hot frames the probe
can parse from them.

The rank's owner controls its dump file and much of what a sampler prints, and
the state disk also holds the journal: so every copy is bounded in bytes and
inside the evidence time box, no evidence is written into the room kept for the
journal (`reserve`), and the evidence kept is bounded in count, bytes and age,
oldest first. Evidence is root's alone to read (0700 folders, 0600 files): a
native backtrace shows addresses and frames of the rank's libraries.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from watchdog.daemon.probes import Probe, ProbeError
from watchdog.daemon.signaller import DUMP_SIGNALS, Result, Signaller, Target
from watchdog.states import STOPPED_STATUSES
from watchdog.status import NativeHot

log = logging.getLogger(__name__)


MAX_DUMP_BYTES = 1 << 20  # a faulthandler dump of 64 threads is tens of kB
NATIVE_READ_LIMIT = 8 << 20  # a sample report is ~100 kB; a runaway one is cut here
KEEP_INCIDENTS = 100  # evidence folders kept, newest first
KEEP_BYTES = 256 << 20  # evidence bytes kept in all
KEEP_SECONDS = 30 * 86400.0  # evidence older than this goes
RESERVE_BYTES = 64 << 20  # free space evidence leaves for the journal (a quarter of a small disk)
_CHUNK = 64 << 10


def free_bytes(directory: str) -> int:
    """Bytes a non-root writer may still use on `directory`'s disk (0: unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def reserve_for(directory: str) -> int:
    """The room kept for the journal: RESERVE_BYTES, or a quarter of a small disk."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return RESERVE_BYTES
    return max(1 << 20, min(RESERVE_BYTES, st.f_blocks * st.f_frsize // 4))


def _private(path: str) -> int:
    """A new evidence file, readable by root alone."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)


def _copy_dump(target: Target, offset: int, out: str, limit: int = MAX_DUMP_BYTES,
               until: float = float("inf"), clock: Callable[[], float] = time.monotonic) -> None:
    """Copy what the rank appended to its dump file, and nothing else: the
    directory is shared, so a link or another user's file there is refused.
    At most `limit` bytes, and no later than `until`: the rank's owner may grow
    the file without end (a sparse gigabyte costs them nothing)."""
    fd = os.open(target.stacks_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != target.uid:
            raise OSError(f"{target.stacks_path} is not the rank's own regular file")
        src.seek(offset)
        with os.fdopen(_private(out), "wb") as dst:
            left = limit
            while left > 0 and clock() < until:
                chunk = src.read(min(_CHUNK, left))
                if not chunk:
                    return
                dst.write(chunk)
                left -= len(chunk)
            if src.read(1):
                dst.write(b"\n[mlx-watchdog: cut here, at the evidence size or time limit]\n")


def _drain(proc: subprocess.Popen[bytes], dst: Any, limit: int, seconds: float,
           clock: Callable[[], float] = time.monotonic) -> bool:
    """Copy the sampler's output to `dst`, at most `limit` bytes, for at most `seconds`
    by `clock`: a real process is waited on in real time (the daemon's injected clock
    may be a test's, which no wait moves); False when time ran out first."""
    assert proc.stdout is not None
    fd, left, until = proc.stdout.fileno(), limit, clock() + seconds
    while True:
        wait = until - clock()
        if wait <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], min(wait, 0.5))
        if not ready:
            continue
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return True
        dst.write(chunk[:left])
        left -= min(left, len(chunk))
        if left == 0:
            dst.write(b"\n[mlx-watchdog: cut here, at the evidence size limit]\n")
            return True


def prune(folder: str, keep: int = KEEP_INCIDENTS, keep_bytes: int = KEEP_BYTES,
          keep_seconds: float = KEEP_SECONDS, *, now: float) -> list[str]:
    """Remove the oldest incident folders past `keep`, `keep_bytes` or `keep_seconds`;
    the removed ones. The folders are ours (root's, 0700): nothing else is there."""
    try:
        entries = [e for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    sized = []
    for entry in entries:
        try:
            files = [f.stat(follow_symlinks=False) for f in os.scandir(entry.path)]
            mtime = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        sized.append((mtime, entry.path, sum(f.st_blocks * 512 for f in files)))
    sized.sort(reverse=True)  # newest first
    removed, total = [], 0
    for count, (mtime, path, size) in enumerate(sized):
        total += size
        if count < keep and total <= keep_bytes and now - mtime <= keep_seconds:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _gap(folder: str, target: Target, why: str) -> None:
    """A rank's Python stack not taken, said where the stacks are: a note beside them
    (not one of the incident's evidence files) and a log line."""
    log.info("no Python stack of rank %s (pid %s): %s", target.rank, target.pid, why)
    path = os.path.join(folder, f"rank{target.rank}-pid{target.pid}-python-missing.txt")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"no Python stack of rank {target.rank} (pid {target.pid}): {why}\n")
    except OSError as err:
        log.info("cannot write %s: %s", path, err.strerror)


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
                 sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time) -> None:
        self.state_dir, self.timeout = state_dir, timeout
        self.signaller, self.probe = signaller, probe
        self.clock, self.sleep, self.wall = clock, sleep, wall

    def capture(self, incident_id: str, targets: list[Target],
                frozen: frozenset[int] = frozenset(), until: float | None = None
                ) -> list[str]:
        """Stack dumps (Python and native) of every target, time-boxed; their files.

        Python dumps are asked of all targets at once, then collected; a
        stopped rank is not asked (its handler cannot run until resumed), but
        one the ladder froze (`frozen`, pids) is: asked, resumed for the dump
        alone, and frozen again (no rank of the job has been ended yet, so it only
        writes its stacks and waits on). Native samplers run one per target, side by
        side, in what time is left, on frozen ranks. `until` (monotonic) ends it sooner
        than the time box: a fenced node's window, before the moment its fence names.
        """
        root = os.path.join(self.state_dir, "evidence")
        os.makedirs(root, mode=0o700, exist_ok=True)
        os.chmod(root, 0o700)  # also a folder an older daemon made 0755
        removed = prune(root, now=self.wall())
        if removed:
            log.info("removed %d old evidence folders (kept at most %d, %d MiB, %d days)",
                     len(removed), KEEP_INCIDENTS, KEEP_BYTES >> 20, KEEP_SECONDS // 86400)
        folder = os.path.join(root, incident_id)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        until = min(self.clock() + self.timeout, float("inf") if until is None else until)
        files = self._python_stacks(targets, folder, min(until, self.clock() + 2.0), until,
                                    frozen)
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(targets)))) as pool:
            native = pool.map(lambda t: self._native_stacks(t, folder, until), targets)
            files += [path for path in native if path]
        return files

    def _running(self, target: Target, frozen: frozenset[int] = frozenset()) -> bool:
        """Not stopped (a stopped rank cannot run its dump handler) unless the ladder
        froze it, and the target: the status from the probe, the identity as the
        signaller checks it."""
        try:
            sample = self.probe.sample(target.pid)
        except ProbeError as err:
            log.info("not asking pid %s for its stacks: %s", target.pid, err)
            return False
        return (sample is not None and (sample.status not in STOPPED_STATUSES
                                        or target.pid in frozen)
                and self.signaller.identify(target) == Result.OURS)

    def _room(self, wanted: int) -> int:
        """Bytes evidence may still take without eating the journal's reserve."""
        return max(0, min(wanted, free_bytes(self.state_dir) - reserve_for(self.state_dir)))

    def _python_stacks(self, targets: list[Target], folder: str, until: float,
                       copy_until: float, frozen: frozenset[int] = frozenset()) -> list[str]:
        asked: dict[Target, int] = {}  # target -> size of its dump file before asking
        for target in targets:
            if target.dump_signal not in DUMP_SIGNALS or not target.stacks_path:
                _gap(folder, target, "its record names no dump signal (its hook runs with "
                                     "MLX_WATCHDOG_DUMP_SIGNAL off, or predates it)")
                continue
            if not self._running(target, frozen):
                _gap(folder, target, "it was stopped already when the response began "
                                     "(SIGSTOP: Ctrl-Z, a debugger, a script), or gone: a "
                                     "rank stopped by someone else is not resumed before "
                                     "its SIGTERM, not even for its dump handler; its "
                                     "native stack, when taken, is beside this file")
                continue
            before = _size(target.stacks_path)
            if self.signaller.send(target, target.dump_signal) == Result.SENT:
                asked[target] = before
        thawed = [t for t in asked if t.pid in frozen]
        for target in thawed:  # its dump signal pending: the handler runs first
            self.signaller.send(target, signal.SIGCONT)
        grown: dict[Target, int] = {}
        try:
            while asked and self.clock() < until:
                grown = {t: b for t, b in asked.items() if _size(t.stacks_path) > b}
                if len(grown) == len(asked):
                    break
                self.sleep(0.05)
            if grown:
                self.sleep(0.1)  # let faulthandler finish writing every thread
        finally:
            for target in thawed:
                self.signaller.send(target, signal.SIGSTOP)
        for target in asked.keys() - grown.keys():
            _gap(folder, target, f"asked with signal {target.dump_signal}, it wrote no dump "
                                 f"within the evidence time box (its Python thread held the "
                                 "GIL in native code, or it was busy exiting)")
        files = []
        for target, before in grown.items():
            out = os.path.join(folder, f"rank{target.rank}-pid{target.pid}-python.txt")
            room = self._room(MAX_DUMP_BYTES)
            if room <= 0:
                log.warning("not copying the stack dump of pid %s: the state disk is nearly "
                            "full (its last room is kept for the journal)", target.pid)
                continue
            try:
                _copy_dump(target, before, out, room, copy_until, self.clock)
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
        room = self._room(NATIVE_READ_LIMIT)
        if room <= 0:
            log.warning("not sampling pid %s: the state disk is nearly full (its last room "
                        "is kept for the journal)", target.pid)
            return None
        try:
            with os.fdopen(_private(out), "wb") as dst:
                # The sampler prints what the rank's owner controls (names, frames,
                # a deep recursion): its output is read through a pipe, cut at
                # `room` bytes and at the time box.
                proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                try:
                    if not _drain(proc, dst, room, timeout):
                        log.info("%s timed out after %.1fs on pid %s", command[0], timeout,
                                 target.pid)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                    proc.wait()
                    if proc.stdout is not None:
                        proc.stdout.close()
        except OSError as err:
            log.warning("%s failed on pid %s: %s", command[0], target.pid, err)
            return None
        return out

    def hot_frames(self, incident_id: str, targets: list[Target], evidence: list[str]
                   ) -> list[NativeHot]:
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
            if threads:
                parsed.append(NativeHot(target.rank, target.pid, threads=tuple(threads)))
            else:  # a sampler that failed or was cut short: say what it said
                first = next((line for line in text.splitlines() if line.strip()), "")
                parsed.append(NativeHot(target.rank, target.pid, error=(
                    f"no call graph in the output: {first[:200] or 'empty'}")))
        return parsed
