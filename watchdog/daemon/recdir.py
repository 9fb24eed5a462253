"""Reading the record directory: safely, and with bounded work per scan.

The directory is shared (sticky and world-writable under a service), so any
user may fill it with anything. Every file is looked at with `lstat` first;
only regular files of the record's size are opened. A file found unusable
for good (wrong type, size, magic, version or owner; a forged identity) is
remembered with its inode and costs nothing more, not even an `lstat`, until
its name holds another file: a rank publishes its record by renaming a new
file into place, so a real record always comes with a new inode. A record
torn mid-write may read fine next time and is not remembered. The number of
files opened per scan is capped. Files the daemon already watches are read
first on every scan; the others are taken in turn from where the last scan
stopped, so junk that sorts first can delay a new record by a scan or two
but never hide it.
"""

from __future__ import annotations

import bisect
import logging
import os
import stat
from collections.abc import Collection, Iterator
from typing import NamedTuple

from watchdog import record
from watchdog.record import Record, RecordError, layout

log = logging.getLogger(__name__)

RECORD_SIZES = frozenset(layout.SIZES.values())
MAX_READS_PER_SCAN = 4096  # files opened per scan, besides those already watched


class Listed(NamedTuple):
    """One file of the directory as a scan found it: its record, or why it is unusable."""

    path: str
    record: Record | None
    why: str  # why the file is unusable; "" when `record` is set
    stat: os.stat_result | None


def _examine(path: str, st: os.stat_result | None
          ) -> tuple[Record | None, str, os.stat_result | None, bool]:
    """`read_record`, plus whether a failure lasts as long as the file's inode."""
    try:
        st = st or os.lstat(path)
    except FileNotFoundError:
        return None, "", None, False
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file", st, True
    if st.st_size not in RECORD_SIZES:  # v2, or v1 from a rank started before an upgrade
        return None, f"size {st.st_size}, not {record.RECORD_SIZE}", st, True
    try:
        rec = record.read_path(path)
    except record.RecordBusy as err:
        # A rank stopped (or killed) in the middle of a write leaves its seq odd
        # for good. Its identity is intact, so it is still judged, by process
        # status first: a stopped rank must not vanish from view.
        try:
            rec = record.decode(err.last)
        except RecordError:
            # A rank stopped inside set_identity shows our magic or, while
            # struct.pack_into has blanked it, zeros: it may read fine next
            # scan. Any other magic is junk with an odd word where seq goes.
            magic = err.last[:len(layout.MAGIC)]
            return None, str(err), st, magic not in (layout.MAGIC, bytes(len(layout.MAGIC)))
    except RecordError as err:
        if isinstance(err.__cause__, FileNotFoundError):
            return None, "", None, False  # the rank closed and removed it meanwhile
        return None, str(err), st, not isinstance(err.__cause__, OSError)
    if rec.uid != st.st_uid:
        return None, f"record claims uid {rec.uid} but the file is owned by uid {st.st_uid}", \
            st, True
    return rec, "", st, False


def read_record(path: str, st: os.stat_result | None = None
                ) -> tuple[Record | None, str, os.stat_result | None]:
    """One file: its record, or why it is not usable ("" when it has just gone)."""
    rec, why, st, _ = _examine(path, st)
    return rec, why, st


