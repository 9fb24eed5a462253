"""The rank record: one fixed-size binary file per rank process.

This module owns every byte of the record; `docs/record-format.md` mirrors
this docstring. The rank maps the file with `mmap` and is its only writer;
the daemon and the CLI read it with `pread` and never write. The writer
writes version 2; the reader reads versions 1 and 2 (a rank started before
an upgrade keeps being watched).

All integers are little-endian. Offsets are in bytes. Size: 16384 (v2),
4096 (v1).

    region    offset  struct  field
    identity       0  8s      magic  b"MLXWDREC"
                   8  H       version (2)
                  10  H       reserved (0)
                  12  I       record size (16384)
                  16  q       pid
                  24  d       process start time (psutil create_time, epoch s)
                  32  I       uid of the writer
                  36  i       rank (-1 until known)
                  40  i       world size (0 until known)
                  44  i       dump signal number (0: none)
                  48  I       status: 0 open, 1 closed cleanly, 2 closed on error,
                              3 abandoned by the hook after an internal error
                  52  I       reserved (0)
                  56  64s     host (UTF-8, NUL padded)
                 120  64s     job id
                 184  16s     backend ("ring", "jaccl", ...)
    cold         200  Q       seq: odd while identity or cold words are written
                 208  Q       created (CLOCK_MONOTONIC ns)
                 216  Q       idle since (monotonic ns; 0: not idle)
                 224  Q       idle ended (monotonic ns; 0: never idle)
                 232  d       expect window seconds (0: none)
                 240  Q       expect window started (monotonic ns)
                 248  48s     expect reason
    identity     360  Q       process start in clock ticks since boot (Linux
                              /proc/<pid>/stat field 22; 0: unknown, e.g. macOS);
                              the same offset in version 1
    slots        512  13 thread slots of 1136 bytes, slot k at 512 + 1136 k,
                      each written by one thread only (no lock):
                   +0 Q       owner: native thread id (0: never used)
                   +8 Q       open wait since (monotonic ns; 0: not in a wait)
                  +16 Q       op of that wait (index into OPS)
                  +24 Q       reserved (0; waits entered = completed + 1 in a wait)
                  +32 Q       waits completed (progress)
                  +40 Q       last completed wait at (monotonic ns)
                  +48 Q       duration of the last completed wait (ns)
                  +56 Q       longest completed wait, init/idle/expect excluded (ns)
                  +64 Q       user steps (hb.step)
                  +72 Q       collectives issued (n: the slot's flight commit word)
                  +80 16s     reserved (0)
                  +96 65 flight entries of 16 bytes, collective n of the slot
                      at entry n % 65:
                        +0 Q  issued at (monotonic ns)
                        +8 Q  bytes << 16 | dtype << 8 | op

Hot words are single aligned 8-byte words (one store each) and every
counter only grows. The hot path writes its own thread's slot with no lock:
data words first, then the word that commits them (`open wait since` for a
wait, the collective count for a flight entry). A reader copies the record
twice: the identity and cold words are valid when `seq` was even and equal
in both copies (a seqlock, for the rare cold writes); a flight entry n is
valid when n <= the count in the first copy and n > the count in the
second copy - 65 + 1 (its entry was not being rewritten). Everything else is
derived (see `decode`), so no state a writer can be stopped in reads as
torn. Monotonic times are CLOCK_MONOTONIC, shared by every process of the
host, so the daemon can subtract them from its own clock.

Version 1 (4096 bytes, one seqlock over everything) is described in
`docs/record-format.md`; only its reader is kept here.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import stat
import struct
import sys
import time
from dataclasses import dataclass

from watchdog.states import Phase

# Where ranks publish and the daemon looks, unless MLX_WATCHDOG_DIR / --dir say otherwise.
DEFAULT_DIR = "/var/run/mlx-watchdog" if sys.platform == "darwin" else "/run/mlx-watchdog"

MAGIC = b"MLXWDREC"
RECORD_VERSION = 2
RECORD_SIZE = 16384
SIZES = {1: 4096, 2: RECORD_SIZE}  # version -> file size; the reader takes either
MAX_SIZE = max(SIZES.values())
SUFFIX = ".rec"
FLIGHT_SLOTS = 64  # collectives a reader gets back

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
    # Appended by the audit of every blocking entry point (docs/coverage.md). Codes are
    # never reused or reordered: an older reader shows a newer code as "?17" and so on.
    "async_eval",
    "complex",
    "index",
    "format",
    "repr",
    "bytes",
    "array",
    "dlpack",
    "getstate",
    "save",
    "savez",
    "savez_compressed",
    "save_safetensors",
    "save_gguf",
    "load",
    "clear_streams",
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

STATUS_OPEN, STATUS_CLOSED, STATUS_ERROR, STATUS_ABANDONED = 0, 1, 2, 3
# Bounds on what a record may claim. Any local user may write one, and these
# integers size ranges and lists downstream (the cluster view lists missing
# ranks): an unbounded world size cost minutes of CPU and gigabytes.
MAX_WORLD_SIZE = 1 << 14
MAX_PID = (1 << 31) - 1  # os.kill and pidfd_open take a C int

IDENTITY = struct.Struct("<8sHHIqdIiiiII64s64s16s")
SEQ = struct.Struct("<Q")
TICKS = struct.Struct("<Q")
TICKS_OFFSET = 360  # both versions: after the cold words (v2) or the expect window (v1)
VERSION = struct.Struct("<H")  # at offset 8 in every version
STATUS = struct.Struct("<I")
IDENTITY_OFFSET = 0
SEQ_OFFSET = 200
STATUS_OFFSET = 48
assert IDENTITY.size == SEQ_OFFSET

# -- version 2 -------------------------------------------------------------------------------

COLD = struct.Struct("<QQQQdQ48s")  # seq, created, idle since, idle ended, expect (3)
EXPECT = struct.Struct("<dQ48s")
EXPECT_OFFSET = 232
SLOTS_OFFSET = 512
THREAD_SLOTS = 13
SLOT_HEADER_WORDS = 12
RING = FLIGHT_SLOTS + 1  # one more than a reader gets back: the entry being rewritten
SLOT_SIZE = SLOT_HEADER_WORDS * 8 + RING * 16
SLOT_WORDS = SLOT_SIZE // 8
SLOT = struct.Struct(f"<{SLOT_HEADER_WORDS}Q{2 * RING}Q")
HOT_OFFSET = SLOTS_OFFSET  # slot 0, where a whole state (`write_hot`) goes
assert SEQ_OFFSET + COLD.size <= TICKS_OFFSET and EXPECT_OFFSET == SEQ_OFFSET + 32
assert TICKS_OFFSET + TICKS.size <= SLOTS_OFFSET
assert SLOT.size == SLOT_SIZE and SLOTS_OFFSET + THREAD_SLOTS * SLOT_SIZE <= RECORD_SIZE

# Word indices of the cold region (into `RecordWriter.words`) and of a slot (into a slot view).
W_SEQ, W_CREATED, W_IDLE_SINCE, W_IDLE_ENDED = (SEQ_OFFSET // 8 + i for i in range(4))
(S_OWNER, S_SINCE, S_OP, _, S_COMPLETED, S_PROGRESS, S_LAST_WAIT, S_MAX_WAIT, S_STEPS,
 S_COLLECTIVES) = range(10)
S_RING = SLOT_HEADER_WORDS  # entry n: words S_RING + 2 (n % RING) and the one after
KIND_SHIFT = 16  # entry word 2: bytes << 16 | dtype << 8 | op

# -- version 1 (read only) -------------------------------------------------------------------

V1_SIZE = SIZES[1]
V1_HOT = struct.Struct("<11Q")
V1_HOT_OFFSET = 208
V1_EXPECT_OFFSET = 296
V1_ENTRY = struct.Struct("<QQQHHI")
V1_FLIGHT_OFFSET = 512

READ_ATTEMPTS = 200
# A v1 writer holds `seq` odd for about a microsecond, a v2 writer only while it
# writes its identity or cold words; one preempted mid-write holds it for a
# scheduler slice. Past this, the reader gives up (RecordBusy with the last
# copy), so a stopped rank or a forged odd `seq` costs a scan milliseconds.
READ_PATIENCE = 0.005
FLIGHT_RETRIES = 20  # v2 reads that may be taken again for a whole flight recorder
_WORD = struct.Struct("<Q")


class RecordError(Exception):
    """A file in the record directory that is not a usable record."""


class RecordBusy(RecordError):
    """The writer kept the record mid-write for every read attempt.

    That happens when the rank was stopped (SIGSTOP, a debugger) or died in
    the middle of a seqlock'd write (any write of v1; v2's identity and cold
    words). `last` is the final copy read: its identity is sound (written only
    at start and init) and each word is whole; `decode` reads it.
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
    version: int = RECORD_VERSION
    waiting_threads: int = 0  # v2: threads in a wait now (v1: 0 or 1)
    start_ticks: int = 0  # 0: unknown (compare start_time instead)

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


