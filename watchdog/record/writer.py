"""Writing a record (version 3): created under a staging name, mapped, published.

The rank's hot path writes its thread's slot through `slot(k)` with no lock;
this class owns the rest: the identity, the cold words under the seqlock, and
the close.
"""

from __future__ import annotations

import errno
import mmap
import os
import time

from watchdog.record.layout import (
    EXPECT,
    EXPECT_OFFSET,
    IDENTITY,
    IDENTITY_OFFSET,
    MAGIC,
    PY_THREAD_SLOTS,
    RECORD_SIZE,
    RECORD_VERSION,
    SLOT_WORDS,
    STATUS,
    STATUS_OFFSET,
    STATUS_OPEN,
    THREADS,
    THREADS_OFFSET,
    THREADS_OVERFLOW,
    THREADS_PUBLISHED,
    TICKS,
    TICKS_OFFSET,
    W_CREATED,
    W_IDLE_ENDED,
    W_IDLE_SINCE,
    W_SEQ,
    WORKLOAD,
    WORKLOAD_OFFSET,
    encode_text,
    slot_base,
    staging_path,
)


class RecordWriter:
    """The rank's side of version 3: creates the file, maps it, hands out thread slots.

    The rank's hot path writes a thread's slot through `slot(k)` (a view of its
    words) with no lock; identity and cold words go under the seqlock
    (`begin`/`end`, which nest). `write_hot` and `write_entry` publish a whole
    state into slot 0 at once, for synthetic records (tests, benchmarks).
    """

    def __init__(self, path: str, *, pid: int, start_time: float, uid: int, host: str,
                 job: str, rank: int, world_size: int, backend: str, dump_signal: int,
                 start_ticks: int = 0, workload: str = "") -> None:
        # Built under a name the daemon does not read, then renamed into place:
        # a reader never sees a record without its identity.
        staging = staging_path(path)
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            # Allocate the blocks now: on a full disk this fails here, with an error,
            # instead of killing the rank with SIGBUS at its first store into the map.
            if os.pwrite(fd, bytes(RECORD_SIZE), 0) != RECORD_SIZE:
                raise OSError(errno.ENOSPC, "short write allocating the record")
            self._map = mmap.mmap(fd, RECORD_SIZE, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(staging)
            raise
        os.close(fd)
        self.path = path
        self.words = memoryview(self._map).cast("Q")
        self._views: list[memoryview] = []
        self._depth = 0  # nesting of begin/end (a signal handler may publish inside one)
        self._identity = dict(pid=pid, start_time=start_time, uid=uid, host=host, job=job,
                              backend=backend, dump_signal=dump_signal)
        TICKS.pack_into(self._map, TICKS_OFFSET, start_ticks)  # before publishing: never changes
        WORKLOAD.pack_into(self._map, WORKLOAD_OFFSET, encode_text(workload, WORKLOAD.size))
        self.set_identity(rank=rank, world_size=world_size)
        self.words[W_CREATED] = time.monotonic_ns()
        try:
            os.rename(staging, path)
        except BaseException:
            self.words.release()
            self._map.close()
            os.unlink(staging)
            raise

    def slot(self, k: int) -> memoryview:
        """The words of thread slot `k`, for its one writer."""
        base = slot_base(k)
        view = self.words[base:base + SLOT_WORDS]
        self._views.append(view)
        return view

    def set_identity(self, *, rank: int, world_size: int, backend: str | None = None,
                     job: str | None = None) -> None:
        """Write the rank's group identity (rank, size, backend, job) under the seqlock."""
        ident = self._identity
        if backend is not None:
            ident["backend"] = backend
        if job is not None:
            ident["job"] = job
        self.begin()
        try:
            IDENTITY.pack_into(
                self._map, IDENTITY_OFFSET, MAGIC, RECORD_VERSION, 0, RECORD_SIZE,
                ident["pid"], ident["start_time"], ident["uid"], rank, world_size,
                ident["dump_signal"], STATUS_OPEN, 0, encode_text(str(ident["host"]), 64),
                encode_text(str(ident["job"]), 64), encode_text(str(ident["backend"]), 16))
        finally:
            self.end()

    # The seqlock of the identity and cold words; nested calls keep `seq` odd.
    def begin(self) -> None:
        """Open a seqlock write (nested writes keep the word odd)."""
        if not self._depth:
            self.words[W_SEQ] += 1
        self._depth += 1

    def end(self) -> None:
        """Close a seqlock write: the word even again after the outermost."""
        self._depth -= 1
        if not self._depth:
            self.words[W_SEQ] += 1

    def write_idle(self, since: int, ended: int) -> None:
        """Idle since `since` (0: not idle); `ended`: when idle last ended. Cold."""
        self.words[W_IDLE_SINCE] = since
        self.words[W_IDLE_ENDED] = ended

    def write_threads(self, native_ids: list[int]) -> None:
        """The table of Python threads (main excluded). Cold: call between begin/end."""
        head = THREADS_PUBLISHED | min(len(native_ids), PY_THREAD_SLOTS)
        if len(native_ids) > PY_THREAD_SLOTS:
            head |= THREADS_OVERFLOW
        ids = (native_ids + [0] * PY_THREAD_SLOTS)[:PY_THREAD_SLOTS]
        THREADS.pack_into(self._map, THREADS_OFFSET, head, *ids)

    def write_expect(self, seconds: float, since_ns: int, reason: str) -> None:
        """Write the `hb.expect` window: its seconds, start and reason (48 bytes at most)."""
        EXPECT.pack_into(self._map, EXPECT_OFFSET, seconds, since_ns, encode_text(reason, 48))

    def close(self, status: int, *, remove: bool = True) -> None:
        """Mark the record closed, unmap it and (by default) remove the file."""
        self.begin()
        STATUS.pack_into(self._map, STATUS_OFFSET, status)
        self.end()
        for view in self._views:
            view.release()
        self.words.release()
        self._map.close()
        if remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
