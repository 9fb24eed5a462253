"""The rank record: one fixed-size binary file per rank process.

This module owns every byte of the record; `docs/record-format.md` mirrors
this docstring. The rank maps the file with `mmap` and is its only writer;
the daemon and the CLI read it with `pread` and never write.

All integers are little-endian. Offsets are in bytes. Size: 4096.

    region    offset  struct  field
    identity       0  8s      magic  b"MLXWDREC"
                   8  H       version (RECORD_VERSION)
                  10  H       reserved (0)
                  12  I       record size (4096)
                  16  q       pid
                  24  d       process start time (psutil create_time, epoch s)
                  32  I       uid of the writer
                  36  i       rank (-1 until known)
                  40  i       world size (0 until known)
                  44  i       dump signal number (0: none)
                  48  I       status: 0 open, 1 closed cleanly, 2 closed on error
                  52  I       reserved (0)
                  56  64s     host (UTF-8, NUL padded)
                 120  64s     job id
                 184  16s     backend ("ring", "jaccl", ...)
    seq          200  Q       sequence counter: odd while the writer is writing
    hot          208  Q       collectives issued
                 216  Q       waits entered
                 224  Q       waits completed (progress)
                 232  Q       user steps (hb.step)
                 240  Q       phase (states.Phase)
                 248  Q       op waited on (index into OPS)
                 256  Q       phase since (CLOCK_MONOTONIC ns)
                 264  Q       current wait started (monotonic ns, 0: none)
                 272  Q       last progress (monotonic ns)
                 280  Q       duration of the last completed wait (ns)
                 288  Q       longest completed wait, init/idle/expect excluded (ns)
    expect       296  d       expect window seconds (0: none)
                 304  Q       expect window started (monotonic ns)
                 312  48s     expect reason
    threads      384  Q       Python threads: bit 32 set once published, bit 33
                              set when they outnumber the slots, low bits: count
                 392  15Q     their native thread ids (threading.get_native_id),
                              the main thread excluded
    flight       512  64 entries of 32 bytes, entry i = collective number % 64:
                   +0 Q       collective number (1-based; 0: empty slot)
                   +8 Q       issued at (monotonic ns)
                  +16 Q       bytes
                  +24 H       op (index into OPS)
                  +26 H       dtype (index into DTYPES)
                  +28 I       reserved (0)

The hot region is all 8-byte words, 8-byte aligned, so the rank's hot path
updates single words through a memoryview (each an atomic aligned store)
instead of packing whole structs.

Consistency: the writer makes `seq` odd, writes, then makes it even. A reader
copies the whole record, re-reads `seq`, and accepts the copy only when both
reads agree and are even; otherwise it retries and gives up after a bound with
`RecordBusy`. Monotonic times are CLOCK_MONOTONIC, shared by every process of
the host, so the daemon can subtract them from its own clock.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import struct
import sys
import time
from dataclasses import dataclass

from .states import Phase

# Where ranks publish and the daemon looks, unless MLX_WATCHDOG_DIR / --dir say otherwise.
DEFAULT_DIR = "/var/run/mlx-watchdog" if sys.platform == "darwin" else "/run/mlx-watchdog"

MAGIC = b"MLXWDREC"
RECORD_VERSION = 1
RECORD_SIZE = 4096
SUFFIX = ".rec"
FLIGHT_SLOTS = 64
THREAD_SLOTS = 15
THREADS_PUBLISHED = 1 << 32
THREADS_OVERFLOW = 1 << 33

OPS = (
    "",
    "eval",
    "synchronize",
    "item",
    "tolist",
    "bool",
    "int",
    "float",
    "init",
    "all_sum",
    "all_gather",
    "all_max",
    "all_min",
    "sum_scatter",
    "send",
    "recv",
    "recv_like",
)
OP_CODE = {name: code for code, name in enumerate(OPS)}

DTYPES = (
    "",
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "complex64",
)
DTYPE_CODE = {name: code for code, name in enumerate(DTYPES)}

STATUS_OPEN, STATUS_CLOSED, STATUS_ERROR = 0, 1, 2

IDENTITY = struct.Struct("<8sHHIqdIiiiII64s64s16s")
SEQ = struct.Struct("<Q")
HOT = struct.Struct("<11Q")
EXPECT = struct.Struct("<dQ48s")
ENTRY = struct.Struct("<QQQHHI")

IDENTITY_OFFSET = 0
SEQ_OFFSET = 200
HOT_OFFSET = 208
EXPECT_OFFSET = 296
THREADS_OFFSET = 384
FLIGHT_OFFSET = 512
STATUS_OFFSET = 48
THREADS = struct.Struct(f"<{1 + THREAD_SLOTS}Q")

assert IDENTITY.size == SEQ_OFFSET
assert HOT_OFFSET + HOT.size == EXPECT_OFFSET and SEQ_OFFSET + SEQ.size == HOT_OFFSET
assert EXPECT_OFFSET + EXPECT.size <= THREADS_OFFSET
assert THREADS_OFFSET + THREADS.size == FLIGHT_OFFSET
assert FLIGHT_OFFSET + FLIGHT_SLOTS * ENTRY.size <= RECORD_SIZE

# Word indices (offset / 8) of the hot region, for `RecordWriter.words`.
W_SEQ = SEQ_OFFSET // 8
(W_COLLECTIVES, W_ENTERED, W_COMPLETED, W_STEPS, W_PHASE, W_OP, W_PHASE_SINCE, W_WAIT_SINCE,
 W_LAST_PROGRESS, W_LAST_WAIT, W_MAX_WAIT) = range(HOT_OFFSET // 8, HOT_OFFSET // 8 + 11)
W_THREADS = THREADS_OFFSET // 8
W_FLIGHT = FLIGHT_OFFSET // 8
ENTRY_WORDS = ENTRY.size // 8

READ_ATTEMPTS = 200
# A writer holds `seq` odd for about a microsecond; one preempted mid-write
# holds it for a scheduler slice. Past this, the reader gives up (RecordBusy
# with the last copy), so a stopped rank or a forged odd `seq` costs a scan
# milliseconds, not a tenth of a second per file.
READ_PATIENCE = 0.005


class RecordError(Exception):
    """A file in the record directory that is not a usable record."""


class RecordBusy(RecordError):
    """The writer kept the record mid-write for every read attempt.

    That happens when the rank was stopped (SIGSTOP, a debugger) or died in
    the middle of a write. `last` is the final copy read: its identity is
    sound (written only at start and init) and each hot word is whole, but
    the words may disagree with each other; `decode` reads it.
    """

    def __init__(self, message: str, last: bytes = b"") -> None:
        super().__init__(message)
        self.last = last


@dataclass(frozen=True)
class Collective:
    number: int
    op: str
    dtype: str
    nbytes: int
    issued_ns: int


@dataclass(frozen=True)
class Record:
    pid: int
    start_time: float
    uid: int
    rank: int
    world_size: int
    dump_signal: int
    status: int
    host: str
    job: str
    backend: str
    seq: int
    collectives: int
    waits_entered: int
    waits_completed: int
    steps: int
    phase: Phase
    op: str
    phase_since_ns: int
    wait_since_ns: int
    last_progress_ns: int
    last_wait_ns: int
    max_wait_ns: int
    expect_seconds: float
    expect_since_ns: int
    expect_reason: str
    flight: tuple[Collective, ...]  # oldest first
    # Native ids of the rank's Python threads other than the main one; None when
    # the writer does not publish them (an older hook). See docs/record-format.md.
    python_threads: tuple[int, ...] | None = None
    python_threads_overflow: bool = False  # more threads than slots: the table is partial

    @property
    def closed(self) -> bool:
        return self.status != STATUS_OPEN


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def _field(text: str, size: int) -> bytes:
    """Encode to at most `size` bytes without splitting a UTF-8 sequence."""
    return text.encode("utf-8")[:size].decode("utf-8", "ignore").encode("utf-8")


def _name(table: tuple[str, ...], code: int) -> str:
    return table[code] if 0 <= code < len(table) else f"?{code}"


def decode(buf: bytes) -> Record:
    """Decode one consistent copy of a record, or raise `RecordError`."""
    if len(buf) != RECORD_SIZE:
        raise RecordError(f"size {len(buf)}, expected {RECORD_SIZE}")
    (magic, version, _, size, pid, start_time, uid, rank, world_size, dump_signal,
     status, _, host, job, backend) = IDENTITY.unpack_from(buf, IDENTITY_OFFSET)
    if magic != MAGIC:
        raise RecordError("not an mlx-watchdog record (bad magic)")
    if version != RECORD_VERSION:
        raise RecordError(f"record version {version}; this build reads {RECORD_VERSION}")
    if size != RECORD_SIZE:
        raise RecordError(f"record says size {size}, expected {RECORD_SIZE}")
    if pid <= 0:
        raise RecordError(f"corrupt record (pid {pid})")
    (seq,) = SEQ.unpack_from(buf, SEQ_OFFSET)
    (collectives, entered, completed, steps, phase, op, phase_since, wait_since,
     last_progress, last_wait, max_wait) = HOT.unpack_from(buf, HOT_OFFSET)
    if phase not in Phase._value2member_map_:
        raise RecordError(f"corrupt record (phase {phase})")
    expect_seconds, expect_since, expect_reason = EXPECT.unpack_from(buf, EXPECT_OFFSET)
    if not expect_seconds >= 0.0:  # also rejects NaN
        raise RecordError("corrupt record (expect window)")
    entries = []
    for slot in range(FLIGHT_SLOTS):
        number, issued, nbytes, op_code, dtype, _ = ENTRY.unpack_from(
            buf, FLIGHT_OFFSET + slot * ENTRY.size)
        if number:
            entries.append(Collective(number, _name(OPS, op_code), _name(DTYPES, dtype),
                                      nbytes, issued))
    entries.sort(key=lambda c: c.number)
    head, *tids = THREADS.unpack_from(buf, THREADS_OFFSET)
    python_threads = (tuple(tids[: min(head & 0xFFFF, THREAD_SLOTS)])
                      if head & THREADS_PUBLISHED else None)
    return Record(
        pid=pid, start_time=start_time, uid=uid, rank=rank, world_size=world_size,
        dump_signal=dump_signal, status=status, host=_text(host), job=_text(job),
        backend=_text(backend), seq=seq, collectives=collectives, waits_entered=entered,
        waits_completed=completed, steps=steps, phase=Phase(phase), op=_name(OPS, op),
        phase_since_ns=phase_since, wait_since_ns=wait_since, last_progress_ns=last_progress,
        last_wait_ns=last_wait, max_wait_ns=max_wait, expect_seconds=expect_seconds,
        expect_since_ns=expect_since, expect_reason=_text(expect_reason),
        flight=tuple(entries), python_threads=python_threads,
        python_threads_overflow=bool(head & THREADS_OVERFLOW),
    )


def read_fd(fd: int, attempts: int = READ_ATTEMPTS, patience: float = READ_PATIENCE) -> Record:
    """Read a consistent snapshot from an open record file.

    The magic is checked only on a consistent copy: `struct.pack_into` zeroes
    a region before filling it, so `set_identity` blanks it mid-write.
    """
    give_up = time.monotonic() + patience
    for attempt in range(attempts):
        buf = os.pread(fd, RECORD_SIZE, 0)
        if len(buf) != RECORD_SIZE:
            raise RecordError(f"truncated record ({len(buf)} bytes)")
        (seq,) = SEQ.unpack_from(buf, SEQ_OFFSET)
        if seq % 2 == 0 and os.pread(fd, SEQ.size, SEQ_OFFSET) == buf[SEQ_OFFSET:HOT_OFFSET]:
            return decode(buf)
        if attempt > 10:
            if time.monotonic() > give_up:
                break
            time.sleep(0.0002)
    raise RecordBusy(f"record stayed mid-write for {attempt + 1} reads", buf)


def read_path(path: str) -> Record:
    """Open without following links, check it is a regular file, and read it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise RecordError(f"cannot open: {err.strerror}") from err
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RecordError("not a regular file")
        return read_fd(fd)
    except OSError as err:
        raise RecordError(f"cannot read: {err.strerror}") from err
    finally:
        os.close(fd)


