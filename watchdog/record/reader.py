"""Reading a record of either version: one consistent copy, decoded and checked.

Any local user may write a file in the record directory, so every field is
checked and a bad one is a `RecordError`, never a crash of the reader.
"""

from __future__ import annotations

import math
import os
import stat
import time

from watchdog.record.layout import (
    COLD,
    DTYPES,
    EXPECT,
    FLIGHT_RETRIES,
    FLIGHT_SLOTS,
    IDENTITY,
    IDENTITY_OFFSET,
    KIND_SHIFT,
    MAGIC,
    MAX_PID,
    MAX_SIZE,
    MAX_WORLD_SIZE,
    OP_CODE,
    OPS,
    PACE_OPS,
    PY_THREAD_SLOTS,
    READ_ATTEMPTS,
    READ_PATIENCE,
    RECORD_SIZE,
    RECORD_VERSION,
    RING,
    S_COLLECTIVES,
    S_PACE,
    S_RING,
    SEQ,
    SEQ_OFFSET,
    SIZES,
    SLOT_OF,
    SLOTS_OFFSET,
    STATUS_ABANDONED,
    THREAD_SLOTS,
    THREADS,
    THREADS_OFFSET,
    THREADS_OVERFLOW,
    THREADS_PUBLISHED,
    TICKS,
    TICKS_OFFSET,
    V1_ENTRY,
    V1_EXPECT_OFFSET,
    V1_FLIGHT_OFFSET,
    V1_HOT,
    V1_HOT_OFFSET,
    V1_SIZE,
    VERSION,
    WORD,
    WORKLOAD,
    WORKLOAD_OFFSET,
    Collective,
    Pace,
    Record,
    RecordBusy,
    RecordError,
    decode_text,
    name_of,
)
from watchdog.states import Phase


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
    """Decode a copy of a record (v1, v2 or v3), or raise `RecordError`.

    `after`, for v2 and v3, is a second copy taken after `buf`: flight entries that
    may have been rewritten between the two are left out (without it, `buf`
    serves as both, as for a record no one writes).
    """
    if len(buf) not in SIZES.values() and len(buf) >= IDENTITY.size:
        raise RecordError(f"size {len(buf)}, expected {RECORD_SIZE}")
    version, ident = _identity(buf)
    if version == 1:
        return _decode_v1(buf, ident)
    return _decode_v2(buf, buf if after is None or len(after) != len(buf) else after, ident,
                      version)


def _record(ident: tuple[object, ...], **fields: object) -> Record:
    (_, _, _, _, pid, start_time, uid, rank, world_size, dump_signal, status, _, host, job,
     backend) = ident
    fields.setdefault("start_ticks", 0)
    fields.setdefault("python_threads", None)
    return Record(pid=pid, start_time=start_time, uid=uid, rank=rank,  # type: ignore[arg-type]
                  world_size=world_size, dump_signal=dump_signal,  # type: ignore[arg-type]
                  status=status, host=decode_text(host), job=decode_text(job),  # type: ignore[arg-type]
                  backend=decode_text(backend), **fields)  # type: ignore[arg-type]


def _expect(buf: bytes, offset: int) -> tuple[float, int, str]:
    seconds, since, reason = EXPECT.unpack_from(buf, offset)
    if not 0.0 <= seconds < math.inf:  # also rejects NaN
        raise RecordError("corrupt record (expect window)")
    return seconds, since, decode_text(reason)


def _python_threads(buf: bytes) -> dict[str, object]:
    """The table of Python threads (both versions): None until the hook publishes it."""
    head, *tids = THREADS.unpack_from(buf, THREADS_OFFSET)
    table = (tuple(tids[: min(head & 0xFFFF, PY_THREAD_SLOTS)])
             if head & THREADS_PUBLISHED else None)
    return {"python_threads": table, "python_threads_overflow": bool(head & THREADS_OVERFLOW)}


def _pace(waits: list[int], longest: list[int]) -> tuple[Pace, ...]:
    """The pace table summed over slots, by op name; codes OPS does not name (a newer
    writer, or a forged record) are one entry "?", so a record adds at most one kind."""
    by_name: dict[str, tuple[int, int]] = {}
    for code in range(PACE_OPS):
        if waits[code]:
            name = OPS[code] if 0 < code < len(OPS) else "?"
            n, m = by_name.get(name, (0, 0))
            by_name[name] = (n + waits[code], max(m, longest[code]))
    return tuple(Pace(name, n, m) for name, (n, m) in by_name.items())