def _identity(buf: bytes) -> tuple[int, tuple[object, ...]]:
    """Check the fixed header of any version; returns (version, identity fields)."""
    if len(buf) < IDENTITY.size:
        raise RecordError(f"size {len(buf)}, expected {RECORD_SIZE}")
    fields = IDENTITY.unpack_from(buf, IDENTITY_OFFSET)
    magic, version, _, size, pid = fields[:5]
    if magic != MAGIC:
        raise RecordError("not an mlx-watchdog record (bad magic)")
    if version not in SIZES:
        raise RecordError(f"record version {version}; this build reads "
                          f"{' and '.join(map(str, SIZES))}")
    if len(buf) != SIZES[version]:
        raise RecordError(f"size {len(buf)}, expected {SIZES[version]} for version {version}")
    if size != SIZES[version]:
        raise RecordError(f"record says size {size}, expected {SIZES[version]}")
    start_time, _, rank, world_size, _, status = fields[5:11]
    if not 0 < pid <= MAX_PID:
        raise RecordError(f"corrupt record (pid {pid})")
    if not 0 <= world_size <= MAX_WORLD_SIZE:
        raise RecordError(f"corrupt record (world size {world_size})")
    if not -1 <= rank < MAX_WORLD_SIZE:
        raise RecordError(f"corrupt record (rank {rank})")
    if status > STATUS_ABANDONED:
        raise RecordError(f"corrupt record (status {status})")
    if not math.isfinite(start_time):
        raise RecordError("corrupt record (start time)")
    return version, fields


