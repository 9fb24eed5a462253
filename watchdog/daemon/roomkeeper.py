"""Room in the record directory for every user's next rank.

The directory is shared and world-writable (sticky): one user filling its
filesystem would leave every other user's new ranks uninstrumented ("[Errno 28]")
and their hangs unseen. Each scan the daemon looks at the free space (one
`statvfs`); below `reserve` it removes what no rank needs, largest first, until
the reserve is back: files that are not records (any name but a record, a
staging record, a stack dump or the daemon's pointer), records of a size no
record has, files of a record's size the reader found unusable for good by what
they are (junk of the exact size, a forged record: `unusable`; never a copy,
whose fault is its name, nor a file of several links), and stack dumps past
what a dump needs (truncated, not removed: the rank holds its dump file open).
The keeper runs as root: it writes (truncates) only a file proven a rank's dump
(one link, owned by the uid owning the record beside it, never root's); any
other file it only unlinks, so a hard link to a file of another owner planted
here costs that file nothing. Never a link's target, never a directory, and
each removal logged.

This bounds a fill the daemon sees; a user who keeps writing can still race a
rank's start. For a hard bound the directory gets its own filesystem with a
per-user quota (docs/operations.md: Linux tmpfs `usrquota`, macOS a volume of
its own).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from watchdog.daemon.store.journal import POINTER
from watchdog.record import layout

log = logging.getLogger(__name__)

RESERVE_BYTES = 4 << 20  # ~170 records' worth, or an eighth of a small filesystem
DUMP_KEEP_BYTES = 4 << 20  # a faulthandler dump of many threads is tens of kB
MAX_ENTRIES_PER_SCAN = 4096  # looked at per scan below the reserve, as the reader's cap
HOLDERS_EVERY = 30.0  # seconds between looks for who holds a full directory's space


class Room(NamedTuple):
    """What one look at the record directory's free space found and freed."""
    free: int  # bytes an unprivileged writer may use, when looked at
    reserve: int  # what is kept for ranks
    freed: int  # by this call
    looked: int  # entries looked at


def _free(directory: str) -> tuple[int, int]:
    """(free bytes an unprivileged writer may use, the filesystem's size)."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def reserve_for(size: int) -> int:
    """The free space to keep on a file system of `size` bytes."""
    return max(256 << 10, min(RESERVE_BYTES, size // 8))


def _kind(name: str) -> str:
    if name == POINTER:
        return "pointer"
    if name.endswith(layout.STACKS_SUFFIX):
        return "dump"
    if name.endswith(layout.SUFFIX) or (name.startswith(".") and name.endswith(".rec.new")):
        return "record"
    return "junk"


def _truncate(path: str) -> bool:
    """Empty the dump at `path` if it is proven a rank's: a regular file of one link
    (a hard link to another file, even one its linker may not write, is no dump),
    owned by the uid that owns the record beside it, and not root's. False, and
    nothing written, when it is not (the caller unlinks the entry instead)."""
    try:
        record = os.stat(path[: -len(layout.STACKS_SUFFIX)] + layout.SUFFIX,
                         follow_symlinks=False)
    except OSError:
        return False  # no rank's record beside it: no rank's dump
    # O_RDONLY first: nothing is opened for writing before it is proven (a fifo or
    # a device never blocks the scan: O_NONBLOCK).
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid != 0
                and stat.S_ISREG(record.st_mode) and record.st_uid == st.st_uid):
            return False
        # The file checked is the one truncated: opened again for writing, it must
        # be the same file (device, inode), still of one link.
        wfd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            again = os.fstat(wfd)
            if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) \
                    or again.st_nlink != 1:
                return False
            os.ftruncate(wfd, 0)
            return True
        finally:
            os.close(wfd)
    finally:
        os.close(fd)


def keep_room(directory: str, entries: Iterator[os.DirEntry[str]] | None = None,
              limit: int | None = None,
              unusable: Callable[[str, os.stat_result], bool] | None = None) -> Room | None:
    """Below the reserve: free it as above. `entries` (default: the whole directory)
    are looked at, at most `limit` of them; `unusable(name, lstat)` says a file of a
    record's size is one the reader found unusable for good (junk of the exact size,
    a forged record): freed as junk. The room found and the bytes freed; None
    when the filesystem cannot be read."""
    try:
        free, size = _free(directory)
    except OSError:
        return None
    reserve = reserve_for(size)
    if free >= reserve:
        return Room(free, reserve, 0, 0)
    candidates: list[tuple[int, str, str, int]] = []  # (bytes, path, what, owner)
    listing = entries if entries is not None else _entries(directory)
    looked = 0
    for entry in listing:
        looked += 1
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue  # a link or a directory costs (almost) nothing; never followed
        used = st.st_blocks * 512
        kind = _kind(entry.name)
        if kind == "junk":
            candidates.append((used, entry.path, "remove", st.st_uid))
        elif kind == "record" and (st.st_size not in layout.SIZES.values() or (
                unusable is not None and unusable(entry.name, st))):
            candidates.append((used, entry.path, "remove", st.st_uid))
        elif kind == "dump" and used > DUMP_KEEP_BYTES:
            # Written to only when proven a rank's dump (_truncate); else unlinked.
            candidates.append((used, entry.path, "truncate", st.st_uid))
        if limit is not None and looked >= limit:
            break
    freed = 0
    for used, path, what, owner in sorted(candidates, reverse=True):
        if free + freed >= reserve:
            break
        try:
            if what == "remove" or not _truncate(path):
                what = "remove"
                os.unlink(path)
        except OSError as err:
            log.warning("cannot free %s in the record directory: %s", path, err)
            continue
        freed += used
        log.warning("record directory %s nearly full (%d KiB free, %d KiB kept for ranks): "
                    "%s %s of uid %s (%d KiB), not a record", directory, free >> 10,
                    reserve >> 10, "removed" if what == "remove" else "truncated", path, owner,
                    used >> 10)
    return Room(free, reserve, freed, looked)


def _entries(directory: str) -> Iterator[os.DirEntry[str]]:
    """The directory's entries, listed as they are taken (closed at the end)."""
    try:
        with os.scandir(directory) as listing:
            yield from listing
    except OSError as err:
        log.warning("cannot list %s to free room: %s", directory, err)