def _decode_v2(buf: bytes, after: bytes, ident: tuple[object, ...],
               version: int = 2) -> Record:
    """Versions 2 and 3 (3: longer slots, ending in the pace table)."""
    (seq, created, idle_since, idle_ended, expect_seconds, expect_since,
     reason) = COLD.unpack_from(buf, SEQ_OFFSET)
    if not 0.0 <= expect_seconds < math.inf:  # also rejects NaN
        raise RecordError("corrupt record (expect window)")
    expect_reason = decode_text(reason)
    entered = completed = steps = collectives = max_wait = 0
    progress, last_wait = created, 0
    open_waits: list[tuple[int, int]] = []  # (since, op) of every thread in a wait
    flight: list[tuple[int, int, int, int]] = []  # (issued, slot, n, kind)
    slot, slot_size = SLOT_OF[version]
    pace_waits, pace_longest = [0] * PACE_OPS, [0] * PACE_OPS
    for k in range(THREAD_SLOTS):
        base = SLOTS_OFFSET + k * slot_size
        words = slot.unpack_from(buf, base)
        (_, since, op, _, c, done_at, last, longest, st, n) = words[:10]
        # Entered is derived: each thread has at most one open (outermost) wait.
        entered, completed, steps, collectives = entered + c + bool(since), completed + c, \
            steps + st, collectives + n
        max_wait = max(max_wait, longest)
        if done_at > progress:
            progress, last_wait = done_at, last
        if since:
            open_waits.append((since, op))
        for code in range(PACE_OPS if version >= 3 else 0):
            pace_waits[code] += words[S_PACE + 2 * code]
            pace_longest[code] = max(pace_longest[code], words[S_PACE + 2 * code + 1])
        # Entries n' with later + 1 - RING < n' <= n are whole: committed before the
        # count was read, and not rewritten by the second copy's read. The writer
        # stores entry later + 1 (into the slot of later + 1 - RING) before it commits
        # it, so that slot may be half rewritten even though the count says `later`.
        # And an entry must read the same in both copies: one copy is not read in
        # address order everywhere (fast string copies may load out of order), so
        # a count may be newer than an entry read beside it.
        # An entry that fails this drops the older ones of its slot too: the entries
        # given are numbered from the newest back, so one left out between two given
        # would shift every older number (a load of a fast string copy that ran ahead
        # of the count read an entry before its write, and the next after it).
        again = slot.unpack_from(after, base) if after is not buf else words
        later = again[S_COLLECTIVES]
        whole: list[tuple[int, int, int, int]] = []
        for m in range(max(n - FLIGHT_SLOTS, later + 1 - RING, 0) + 1, n + 1):
            i = S_RING + 2 * (m % RING)
            if words[i + 1] and words[i] == again[i] and words[i + 1] == again[i + 1]:
                whole.append((words[i], k, m, words[i + 1]))  # op 0: never written
            else:
                whole = []
        flight.extend(whole)
    flight.sort()
    flight = flight[-FLIGHT_SLOTS:]
    entries = tuple(
        Collective(collectives - len(flight) + 1 + i, name_of(OPS, kind & 0xFF),
                   name_of(DTYPES, kind >> 8 & 0xFF), kind >> KIND_SHIFT, issued)
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
        waits_completed=completed, steps=steps, phase=phase, op=name_of(OPS, op),
        phase_since_ns=phase_since, wait_since_ns=wait_since, last_progress_ns=progress,
        last_wait_ns=last_wait, max_wait_ns=max_wait, expect_seconds=expect_seconds,
        expect_since_ns=expect_since, expect_reason=expect_reason, flight=entries,
        version=version, waiting_threads=len(open_waits),
        start_ticks=TICKS.unpack_from(buf, TICKS_OFFSET)[0],
        workload=decode_text(WORKLOAD.unpack_from(buf, WORKLOAD_OFFSET)[0]),
        pace=_pace(pace_waits, pace_longest) if version >= 3 else None, **_python_threads(buf))


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
            entries.append(Collective(number, name_of(OPS, op_code), name_of(DTYPES, dtype),
                                      nbytes, issued))
    entries.sort(key=lambda c: c.number)
    return _record(
        ident, seq=seq, collectives=collectives, waits_entered=entered,
        waits_completed=completed, steps=steps, phase=Phase(phase), op=name_of(OPS, op),
        phase_since_ns=phase_since, wait_since_ns=wait_since, last_progress_ns=last_progress,
        last_wait_ns=last_wait, max_wait_ns=max_wait, expect_seconds=expect_seconds,
        expect_since_ns=expect_since, expect_reason=expect_reason, flight=tuple(entries),
        version=1, waiting_threads=int(bool(wait_since) and phase in (2, 4)),
        start_ticks=TICKS.unpack_from(buf, TICKS_OFFSET)[0], **_python_threads(buf))


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
                    if (version not in SLOT_OF or attempt >= FLIGHT_RETRIES
                            or _flight_whole(buf, after, version)):
                        return decode(whole, after)
                    settle = (whole, after)
        if attempt > 10:
            if time.monotonic() > give_up:
                break
            time.sleep(0.0002)
    if settle is not None:
        return decode(*settle)
    raise RecordBusy(f"record stayed mid-write for {attempt + 1} reads", buf)


def _flight_whole(before: bytes, after: bytes, version: int = RECORD_VERSION) -> bool:
    """Did every slot issue at most one collective between the two copies?"""
    slot_size = SLOT_OF[version][1]
    offsets = range(SLOTS_OFFSET + S_COLLECTIVES * 8, SLOTS_OFFSET + THREAD_SLOTS * slot_size,
                    slot_size)
    return all(WORD.unpack_from(after, o)[0] - WORD.unpack_from(before, o)[0] <= 1
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