def decode(buf: bytes, after: bytes | None = None) -> Record:
    """Decode a copy of a record (v1 or v2), or raise `RecordError`.

    `after`, for v2, is a second copy taken after `buf`: flight entries that
    may have been rewritten between the two are left out (without it, `buf`
    serves as both, as for a record no one writes).
    """
    if len(buf) not in SIZES.values() and len(buf) >= IDENTITY.size:
        raise RecordError(f"size {len(buf)}, expected {RECORD_SIZE}")
    version, ident = _identity(buf)
    if version == 1:
        return _decode_v1(buf, ident)
    return _decode_v2(buf, buf if after is None or len(after) != len(buf) else after, ident)


def _record(ident: tuple[object, ...], **fields: object) -> Record:
    (_, _, _, _, pid, start_time, uid, rank, world_size, dump_signal, status, _, host, job,
     backend) = ident
    fields.setdefault("start_ticks", 0)
    return Record(pid=pid, start_time=start_time, uid=uid, rank=rank,  # type: ignore[arg-type]
                  world_size=world_size, dump_signal=dump_signal,  # type: ignore[arg-type]
                  status=status, host=_text(host), job=_text(job),  # type: ignore[arg-type]
                  backend=_text(backend), **fields)  # type: ignore[arg-type]


def _expect(buf: bytes, offset: int) -> tuple[float, int, str]:
    seconds, since, reason = EXPECT.unpack_from(buf, offset)
    if not 0.0 <= seconds < math.inf:  # also rejects NaN
        raise RecordError("corrupt record (expect window)")
    return seconds, since, _text(reason)