class RecordWriter:
    """The rank's side: creates the file, maps it, publishes under the seqlock."""

    def __init__(self, path: str, *, pid: int, start_time: float, uid: int, host: str,
                 job: str, rank: int, world_size: int, backend: str, dump_signal: int) -> None:
        # Built under a name the daemon does not read, then renamed into place:
        # a reader never sees a record without its identity.
        staging = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.new")
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
        self.words = memoryview(self._map).cast("Q")  # the hot path writes words
        self._identity = dict(pid=pid, start_time=start_time, uid=uid, host=host, job=job,
                              backend=backend, dump_signal=dump_signal)
        self.set_identity(rank=rank, world_size=world_size)
        now = time.monotonic_ns()
        self.words[W_PHASE], self.words[W_PHASE_SINCE] = int(Phase.RUNNING), now
        self.words[W_LAST_PROGRESS] = now
        try:
            os.rename(staging, path)
        except BaseException:
            self.words.release()
            self._map.close()
            os.unlink(staging)
            raise

    def set_identity(self, *, rank: int, world_size: int, backend: str | None = None,
                     job: str | None = None) -> None:
        ident = self._identity
        if backend is not None:
            ident["backend"] = backend
        if job is not None:
            ident["job"] = job
        self.begin()
        IDENTITY.pack_into(
            self._map, IDENTITY_OFFSET, MAGIC, RECORD_VERSION, 0, RECORD_SIZE, ident["pid"],
            ident["start_time"], ident["uid"], rank, world_size, ident["dump_signal"],
            STATUS_OPEN, 0, _field(str(ident["host"]), 64), _field(str(ident["job"]), 64),
            _field(str(ident["backend"]), 16))
        self.end()

    # The seqlock. `begin` and `end` bracket every write.
    def begin(self) -> None:
        self.words[W_SEQ] += 1

    def end(self) -> None:
        self.words[W_SEQ] += 1

    def write_hot(self, *values: int) -> None:
        """Write the hot region (HOT's fields in order) between begin and end."""
        HOT.pack_into(self._map, HOT_OFFSET, *values)


    def write_entry(self, number: int, issued_ns: int, nbytes: int, op: int, dtype: int) -> None:
        ENTRY.pack_into(self._map, FLIGHT_OFFSET + (number % FLIGHT_SLOTS) * ENTRY.size,
                        number, issued_ns, nbytes, op, dtype, 0)

    def write_expect(self, seconds: float, since_ns: int, reason: str) -> None:
        EXPECT.pack_into(self._map, EXPECT_OFFSET, seconds, since_ns, _field(reason, 48))

    def close(self, status: int, *, remove: bool = True) -> None:
        """Mark the record closed, unmap it and (by default) remove the file."""
        self.begin()
        struct.pack_into("<I", self._map, STATUS_OFFSET, status)
        self.end()
        self.words.release()
        self._map.close()
        if remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
