"""Property tests: whatever bytes sit in a record file, readers get a Record or a RecordError.

Nothing else may escape (the daemon and the CLI must survive any file in the record
directory), and rejecting garbage must be quick.
"""

from __future__ import annotations

import math
import os
import random
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.record_v1 import V1Writer
from tests.support.records import SyntheticWriter
from watchdog import record
from watchdog.record import RECORD_SIZE, Record, RecordError, layout
from watchdog.states import Phase

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.large_base_example, HealthCheck.data_too_large,
                                       HealthCheck.too_slow])
QUICK = 1.0  # seconds any single read may take, with room for a loaded machine
SINCE_AT = layout.SLOTS_OFFSET + 8 * layout.S_SINCE
OP_AT = layout.SLOTS_OFFSET + 8 * layout.S_OP
SEQ_AT = layout.SEQ_OFFSET
V1_SIZE = layout.SIZES[1]


def build_valid() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        writer = SyntheticWriter(os.path.join(tmp, "1.rec"), pid=1234, start_time=1.5e9, uid=501,
                              host="node-1", job="j1", rank=1, world_size=3, backend="ring",
                              dump_signal=12)
        writer.begin()
        writer.write_hot(70, 140, 139, 70, Phase.WAIT, record.OP_CODE["eval"], 6, 6, 7, 8, 9)
        writer.write_expect(60.0, 4, "checkpoint")
        for number in range(1, 71):
            writer.write_entry(number, number, 64, record.OP_CODE["all_sum"],
                               record.DTYPE_CODE["float32"])
        writer.end()
        data = Path(writer.path).read_bytes()
        writer.close(record.STATUS_CLOSED)
    assert isinstance(record.decode(data), Record)
    return data


def build_valid_v1() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        writer = V1Writer(os.path.join(tmp, "1.rec"), pid=1234, start_time=1.5e9, uid=501,
                          host="node-1", job="j1", rank=1, world_size=3, backend="ring",
                          dump_signal=12)
        writer.begin()
        writer.write_hot(70, 140, 139, 70, Phase.WAIT, record.OP_CODE["eval"], 5, 6, 7, 8, 9)
        writer.write_expect(60.0, 4, "checkpoint")
        for number in range(1, 71):
            writer.write_entry(number, number, 64, record.OP_CODE["all_sum"],
                               record.DTYPE_CODE["float32"])
        writer.end()
        data = Path(writer.path).read_bytes()
        writer.close(record.STATUS_CLOSED)
    assert record.decode(data).version == 1
    return data


VALID = build_valid()
VALID_V1 = build_valid_v1()


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mlxwd-fuzz-") as tmp:
        yield Path(tmp)


def same(a: Record | None, b: Record | None) -> bool:
    """Equal records; NaN (a possible start time) equal to NaN."""
    return repr(a) == repr(b)


def decode_checked(data: bytes) -> Record | None:
    """decode(): a Record or RecordError, quickly; None for a rejection."""
    started = time.monotonic()
    try:
        rec = record.decode(data)
    except RecordError:
        rec = None
    assert time.monotonic() - started < QUICK
    if rec is not None:
        assert isinstance(rec, Record)
    return rec


def read_checked(scratch: Path, data: bytes) -> Record | None:
    """The same bytes through a file: read_fd with a small bound, and read_path."""
    path = scratch / "fuzz.rec"
    path.write_bytes(data)
    started = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            rec = record.read_fd(fd, attempts=3)
        except RecordError:
            rec = None
    finally:
        os.close(fd)
    seq_even = len(data) >= SEQ_AT + 8 and struct.unpack_from("<Q", data, SEQ_AT)[0] % 2 == 0
    if seq_even or len(data) < RECORD_SIZE:  # an odd seq would only make read_path retry
        try:
            by_path = record.read_path(str(path))
        except RecordError:
            by_path = None
        assert same(by_path, rec)
    assert time.monotonic() - started < QUICK
    return rec


# Hypothesis cannot draw 16 KiB of bytes at once: it draws the seed of a generator instead.
@pytest.mark.slow
@FUZZ
@given(seed=st.integers(0, 2**64), size=st.sampled_from([RECORD_SIZE, V1_SIZE]))
def test_random_bytes_of_record_size(scratch: Path, seed: int, size: int) -> None:
    data = random.Random(seed).randbytes(size)
    decode_checked(data)
    read_checked(scratch, data)


