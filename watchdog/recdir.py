"""Reading the record directory: safely, and with bounded work per scan.

The directory is shared (sticky and world-writable under a service), so any
user may fill it with anything. Every file is looked at with `lstat` first;
only regular files of the record's size are opened. A file found unusable is
remembered with its stat signature and not read again until it changes, and
the number of files opened per scan is capped. Files the daemon already
watches are read first on every scan; the others are taken in turn from
where the last scan stopped, so junk that sorts first can delay a new record
by a scan or two but never hide it.
"""

from __future__ import annotations

import bisect
import logging
import os
import stat
from collections.abc import Collection, Iterator
from typing import NamedTuple

from . import record
from .record import Record, RecordError

log = logging.getLogger(__name__)

MAX_READS_PER_SCAN = 4096  # files opened per scan, besides those already watched


class Entry(NamedTuple):
    path: str
    record: Record | None
    why: str  # why the file is unusable; "" when `record` is set
    stat: os.stat_result | None


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_record(path: str, st: os.stat_result | None = None
                ) -> tuple[Record | None, str, os.stat_result | None]:
    """One file: its record, or why it is not usable ("" when it has just gone)."""
    try:
        st = st or os.lstat(path)
    except FileNotFoundError:
        return None, "", None
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file", st
    if st.st_size != record.RECORD_SIZE:
        return None, f"size {st.st_size}, not {record.RECORD_SIZE}", st
    try:
        rec = record.read_path(path)
    except record.RecordBusy as err:
        # A rank stopped (or killed) in the middle of a write leaves its seq odd
        # for good. Its identity is intact, so it is still judged, by process
        # status first: a stopped rank must not vanish from view.
        try:
            rec = record.decode(err.last)
        except RecordError:
            return None, str(err), st
    except RecordError as err:
        if isinstance(err.__cause__, FileNotFoundError):
            return None, "", None  # the rank closed and removed it meanwhile: not garbage
        return None, str(err), st
    if rec.uid != st.st_uid:
        return None, f"record claims uid {rec.uid} but the file is owned by uid {st.st_uid}", st
    return rec, "", st


class RecordDir:
    """One record directory, read scan after scan."""

    def __init__(self, directory: str, max_reads: int = MAX_READS_PER_SCAN) -> None:
        self.directory = directory
        self.max_reads = max_reads
        self.cursor = ""  # where a scan that hit the cap stopped: the next starts there
        self.bad: dict[str, tuple[tuple[int, int, int, int], str]] = {}

    def mark_bad(self, path: str, st: os.stat_result | None, why: str) -> None:
        """The caller found this record unusable (say, forged): skip it until it changes."""
        if st is not None:
            self.bad[path] = (_signature(st), why)

    def _names(self) -> list[str]:
        try:
            with os.scandir(self.directory) as it:
                return sorted(e.name for e in it if e.name.endswith(record.SUFFIX))
        except OSError as err:
            log.error("cannot list %s: %s", self.directory, err)
            return []

    def read(self, watched: Collection[str] = ()) -> Iterator[Entry]:
        """Every usable record and every unusable file, within this scan's budget.

        `watched` are the paths of records already known: always read. A file
        that vanished between the listing and the read is left out.
        """
        names = self._names()
        paths = [os.path.join(self.directory, n) for n in names]
        first = [p for p in paths if p in watched]
        start = bisect.bisect_left(names, self.cursor)
        rest = [p for p in paths[start:] + paths[:start] if p not in watched]
        listed = set(paths)
        self.bad = {p: v for p, v in self.bad.items() if p in listed}
        self.cursor = ""
        opened = 0
        for path in first + rest:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            known = self.bad.get(path)
            if known is not None and known[0] == _signature(st):
                yield Entry(path, None, known[1], st)
                continue
            if path not in watched:
                if opened >= self.max_reads:
                    self.cursor = os.path.basename(path)
                    names_left = len(rest) - rest.index(path)
                    log.warning("%d files of %s left for the next scan (at most %d opened per "
                                "scan)", names_left, self.directory, self.max_reads)
                    return
                if stat.S_ISREG(st.st_mode) and st.st_size == record.RECORD_SIZE:
                    opened += 1
            rec, why, st2 = read_record(path, st)
            if rec is None and why:
                self.mark_bad(path, st2, why)
            if rec is not None or why:
                yield Entry(path, rec, why, st2)


def read_dir(directory: str) -> Iterator[Entry]:
    """One pass over a directory, with no memory of earlier ones (for the CLI)."""
    return RecordDir(directory).read()
