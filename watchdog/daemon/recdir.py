"""Reading the record directory: safely, and with bounded work per scan.

The directory is shared (sticky and world-writable under a service), so any
user may fill it with anything. Every file is looked at with `lstat` first;
only regular files of the record's size are opened. A file found unusable
for good (wrong type, size, magic, version or owner; a forged identity) is
remembered by what it is, (st_dev, st_ino, size, mtime), and by its name: it
costs nothing more, not even an `lstat`, under that name or any other name of
its inode (thousands of hard links to one file cost a dictionary look-up each),
and a rename of it costs one `lstat`. A rank publishes its record by renaming a
new file into place, so a real record always comes with a new inode. A record
torn mid-write may read fine next time and is not remembered.

The files opened per scan are capped: in all (MAX_READS_PER_SCAN) and per
owner's uid (MAX_READS_PER_UID), the owners taken in turn and each owner's
newest and oldest files by turns. Names steer nothing: however many files one user keeps
creating, renaming or linking, another user's new record is opened in the first
scan that lists it (docs/operations.md). Files the daemon already watches are
read on every scan; an ended rank's file is not read again while its name holds
the file last read there.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Collection, Iterator
from typing import NamedTuple

from watchdog import record
from watchdog.record import Record, RecordError, layout

log = logging.getLogger(__name__)

RECORD_SIZES = frozenset(layout.SIZES.values())
MAX_READS_PER_SCAN = 256  # files opened per scan, besides those already watched
# Files of one owner's opened per scan (and so at most as many first looks at the
# processes they name): a read and decode is ~0.3 ms, so one user's flood costs a scan
# ~6 ms at most, and every other user's new record is read in the first scan that
# lists it. A user's own ranks past 16 new at once are read over the next scans.
MAX_READS_PER_UID = 16
ONE_PASS_READS = 4096  # a one-pass reader's (the CLI's) cap, whoever owns the files


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

    def __init__(self, directory: str, max_reads: int = MAX_READS_PER_SCAN,
                 max_reads_per_uid: int = MAX_READS_PER_UID) -> None:
        self.directory = directory
        self.max_reads = max_reads
        self.max_reads_per_uid = max_reads_per_uid
        # name -> (inode, why, by_file) of names that stay unusable while their inode
        # does; by_file: the verdict is the file's (its type, size or content), so every
        # other name of that inode (a hard link, a rename) shares it
        self.bad: dict[str, tuple[int, str, bool]] = {}
        # (st_dev, st_ino, st_size, st_mtime_ns) -> why, of files unusable by what they are
        self.bad_files: dict[tuple[int, int, int, int], str] = {}
        # name -> inode of each record read with a record last scan (an ended rank's
        # file with the inode it was read with is not read again: `settled`)
        self.read_inodes: dict[str, int] = {}
        self.listed = True  # the last listing succeeded: a name missing from it is gone

    def mark_bad(self, path: str, st: os.stat_result | None, why: str,
                 by_file: bool = True) -> None:
        """The caller found this record unusable for good (say, forged): skip it until
        the name holds another file. `by_file`: the verdict is the file's, whatever
        its name (not so for a copy: the name is the fault, not the file)."""
        if st is not None:
            self.bad[os.path.basename(path)] = (st.st_ino, why, by_file)
            if by_file:
                self.bad_files[_file_key(st)] = why

    def known_bad(self, name: str, st: os.stat_result) -> bool:
        """Is the file under `name` (as lstat gave it) known unusable for good?"""
        known = self.bad.get(name)
        return (known is not None and known[0] == st.st_ino) or _file_key(st) in self.bad_files

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

    def _forget(self, inodes: dict[str, int]) -> None:
        """Drop what is known of names and files no longer in the directory."""
        self.bad = {n: v for n, v in self.bad.items() if inodes.get(n) == v[0]}
        present = set(inodes.values())
        self.bad_files = {k: v for k, v in self.bad_files.items() if k[1] in present}
        self.read_inodes = {n: i for n, i in self.read_inodes.items() if inodes.get(n) == i}

    def read(self, watched: Collection[str] = (), all_files: bool = False,
             settled: Collection[str] = ()) -> Iterator[Listed]:
        """Every usable record and every newly unusable file, within this scan's budget.

        `watched` are the paths of records already known: always read. `settled`
        are the paths of ranks that ended: not read again while their name holds the
        file last read there. A file known unusable (see `bad`, `bad_files`) is passed
        over, a name of one found unusable by what it is (another hard link to it, a
        rename) without even an `lstat`, and only yielded again with `all_files`. The
        others are opened at most `max_reads` a scan, at most `max_reads_per_uid` of
        each owner's, the owners taken in turn and each owner's newest and oldest
        (by mtime) by turns: no order, number or age of one user's names delays
        another's. A file that vanished between the listing and the read is left out.
        """
        inodes = self._list()
        self._forget(inodes)
        # Inodes still under a name found unusable by what the file is: any other
        # name of one of them is that same file (an inode listed is not reused).
        bad_inodes = {ino: why for ino, why, by_file in self.bad.values() if by_file}
        queues: dict[int, list[tuple[int, str, os.stat_result]]] = {}
        # By name: a scan of thousands of names joins a path only for those it reads.
        watched_names = {os.path.basename(p) for p in watched}
        settled_names = {os.path.basename(p) for p in settled}
        first = [name for name in watched_names if name in inodes]
        for name, ino in inodes.items():
            if name in watched_names:
                continue
            known = self.bad.get(name)
            if known is not None:
                if all_files:
                    yield Listed(os.path.join(self.directory, name), None, known[1], None)
                continue
            if name in settled_names and self.read_inodes.get(name) == ino:
                continue
            why = bad_inodes.get(ino)
            if why is not None:  # another name (a hard link) of a file known unusable
                self.bad[name] = (ino, why, True)
                if all_files:
                    yield Listed(os.path.join(self.directory, name), None, why, None)
                continue
            path = os.path.join(self.directory, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            why = self.bad_files.get(_file_key(st))
            if why is not None:  # a new name of a file known unusable: a rename
                self.bad[name] = (st.st_ino, why, True)
                bad_inodes[st.st_ino] = why
                if all_files:
                    yield Listed(path, None, why, None)
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size not in RECORD_SIZES:
                listed = self._take(path, st)  # no open: unusable by its type or size
                if listed is not None:
                    bad_inodes[st.st_ino] = listed.why
                    yield listed
                continue
            queues.setdefault(st.st_uid, []).append((st.st_mtime_ns, path, st))
        for name in first:
            path = os.path.join(self.directory, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            listed = self._take(path, st)
            if listed is not None:
                yield listed
        left = sum(map(len, queues.values()))
        for path, st in _in_turn(queues, self.max_reads, self.max_reads_per_uid):
            left -= 1
            why = self.bad_files.get(_file_key(st))
            if why is not None:  # another name of a file found unusable this scan
                self.bad[os.path.basename(path)] = (st.st_ino, why, True)
                continue
            listed = self._take(path, st)
            if listed is not None:
                yield listed
        if left:
            log.warning("%d files of %s left for the next scans (at most %d opened per scan, "
                        "%d of each owner's)", left, self.directory, self.max_reads,
                        self.max_reads_per_uid)

    def _take(self, path: str, st: os.stat_result) -> Listed | None:
        """One file read: its record, or why it is unusable (remembered when it lasts)."""
        rec, why, st2, lasting = _examine(path, st)
        if rec is None and why and lasting:
            self.mark_bad(path, st2, why)
        if rec is not None and st2 is not None:
            self.read_inodes[os.path.basename(path)] = st2.st_ino
        if rec is not None or why:
            return Listed(path, rec, why, st2)
        return None


def _file_key(st: os.stat_result) -> tuple[int, int, int, int]:
    """A file by what it is, not its name: device, inode, size and mtime (a changed
    file, or a new one given a freed inode, is another)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _in_turn(queues: dict[int, list[tuple[int, str, os.stat_result]]], limit: int,
             per_uid: int) -> Iterator[tuple[str, os.stat_result]]:
    """(path, stat) of at most `limit` files, at most `per_uid` of each owner's, the
    owners in turn (uid order); each owner's newest and oldest by turns: a new rank
    is its owner's newest file, read at once whatever his own backlog, and every
    file of the backlog is read within (files older than it) / (per_uid / 2) scans."""
    ordered = [_both_ends(sorted(q, key=lambda item: (item[0], item[1])), per_uid)
               for _, q in sorted(queues.items())]
    taken = 0
    for round_ in range(per_uid):
        for queue in ordered:
            if round_ < len(queue):
                if taken >= limit:
                    return
                taken += 1
                yield queue[round_][1], queue[round_][2]


def _both_ends(files: list[tuple[int, str, os.stat_result]], count: int
               ) -> list[tuple[int, str, os.stat_result]]:
    """At most `count` of `files` (oldest first): the newest, the oldest, the next
    newest, the next oldest..."""
    if len(files) <= count:
        return files[::-1]
    return [files[-1 - i // 2] if i % 2 == 0 else files[i // 2] for i in range(count)]


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
    return RecordDir(directory, ONE_PASS_READS, ONE_PASS_READS).read(all_files=True)


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