@pytest.mark.slow
@FUZZ
@given(data=st.binary(max_size=2 * RECORD_SIZE + 1))
def test_random_bytes_of_any_length(scratch: Path, data: bytes) -> None:
    if len(data) != RECORD_SIZE:
        assert decode_checked(data) is None
    read_checked(scratch, data)


@pytest.mark.slow
@FUZZ
@given(seed=st.integers(0, 2**64))
def test_random_bytes_behind_a_valid_header(scratch: Path, seed: int) -> None:
    # Past the magic/version/size checks, so the rest of the decoder sees the garbage.
    data = bytearray(VALID[:16] + random.Random(seed).randbytes(RECORD_SIZE - 16))
    struct.pack_into("<Q", data, SEQ_AT, struct.unpack_from("<Q", data, SEQ_AT)[0] & ~1)
    decode_checked(bytes(data))
    read_checked(scratch, bytes(data))


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, RECORD_SIZE - 1), st.integers(0, 7)),
                      min_size=1, max_size=16))
@pytest.mark.slow
def test_bit_flips_in_a_valid_record(scratch: Path,
                                     flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID)
    for offset, bit in flips:
        data[offset] ^= 1 << bit
    decode_checked(bytes(data))
    read_checked(scratch, bytes(data))


@pytest.mark.slow
@FUZZ
@given(length=st.integers(0, RECORD_SIZE - 1))
def test_truncations_of_a_valid_record(scratch: Path, length: int) -> None:
    data = VALID[:length]
    assert decode_checked(data) is None
    assert read_checked(scratch, data) is None


@pytest.mark.slow
@FUZZ
@given(version=st.integers(0, 0xFFFF))
def test_any_other_version_is_refused(scratch: Path, version: int) -> None:
    data = bytearray(VALID)
    struct.pack_into("<H", data, 8, version)
    rec = decode_checked(bytes(data))
    assert (rec is not None) == (version == record.RECORD_VERSION)
    assert (read_checked(scratch, bytes(data)) is not None) == (version == record.RECORD_VERSION)


@pytest.mark.slow
@FUZZ
@given(seq=st.integers(0, 2**64 - 1))
def test_an_odd_seq_is_busy_and_an_even_one_reads(scratch: Path, seq: int) -> None:
    data = bytearray(VALID)
    struct.pack_into("<Q", data, SEQ_AT, seq)
    path = scratch / "seq.rec"
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        if seq % 2:
            with pytest.raises(record.RecordBusy):
                record.read_fd(fd, attempts=2)
        else:
            assert record.read_fd(fd, attempts=2).seq == seq
    finally:
        os.close(fd)


U64 = st.integers(0, 2**64 - 1)


@FUZZ
@given(slots=st.lists(st.lists(U64, min_size=10, max_size=10), min_size=layout.THREAD_SLOTS,
                      max_size=layout.THREAD_SLOTS),
       cold=st.lists(U64, min_size=3, max_size=3),
       expect=st.floats(allow_nan=True, allow_infinity=True), pid=st.integers(-2**63, 2**63 - 1),
       start=st.floats(allow_nan=True, allow_infinity=True),
       entries=st.lists(st.tuples(st.integers(0, layout.THREAD_SLOTS - 1),
                                  st.integers(0, layout.RING - 1), U64, U64), max_size=40))