class RecordDir:
    """One record directory, read scan after scan."""

    def __init__(self, directory: str, max_reads: int = MAX_READS_PER_SCAN) -> None:
        self.directory = directory
        self.max_reads = max_reads
        self.cursor = ""  # where a scan that hit the cap stopped: the next starts there
        # name -> (inode, why) of files that stay unusable while their inode does
        self.bad: dict[str, tuple[int, str]] = {}
        self.listed = True  # the last listing succeeded: a name missing from it is gone

    def mark_bad(self, path: str, st: os.stat_result | None, why: str) -> None:
        """The caller found this record unusable for good (say, forged): skip it
        until the name holds another file."""
        if st is not None:
            self.bad[os.path.basename(path)] = (st.st_ino, why)

    def unusable(self, limit: int) -> dict[str, str]:
        """Up to `limit` of the files known unusable, path -> why, by name."""
        return {os.path.join(self.directory, name): self.bad[name][1]
                for name in sorted(self.bad)[:limit]}

    def _list(self) -> dict[str, int]:
        """The `*.rec` names in the directory, each with its inode (from readdir: free)."""
        try:
            with os.scandir(self.directory) as it:
                names = {e.name: e.inode() for e in it if e.name.endswith(record.SUFFIX)}
        except OSError as err:
            log.error("cannot list %s: %s", self.directory, err)
            self.listed = False
            return {}
        self.listed = True
        return names

    def read(self, watched: Collection[str] = (), all_files: bool = False) -> Iterator[Listed]:
        """Every usable record and every newly unusable file, within this scan's budget.

        `watched` are the paths of records already known: always read. A file
        known unusable (see `bad`) is passed over without a syscall, and only
        yielded again with `all_files`. A file that vanished between the
        listing and the read is left out.
        """
        inodes = self._list()
        names = sorted(inodes)
        first = [n for n in names if os.path.join(self.directory, n) in watched]
        start = bisect.bisect_left(names, self.cursor)
        rest = [n for n in names[start:] + names[:start] if n not in first]
        self.bad = {n: v for n, v in self.bad.items() if inodes.get(n) == v[0]}
        self.cursor = ""
        opened = 0
        for count, name in enumerate(first + rest):
            path = os.path.join(self.directory, name)
            known = self.bad.get(name)
            if known is not None:
                if all_files:
                    yield Listed(path, None, known[1], None)
                continue
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if count >= len(first):
                if opened >= self.max_reads:
                    self.cursor = name
                    log.warning("%d files of %s left for the next scan (at most %d opened per "
                                "scan)", len(first) + len(rest) - count, self.directory,
                                self.max_reads)
                    return
                if stat.S_ISREG(st.st_mode) and st.st_size in RECORD_SIZES:
                    opened += 1
            rec, why, st2, lasting = _examine(path, st)
            if rec is None and why and lasting:
                self.mark_bad(path, st2, why)
            if rec is not None or why:
                yield Listed(path, rec, why, st2)


def find_record(directory: str, pid: int) -> tuple[Record | None, str]:
    """The record of `pid`: `<pid>.rec`, or `<pid>-<suffix>.rec` where the hook
    published when another user's file held the plain name. Of several, the
    newest process's; else (None, why the plain name is unusable)."""
    plain = os.path.join(directory, f"{pid}{record.SUFFIX}")
    try:
        names = [n for n in os.listdir(directory)
                 if n.startswith(f"{pid}-") and n.endswith(record.SUFFIX)]
    except OSError:
        names = []
    found, why = [], ""
    for path in [plain] + [os.path.join(directory, n) for n in sorted(names)]:
        rec, problem, _ = read_record(path)
        if rec is not None and rec.pid == pid:
            found.append(rec)
        elif path == plain:
            why = problem
    if not found:
        return None, why
    return max(found, key=lambda r: (r.start_ticks, r.start_time)), ""


def read_dir(directory: str) -> Iterator[Listed]:
    """One pass over a directory, with no memory of earlier ones (for the CLI)."""
    return RecordDir(directory).read(all_files=True)


def remove_dead_record(path: str, key: tuple[int, float]) -> None:
    """Delete a dead rank's leftover record and stack file, if the record is still
    that rank's (pid, start time). The caller has checked the process is gone."""
    try:
        rec = record.read_path(path)
    except RecordError as err:
        log.debug("leaving %s in place: %s", path, err)
        return
    if (rec.pid, rec.start_time) != key:
        return
    for leftover in (path, record.stacks_path(path)):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            continue
        except OSError as err:
            log.warning("cannot remove %s: %s", leftover, err)
