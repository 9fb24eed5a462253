"""The rank record: one fixed-size binary file per rank process.

This module owns every byte of the record; `docs/record-format.md` mirrors
this docstring. The rank maps the file with `mmap` and is its only writer;
the daemon and the CLI read it with `pread` and never write. The writer
writes version 3; the reader reads versions 1, 2 and 3 (a rank started
before an upgrade keeps being watched).

All integers are little-endian. Offsets are in bytes. Size: 24576 (v3),
16384 (v2), 4096 (v1). Version 3 is version 2 with a pace table at the end
of each thread slot (so the slots are longer); everything else is where v2
has it.

    region    offset  struct  field
    identity       0  8s      magic  b"MLXWDREC"
                   8  H       version (3)
                  10  H       reserved (0)
                  12  I       record size (24576)
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
                 296  32s     workload: a digest of the rank's program and arguments,
                              the same across relaunches (v2/v3 writers before it
                              left zeros: "" reads as unknown)
    identity     360  Q       process start in clock ticks since boot (Linux
                              /proc/<pid>/stat field 22; 0: unknown, e.g. macOS);
                              the same offset in version 1
    threads      384  Q       Python threads: bit 32 set once published, bit 33
                              set when they outnumber the table, low bits: count
                 392  15Q     their native thread ids (threading.get_native_id),
                              the main thread excluded (the same offsets in v1)
    slots        512  13 thread slots of 1776 bytes, slot k at 512 + 1776 k
                      (v2: 1136 bytes, no pace table), each written by one
                      thread only (no lock):
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
                 +1136 40 pace entries of 16 bytes, entry c for op code c
                      (v3 only), over the thread's completed outermost waits
                      outside init, hb.idle() and hb.expect():
                        +0 Q  waits of op c completed
                        +8 Q  the longest of them (ns)

Hot words are single aligned 8-byte words (one store each) and every
counter only grows (a pace entry's two words too, each on its own: a
reader may see a count one ahead of its longest). The hot path writes its
own thread's slot with no lock:
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

import struct
from dataclasses import dataclass
from typing import NamedTuple

from watchdog import host
from watchdog.states import Phase

# Where ranks publish and the daemon looks, unless MLX_WATCHDOG_DIR / --dir say otherwise.
DEFAULT_DIR = host.defaults().record_dir

MAGIC = b"MLXWDREC"
RECORD_VERSION = 3
RECORD_SIZE = 24576
SIZES = {1: 4096, 2: 16384, 3: RECORD_SIZE}  # version -> file size; the reader takes each
MAX_SIZE = max(SIZES.values())
SUFFIX = ".rec"
STACKS_SUFFIX = ".stacks"  # beside a record: the rank's faulthandler dump


def stacks_path(record_path: str) -> str:
    """The stack-dump file that belongs to a record: same name, other suffix."""
    base = record_path[: -len(SUFFIX)] if record_path.endswith(SUFFIX) else record_path
    return base + STACKS_SUFFIX


def staging_path(record_path: str) -> str:
    """Where a record is built before it is renamed into place (no reader looks)."""
    head, name = record_path.rsplit("/", 1) if "/" in record_path else ("", record_path)
    return f"{head}/.{name}.new" if head else f".{name}.new"
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
WORKLOAD = struct.Struct("<32s")
WORKLOAD_OFFSET = 296  # v2/v3: after the expect reason, under the seqlock
TICKS_OFFSET = 360  # both versions: after the cold words (v2) or the expect window (v1)
# The table of the rank's Python threads (not MLX's), for the daemon's backstop.
PY_THREAD_SLOTS = 15
THREADS_PUBLISHED = 1 << 32
THREADS_OVERFLOW = 1 << 33
THREADS_OFFSET = 384  # both versions, up to the slots (v2) or the flight recorder (v1)
THREADS = struct.Struct(f"<{1 + PY_THREAD_SLOTS}Q")
W_THREADS = THREADS_OFFSET // 8
VERSION = struct.Struct("<H")  # at offset 8 in every version
STATUS = struct.Struct("<I")
IDENTITY_OFFSET = 0
SEQ_OFFSET = 200
STATUS_OFFSET = 48
assert IDENTITY.size == SEQ_OFFSET

# -- versions 2 and 3 ------------------------------------------------------------------------

COLD = struct.Struct("<QQQQdQ48s")  # seq, created, idle since, idle ended, expect (3)
EXPECT = struct.Struct("<dQ48s")
EXPECT_OFFSET = 232
SLOTS_OFFSET = 512
THREAD_SLOTS = 13
SLOT_HEADER_WORDS = 12
RING = FLIGHT_SLOTS + 1  # one more than a reader gets back: the entry being rewritten
# The pace table (v3): per op code, the waits completed and the longest, so the
# daemon learns a job's pace from every wait, not only from those a scan sees.
PACE_OPS = 40  # op codes 0..39 (OPS has room to grow); a wait of another code is an error
S_PACE = SLOT_HEADER_WORDS + 2 * RING  # entry c: words S_PACE + 2c (count), + 2c + 1 (longest)
SLOT_WORDS = S_PACE + 2 * PACE_OPS
SLOT_SIZE = SLOT_WORDS * 8
SLOT = struct.Struct(f"<{SLOT_WORDS}Q")
V2_SLOT_SIZE = S_PACE * 8  # version 2's slot: no pace table
V2_SLOT = struct.Struct(f"<{S_PACE}Q")
SLOT_OF = {2: (V2_SLOT, V2_SLOT_SIZE), 3: (SLOT, SLOT_SIZE)}  # version -> slot struct, size
assert SEQ_OFFSET + COLD.size <= TICKS_OFFSET and EXPECT_OFFSET == SEQ_OFFSET + 32
assert TICKS_OFFSET + TICKS.size <= THREADS_OFFSET
assert SEQ_OFFSET + COLD.size <= WORKLOAD_OFFSET
assert WORKLOAD_OFFSET + WORKLOAD.size <= TICKS_OFFSET
assert THREADS_OFFSET + THREADS.size == SLOTS_OFFSET
assert SLOT.size == SLOT_SIZE and SLOTS_OFFSET + THREAD_SLOTS * SLOT_SIZE <= RECORD_SIZE
assert SLOTS_OFFSET + THREAD_SLOTS * V2_SLOT_SIZE <= SIZES[2]

# Word indices of the cold region (into `RecordWriter.words`) and of a slot (into a slot view).
W_SEQ, W_CREATED, W_IDLE_SINCE, W_IDLE_ENDED = (SEQ_OFFSET // 8 + i for i in range(4))
(S_OWNER, S_SINCE, S_OP, _, S_COMPLETED, S_PROGRESS, S_LAST_WAIT, S_MAX_WAIT, S_STEPS,
 S_COLLECTIVES) = range(10)
S_RING = SLOT_HEADER_WORDS  # entry n: words S_RING + 2 (n % RING) and the one after
KIND_SHIFT = 16  # entry word 2: bytes << 16 | dtype << 8 | op


def slot_base(k: int) -> int:
    """The index of thread slot `k`'s first word among the record's words."""
    return SLOTS_OFFSET // 8 + k * SLOT_WORDS

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
WORD = struct.Struct("<Q")


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
    """One entry of a record's flight recorder: a collective the rank issued."""
    number: int
    op: str
    dtype: str
    nbytes: int
    issued_ns: int