@pytest.mark.slow
def test_absurd_numbers_decode_as_they_are(scratch: Path, slots: list[list[int]],
                                           cold: list[int], expect: float, pid: int,
                                           start: float,
                                           entries: list[tuple[int, int, int, int]]) -> None:
    data = bytearray(VALID)
    for k, words in enumerate(slots):
        struct.pack_into("<10Q", data, layout.SLOTS_OFFSET + k * layout.SLOT_SIZE, *words)
    for k, i, issued, kind in entries:
        struct.pack_into("<QQ", data, layout.SLOTS_OFFSET + k * layout.SLOT_SIZE + 96 + 16 * i,
                         issued, kind)
    struct.pack_into("<3Q", data, SEQ_AT + 8, *cold)
    struct.pack_into("<d", data, layout.EXPECT_OFFSET, expect)
    struct.pack_into("<qd", data, 16, pid, start)
    rec = decode_checked(bytes(data))
    # Bounded: pids past a C int, infinite or NaN times are corrupt.
    if not 0 < pid <= layout.MAX_PID or not 0 <= expect < math.inf or not math.isfinite(start):
        assert rec is None
        return
    assert rec is not None
    assert rec.collectives == sum(w[layout.S_COLLECTIVES] for w in slots)
    assert rec.waits_completed == sum(w[layout.S_COMPLETED] for w in slots)
    assert rec.steps == sum(w[layout.S_STEPS] for w in slots)
    assert rec.max_wait_ns == max(w[layout.S_MAX_WAIT] for w in slots)
    open_waits = sorted((w[layout.S_SINCE], w[layout.S_OP]) for w in slots if w[layout.S_SINCE])
    assert rec.waiting_threads == len(open_waits)
    assert rec.wait_since_ns == (open_waits[0][0] if open_waits else 0)
    assert rec.phase is (Phase.IDLE if cold[1] else Phase.INIT if any(
        op == record.OP_CODE["init"] for _, op in open_waits) else Phase.WAIT if open_waits
        else Phase.RUNNING)
    assert rec.expect_seconds == expect and rec.pid == pid
    assert rec.start_time == start
    assert isinstance(rec.op, str) and all(isinstance(c.op, str) for c in rec.flight)
    assert len(rec.flight) <= layout.FLIGHT_SLOTS
    numbers = [c.number for c in rec.flight]
    assert numbers == sorted(numbers)
    assert same(read_checked(scratch, bytes(data)), rec)


TEXT_FIELDS = {"host": (56, 64), "job": (120, 64), "backend": (184, 16),
               "expect_reason": (layout.EXPECT_OFFSET + 16, 48)}


@pytest.mark.slow
@FUZZ
@given(field=st.sampled_from(sorted(TEXT_FIELDS)), raw=st.binary(max_size=64))
def test_any_bytes_in_a_text_field_decode_to_text(scratch: Path, field: str, raw: bytes) -> None:
    offset, size = TEXT_FIELDS[field]
    data = bytearray(VALID)
    struct.pack_into(f"<{size}s", data, offset, raw[:size])
    rec = decode_checked(bytes(data))
    assert rec is not None
    text = getattr(rec, field)
    assert isinstance(text, str)
    assert text == raw[:size].rstrip(b"\0").decode("utf-8", "replace")
    assert same(read_checked(scratch, bytes(data)), rec)


@pytest.mark.slow
@FUZZ
@given(since=st.integers(0, 2**64 - 1), op=st.integers(0, 2**64 - 1))
def test_wait_and_op_words(scratch: Path, since: int, op: int) -> None:
    data = bytearray(VALID)
    struct.pack_into("<Q", data, SINCE_AT, since)
    struct.pack_into("<Q", data, OP_AT, op)
    rec = decode_checked(bytes(data))
    assert rec is not None  # no value of a hot word makes a v2 record corrupt
    assert (rec.phase is not Phase.RUNNING) == bool(since)
    if since:
        assert rec.op == (record.OPS[op] if op < len(record.OPS) else f"?{op}")


# -- version 1, still read ------------------------------------------------------------------


@pytest.mark.slow
@FUZZ
@given(seed=st.integers(0, 2**64))
def test_random_bytes_behind_a_valid_v1_header(scratch: Path, seed: int) -> None:
    data = bytearray(VALID_V1[:16] + random.Random(seed).randbytes(V1_SIZE - 16))
    struct.pack_into("<Q", data, SEQ_AT, struct.unpack_from("<Q", data, SEQ_AT)[0] & ~1)
    decode_checked(bytes(data))
    read_checked(scratch, bytes(data))


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, V1_SIZE - 1), st.integers(0, 7)),
                      min_size=1, max_size=16))
@pytest.mark.slow
def test_bit_flips_in_a_valid_v1_record(scratch: Path, flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID_V1)
    for offset, bit in flips:
        data[offset] ^= 1 << bit
    decode_checked(bytes(data))
    read_checked(scratch, bytes(data))


@pytest.mark.slow
@FUZZ
@given(phase=st.integers(0, 2**64 - 1))
def test_v1_phase_word(scratch: Path, phase: int) -> None:
    data = bytearray(VALID_V1)
    struct.pack_into("<Q", data, 208 + 4 * 8, phase)
    rec = decode_checked(bytes(data))
    assert (rec is not None) == (phase in {int(p) for p in Phase})