def _decode_v2(buf: bytes, after: bytes, ident: tuple[object, ...]) -> Record:
    (seq, created, idle_since, idle_ended, expect_seconds, expect_since,
     reason) = COLD.unpack_from(buf, SEQ_OFFSET)
    if not 0.0 <= expect_seconds < math.inf:  # also rejects NaN
        raise RecordError("corrupt record (expect window)")
    expect_reason = _text(reason)
    entered = completed = steps = collectives = max_wait = 0
    progress, last_wait = created, 0
    open_waits: list[tuple[int, int]] = []  # (since, op) of every thread in a wait
    flight: list[tuple[int, int, int, int]] = []  # (issued, slot, n, kind)
    for k in range(THREAD_SLOTS):
        base = SLOTS_OFFSET + k * SLOT_SIZE
        words = SLOT.unpack_from(buf, base)
        (_, since, op, _, c, done_at, last, longest, st, n) = words[:10]
        # Entered is derived: each thread has at most one open (outermost) wait.
        entered, completed, steps, collectives = entered + c + bool(since), completed + c, \
            steps + st, collectives + n
        max_wait = max(max_wait, longest)
        if done_at > progress:
            progress, last_wait = done_at, last
        if since:
            open_waits.append((since, op))
        # Entries n' with later - RING < n' <= n are whole: committed before the count
        # was read, and not rewritten before the second copy's count.
        later = _WORD.unpack_from(after, base + S_COLLECTIVES * 8)[0]
        for m in range(max(n - FLIGHT_SLOTS, later - RING, 0) + 1, n + 1):
            i = S_RING + 2 * (m % RING)
            if words[i + 1]:  # an op is never 0: a zero entry was never written
                flight.append((words[i], k, m, words[i + 1]))
    flight.sort()
    flight = flight[-FLIGHT_SLOTS:]
    entries = tuple(
        Collective(collectives - len(flight) + 1 + i, _name(OPS, kind & 0xFF),
                   _name(DTYPES, kind >> 8 & 0xFF), kind >> KIND_SHIFT, issued)
        for i, (issued, _, _, kind) in enumerate(flight))
    wait_since, op = min(open_waits) if open_waits else (0, 0)
    if idle_since:
        phase, phase_since = Phase.IDLE, idle_since
    elif any(o == OP_CODE["init"] for _, o in open_waits):
        phase, phase_since = Phase.INIT, wait_since
    elif open_waits:
        phase, phase_since = Phase.WAIT, wait_since
    else:
        phase, phase_since = Phase.RUNNING, max(progress, idle_ended)
    return _record(
        ident, seq=seq, collectives=collectives, waits_entered=entered,
        waits_completed=completed, steps=steps, phase=phase, op=_name(OPS, op),
        phase_since_ns=phase_since, wait_since_ns=wait_since, last_progress_ns=progress,
        last_wait_ns=last_wait, max_wait_ns=max_wait, expect_seconds=expect_seconds,
        expect_since_ns=expect_since, expect_reason=expect_reason, flight=entries, version=2,
        waiting_threads=len(open_waits), start_ticks=TICKS.unpack_from(buf, TICKS_OFFSET)[0])