class Keeper:
    """The room keeper at each scan: at most MAX_ENTRIES_PER_SCAN entries looked at,
    the next scan resuming where the last stopped (a directory of 200,000 entries
    costs each scan a bounded share); and a directory below the reserve that a whole
    pass could not free, reported (`full`: why, with the uids holding the space when
    they can be found; "" while there is room), and logged once per change."""

    def __init__(self, directory: str, holders: Callable[[str], dict[int, int] | None],
                 limit: int = MAX_ENTRIES_PER_SCAN, *,
                 clock: Callable[[], float] = time.monotonic,
                 unusable: Callable[[str, os.stat_result], bool] | None = None) -> None:
        self.directory, self.holders, self.limit = directory, holders, limit
        self.unusable = unusable  # the reader's verdict on a file of a record's size
        self.clock = clock  # monotonic seconds (daemon/clock.py): when holders were looked for
        self.full = ""
        self._pass: Iterator[os.DirEntry[str]] | None = None  # a pass under way
        self._pass_freed = 0
        self._told = ""  # what the last log line said holds the space
        self._held: dict[int, int] | None = None  # uid -> bytes, as last looked for
        self._held_at: float | None = None

    def keep(self) -> str:
        """One scan's share of the work; why the directory is full and stays so, or ""."""
        if self._pass is None:
            self._pass = _entries(self.directory)  # opened only when looked at
            self._pass_freed = 0
        room = keep_room(self.directory, self._pass, self.limit, self.unusable)
        if room is None:
            return self.full
        self._pass_freed += room.freed
        ended = room.looked < self.limit or room.free >= room.reserve
        if ended:
            self._pass = None
        if room.free + room.freed >= room.reserve:
            if self.full:
                log.warning("record directory %s has room again", self.directory)
            self.full, self._told = "", ""
        elif ended and self._pass_freed == 0:
            self._report(room)
        return self.full

    def _report(self, room: Room) -> None:
        now = self.clock()
        if self._held_at is None or now - self._held_at >= HOLDERS_EVERY:
            self._held, self._held_at = self.holders(self.directory), now
        held = self._held
        by = ""
        if held:
            by = "; held by " + ", ".join(f"uid {uid} ({used >> 10} KiB)" for uid, used in
                                          sorted(held.items(), key=lambda kv: -kv[1]))
            by += " in deleted files still open"
        elif held is None:
            by = "; who holds the space cannot be found on this OS"
        self.full = (f"record directory {self.directory} full: {room.free >> 10} KiB free, "
                     f"below the {room.reserve >> 10} KiB kept for ranks, and nothing in it "
                     f"left to free: new ranks cannot publish their records and go "
                     f"unwatched{by}")
        told = ",".join(str(uid) for uid in sorted(held or {}))
        if told != self._told or not self._told:
            log.error("%s", self.full)
            self._told = told or "-"