class Pace(NamedTuple):
    """What a rank's completed waits of one op showed (record v3): how many, the longest."""

    op: str
    waits: int
    longest_ns: int


@dataclass(frozen=True)
class Record:
    """A rank's record as read: its identity, its job and place in it, its phase and
    wait, its progress counters, its `hb.expect()` window and its flight recorder."""
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
    workload: str = ""  # the program's digest, "" when unknown (see the layout)
    # Native ids of the rank's Python threads other than the main one; None when
    # the writer does not publish them (an older hook). See docs/record-format.md.
    python_threads: tuple[int, ...] | None = None
    python_threads_overflow: bool = False  # more threads than the table: it is partial
    # v3: per op, the completed waits outside init/idle/expect (count, longest), every
    # slot summed; None for a v1/v2 record, which publishes no pace.
    pace: tuple[Pace, ...] | None = None

    @property
    def closed(self) -> bool:
        """Whether the record says other than open: closed, left on an error, or abandoned."""
        return self.status != STATUS_OPEN


def decode_text(raw: bytes) -> str:
    """A text field as read: its NUL padding dropped, bad UTF-8 replaced."""
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def encode_text(text: str, size: int) -> bytes:
    """Encode to at most `size` bytes without splitting a UTF-8 sequence."""
    return text.encode("utf-8")[:size].decode("utf-8", "ignore").encode("utf-8")


def name_of(table: tuple[str, ...], code: int) -> str:
    """The name of an op or dtype code; a code this reader does not know reads "?<code>"."""
    return table[code] if 0 <= code < len(table) else f"?{code}"