def _decode_v1(buf: bytes, ident: tuple[object, ...]) -> Record:
    (seq,) = SEQ.unpack_from(buf, SEQ_OFFSET)
    (collectives, entered, completed, steps, phase, op, phase_since, wait_since,
     last_progress, last_wait, max_wait) = V1_HOT.unpack_from(buf, V1_HOT_OFFSET)
    if phase not in Phase._value2member_map_:
        raise RecordError(f"corrupt record (phase {phase})")
    expect_seconds, expect_since, expect_reason = _expect(buf, V1_EXPECT_OFFSET)
    entries = []
    for slot in range(FLIGHT_SLOTS):
        number, issued, nbytes, op_code, dtype, _ = V1_ENTRY.unpack_from(
            buf, V1_FLIGHT_OFFSET + slot * V1_ENTRY.size)
        if number:
            entries.append(Collective(number, _name(OPS, op_code), _name(DTYPES, dtype),
                                      nbytes, issued))
    entries.sort(key=lambda c: c.number)
    return _record(
        ident, seq=seq, collectives=collectives, waits_entered=entered,
        waits_completed=completed, steps=steps, phase=Phase(phase), op=_name(OPS, op),
        phase_since_ns=phase_since, wait_since_ns=wait_since, last_progress_ns=last_progress,
        last_wait_ns=last_wait, max_wait_ns=max_wait, expect_seconds=expect_seconds,
        expect_since_ns=expect_since, expect_reason=expect_reason, flight=tuple(entries),
        version=1, waiting_threads=int(bool(wait_since) and phase in (2, 4)),
        start_ticks=TICKS.unpack_from(buf, TICKS_OFFSET)[0])


def read_fd(fd: int, attempts: int = READ_ATTEMPTS, patience: float = READ_PATIENCE) -> Record:
    """Read a consistent snapshot from an open record file, of either version.

    The magic is checked only on a consistent copy: `struct.pack_into` zeroes
    a region before filling it, so `set_identity` blanks it mid-write.
    """
    give_up = time.monotonic() + patience
    buf = b""
    settle: tuple[bytes, bytes] | None = None  # a sound v2 pair with a short flight recorder
    for attempt in range(attempts):
        # `seq` first: one copy takes the identity bytes before its own `seq`, so
        # a v1 write that starts and ends in between would otherwise go unseen.
        first = os.pread(fd, SEQ.size, SEQ_OFFSET)
        buf = os.pread(fd, MAX_SIZE, 0)
        if len(buf) < IDENTITY.size + SEQ.size:
            raise RecordError(f"truncated record ({len(buf)} bytes)")
        (seq,) = SEQ.unpack_from(buf, SEQ_OFFSET)
        if seq % 2 == 0:
            (version,) = VERSION.unpack_from(buf, 8)
            if version == 1:
                if len(buf) < V1_SIZE:
                    raise RecordError(f"truncated record ({len(buf)} bytes)")
                if (first == buf[SEQ_OFFSET:SEQ_OFFSET + 8]
                        and os.pread(fd, SEQ.size, SEQ_OFFSET) == first):
                    return decode(buf[:V1_SIZE])
            else:
                # v2: a second copy; `seq` equal and even in both means the identity
                # and cold words of the second are whole (read after the first `seq`).
                after = os.pread(fd, MAX_SIZE, 0)
                if len(after) != len(buf):
                    raise RecordError(f"truncated record ({len(after)} bytes)")
                if after[SEQ_OFFSET:SEQ_OFFSET + 8] == buf[SEQ_OFFSET:SEQ_OFFSET + 8]:
                    if len(buf) < SIZES.get(version, 0):
                        raise RecordError(f"truncated record ({len(buf)} bytes)")
                    whole = after[:IDENTITY.size + 8] + buf[IDENTITY.size + 8:]
                    # A slot that issued more than one collective between the copies
                    # loses flight entries: read again for a closer pair, or settle.
                    if (version != RECORD_VERSION or attempt >= FLIGHT_RETRIES
                            or _flight_whole(buf, after)):
                        return decode(whole, after)
                    settle = (whole, after)
        if attempt > 10:
            if time.monotonic() > give_up:
                break
            time.sleep(0.0002)
    if settle is not None:
        return decode(*settle)
    raise RecordBusy(f"record stayed mid-write for {attempt + 1} reads", buf)


def _flight_whole(before: bytes, after: bytes) -> bool:
    """Did every slot issue at most one collective between the two copies?"""
    offsets = range(SLOTS_OFFSET + S_COLLECTIVES * 8, SLOTS_OFFSET + THREAD_SLOTS * SLOT_SIZE,
                    SLOT_SIZE)
    return all(_WORD.unpack_from(after, o)[0] - _WORD.unpack_from(before, o)[0] <= 1
               for o in offsets)


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
    """The rank's side of version 2: creates the file, maps it, hands out thread slots.

    The rank's hot path writes a thread's slot through `slot(k)` (a view of its
    words) with no lock; identity and cold words go under the seqlock
    (`begin`/`end`, which nest). `write_hot` and `write_entry` publish a whole
    state into slot 0 at once, for synthetic records (tests, benchmarks).
    """

    def __init__(self, path: str, *, pid: int, start_time: float, uid: int, host: str,
                 job: str, rank: int, world_size: int, backend: str, dump_signal: int,
                 start_ticks: int = 0) -> None:
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
        self.words = memoryview(self._map).cast("Q")
        self._views: list[memoryview] = []
        self._depth = 0  # nesting of begin/end (a signal handler may publish inside one)
        self._identity = dict(pid=pid, start_time=start_time, uid=uid, host=host, job=job,
                              backend=backend, dump_signal=dump_signal)
        TICKS.pack_into(self._map, TICKS_OFFSET, start_ticks)  # before publishing: never changes
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
        base = SLOTS_OFFSET // 8 + k * SLOT_WORDS
        view = self.words[base:base + SLOT_WORDS]
        self._views.append(view)
        return view

    def set_identity(self, *, rank: int, world_size: int, backend: str | None = None,
                     job: str | None = None) -> None:
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
                ident["dump_signal"], STATUS_OPEN, 0, _field(str(ident["host"]), 64),
                _field(str(ident["job"]), 64), _field(str(ident["backend"]), 16))
        finally:
            self.end()

    # The seqlock of the identity and cold words; nested calls keep `seq` odd.
    def begin(self) -> None:
        if not self._depth:
            self.words[W_SEQ] += 1
        self._depth += 1

    def end(self) -> None:
        self._depth -= 1
        if not self._depth:
            self.words[W_SEQ] += 1

    def write_idle(self, since: int, ended: int) -> None:
        """Idle since `since` (0: not idle); `ended`: when idle last ended. Cold."""
        self.words[W_IDLE_SINCE] = since
        self.words[W_IDLE_ENDED] = ended

    def write_expect(self, seconds: float, since_ns: int, reason: str) -> None:
        EXPECT.pack_into(self._map, EXPECT_OFFSET, seconds, since_ns, _field(reason, 48))

    def write_hot(self, collectives: int, entered: int, completed: int, steps: int,
                  phase: int, op: int, phase_since: int, wait_since: int, last_progress: int,
                  last_wait: int, max_wait: int) -> None:
        """Publish a whole state as one thread's (slot 0), between begin and end.

        For synthetic records: the rank's hot path never calls this. The phase
        is what a reader derives: idle (since `phase_since`), a wait or init
        (since `wait_since`, which a wait phase needs), or running.
        """
        w = self.words
        s = SLOTS_OFFSET // 8
        waiting = phase in (Phase.WAIT, Phase.INIT) and wait_since
        w[s + S_SINCE] = wait_since if waiting else 0
        w[s + S_OP] = OP_CODE["init"] if phase == Phase.INIT and waiting else op
        w[s + S_COMPLETED], w[s + S_STEPS] = completed, steps
        w[s + S_PROGRESS], w[s + S_LAST_WAIT], w[s + S_MAX_WAIT] = (last_progress, last_wait,
                                                                    max_wait)
        w[s + S_COLLECTIVES] = collectives
        w[W_CREATED] = 0
        self.write_idle(phase_since if phase == Phase.IDLE else 0,
                        phase_since if phase == Phase.RUNNING else 0)

    def write_entry(self, number: int, issued_ns: int, nbytes: int, op: int, dtype: int) -> None:
        """Collective `number` of slot 0 (it counts once `write_hot` says so)."""
        i = SLOTS_OFFSET // 8 + S_RING + 2 * (number % RING)
        self.words[i] = issued_ns
        self.words[i + 1] = nbytes << KIND_SHIFT | dtype << 8 | op

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
