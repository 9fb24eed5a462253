"""The rank record: byte layout round trip, seqlock consistency, and rejection of bad files."""

from __future__ import annotations

import math
import os
import re
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from watchdog import record
from watchdog.record import (
    FLIGHT_SLOTS,
    RECORD_SIZE,
    RECORD_VERSION,
    Record,
    RecordBusy,
    RecordError,
    RecordWriter,
)
from watchdog.states import Phase

REPO = Path(__file__).resolve().parent.parent
# Offsets of single fields, from the layout's own constants (8-byte words in the hot region).
PHASE_AT = record.W_PHASE * 8
OP_AT = record.W_OP * 8
REASON_AT = record.EXPECT_OFFSET + 16

IDENTITY = dict(pid=4242, start_time=1700000000.25, uid=501, host="mac-studio-1",
                job="j0123456789a", rank=2, world_size=3, backend="ring", dump_signal=12)


def make_writer(path: Path, **overrides: object) -> RecordWriter:
    fields = {**IDENTITY, **overrides}
    return RecordWriter(str(path), **fields)  # type: ignore[arg-type]


def write_hot(writer: RecordWriter, *values: int) -> None:
    writer.begin()
    writer.write_hot(*values)
    writer.end()


def valid_bytes(tmp_path: Path) -> bytearray:
    """The bytes of a real, valid record as the writer leaves them."""
    path = tmp_path / "valid.rec"
    writer = make_writer(path)
    write_hot(writer, 1, 2, 2, 1, Phase.RUNNING, 0, 10, 0, 10, 5, 5)
    writer.begin()
    writer.write_entry(1, 7, 64, record.OP_CODE["all_sum"], record.DTYPE_CODE["float32"])
    writer.end()
    data = bytearray(path.read_bytes())
    writer.close(record.STATUS_CLOSED)
    return data


def put(buf: bytearray, fmt: str, offset: int, *values: object) -> bytearray:
    struct.pack_into(fmt, buf, offset, *values)
    return buf


# -- round trip --------------------------------------------------------------------------


def test_round_trip_every_field(tmp_path: Path) -> None:
    path = tmp_path / "4242.rec"
    writer = make_writer(path, rank=-1, world_size=0, backend="")
    writer.set_identity(rank=2, world_size=3, backend="jaccl", job="job-7")
    write_hot(writer, 11, 22, 21, 5, Phase.WAIT, record.OP_CODE["item"], 1000, 2000, 3000,
              4000, 5000)
    writer.begin()
    writer.write_expect(900.5, 6000, "checkpoint")
    writer.write_entry(1, 7000, 4096, record.OP_CODE["all_gather"], record.DTYPE_CODE["bfloat16"])
    writer.end()

    rec = record.read_path(str(path))
    assert isinstance(rec, Record)
    assert (rec.pid, rec.start_time, rec.uid) == (4242, 1700000000.25, 501)
    assert (rec.rank, rec.world_size, rec.backend, rec.job) == (2, 3, "jaccl", "job-7")
    assert (rec.host, rec.dump_signal) == ("mac-studio-1", 12)
    assert rec.status == record.STATUS_OPEN and not rec.closed
    assert rec.seq % 2 == 0 and rec.seq > 0
    assert (rec.collectives, rec.waits_entered, rec.waits_completed, rec.steps) == (11, 22, 21, 5)
    assert rec.phase is Phase.WAIT and rec.op == "item"
    assert (rec.phase_since_ns, rec.wait_since_ns, rec.last_progress_ns) == (1000, 2000, 3000)
    assert (rec.last_wait_ns, rec.max_wait_ns) == (4000, 5000)
    assert (rec.expect_seconds, rec.expect_since_ns, rec.expect_reason) == (900.5, 6000,
                                                                             "checkpoint")
    assert rec.flight == (record.Collective(1, "all_gather", "bfloat16", 4096, 7000),)
    # The same bytes decode the same way without the file.
    assert record.decode(path.read_bytes()) == rec

    writer.close(record.STATUS_CLOSED, remove=False)
    closed = record.read_path(str(path))
    assert closed.status == record.STATUS_CLOSED and closed.closed
    assert closed.collectives == 11  # closing keeps the last numbers for the reader


def test_every_op_and_dtype_name_round_trips(tmp_path: Path) -> None:
    writer = make_writer(tmp_path / "1.rec")
    write_hot(writer, 0, 0, 0, 0, Phase.RUNNING, 0, 0, 0, 0, 0, 0)
    pairs = list(zip(record.OPS[1:], (record.DTYPES[1:] * 3)[:len(record.OPS) - 1], strict=True))
    writer.begin()
    for number, (op, dtype) in enumerate(pairs, start=1):
        writer.write_entry(number, number * 10, number * 100, record.OP_CODE[op],
                           record.DTYPE_CODE[dtype])
    writer.end()
    rec = record.read_path(writer.path)
    assert [(c.op, c.dtype) for c in rec.flight] == pairs
    for op in record.OPS:
        write_hot(writer, 0, 0, 0, 0, Phase.WAIT, record.OP_CODE[op], 0, 0, 0, 0, 0)
        assert record.read_path(writer.path).op == op
    writer.close(record.STATUS_CLOSED)


@pytest.mark.parametrize("issued", [5, FLIGHT_SLOTS, FLIGHT_SLOTS + 1, 150])
def test_flight_recorder_keeps_last_64_oldest_first(tmp_path: Path, issued: int) -> None:
    writer = make_writer(tmp_path / "1.rec")
    ops = record.OPS[9:17]  # the collectives
    for number in range(1, issued + 1):
        writer.begin()
        dtype = "float32" if number % 2 else "int8"
        writer.write_entry(number, 1_000_000 + number, number * 8,
                           record.OP_CODE[ops[number % len(ops)]], record.DTYPE_CODE[dtype])
        writer.write_hot(number, 0, 0, 0, Phase.RUNNING, 0, 0, 0, 0, 0, 0)
        writer.end()
    rec = record.read_path(writer.path)
    first = max(1, issued - FLIGHT_SLOTS + 1)
    assert [c.number for c in rec.flight] == list(range(first, issued + 1))
    for c in rec.flight:
        assert c.issued_ns == 1_000_000 + c.number
        assert c.nbytes == c.number * 8
        assert c.op == ops[c.number % len(ops)]
        assert c.dtype == ("float32" if c.number % 2 else "int8")
    assert rec.collectives == issued
    writer.close(record.STATUS_CLOSED)


def test_text_fields_are_cut_on_a_utf8_boundary(tmp_path: Path) -> None:
    host = "é" * 40  # 80 bytes: the 64-byte field holds 32 whole characters
    writer = make_writer(tmp_path / "1.rec", host=host, job="ジョブ" * 30, backend="ring-ü" * 5)
    write_hot(writer, 0, 0, 0, 0, Phase.RUNNING, 0, 0, 0, 0, 0, 0)
    writer.begin()
    writer.write_expect(1.0, 1, "ü" * 30)
    writer.end()
    rec = record.read_path(writer.path)
    assert rec.host == "é" * 32
    assert rec.job == "ジョブ" * 7  # 21 chars x 3 bytes = 63 bytes
    assert rec.backend == "ring-üring-üri"
    assert rec.expect_reason == "ü" * 24
    assert "\ufffd" not in rec.host + rec.job + rec.backend + rec.expect_reason
    writer.close(record.STATUS_CLOSED)


def test_close_removes_the_file_by_default(tmp_path: Path) -> None:
    path = tmp_path / "1.rec"
    writer = make_writer(path)
    assert path.exists()
    assert oct(path.stat().st_mode & 0o777) == oct(0o644 & ~current_umask())
    writer.close(record.STATUS_CLOSED)
    assert not path.exists()


def test_writer_replaces_a_stale_file_or_symlink_without_following_it(tmp_path: Path) -> None:
    existing = tmp_path / "1.rec"
    existing.write_bytes(b"x")
    make_writer(existing)  # built under a staging name, renamed over the stale file
    assert record.read_path(str(existing)).pid > 0
    link = tmp_path / "2.rec"
    link.symlink_to(tmp_path / "elsewhere")
    make_writer(link)
    assert not link.is_symlink() and not (tmp_path / "elsewhere").exists()
    assert not list(tmp_path.glob(".*.new"))


def test_writer_refuses_an_existing_staging_file(tmp_path: Path) -> None:
    (tmp_path / ".3.rec.new").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        make_writer(tmp_path / "3.rec")
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "3.rec").exists()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- concurrent reads ----------------------------------------------------------------------

HAMMER = textwrap.dedent("""
    import os, sys, time
    from watchdog import record
    from watchdog.states import Phase

    path, stop = sys.argv[1], sys.argv[2]
    w = record.RecordWriter(path, pid=os.getpid(), start_time=1.0, uid=os.getuid(), host="h",
                            job="j", rank=0, world_size=0, backend="ring", dump_signal=0)
    w.begin()
    w.write_hot(0, 0, 0, 0, Phase.WAIT, record.OP_CODE["eval"], 0, 0, 0, 0, 0)
    w.write_expect(0.0, 0, "0")
    w.end()
    print("ready", flush=True)
    deadline = time.monotonic() + 60  # a safety net; the test asks us to stop long before
    k = 0
    while True:
        k += 1
        # One update: every counter and time is k; the newest flight entry is number k.
        w.begin()
        w.write_hot(k, k, k, k, Phase.WAIT, record.OP_CODE["eval"], k, k, k, k, k)
        w.write_entry(k, k, k, record.OP_CODE["all_sum"], record.DTYPE_CODE["float32"])
        w.write_expect(float(k), k, str(k))
        w.end()
        if k % 500 == 0:
            w.set_identity(rank=k, world_size=k)
            if os.path.exists(stop) or time.monotonic() > deadline:
                break
        # A short gap between updates, as a rank has: readers get a chance at a clean copy,
        # while most reads still overlap some write.
        until = time.perf_counter_ns() + (k % 7) * 5000
        while time.perf_counter_ns() < until:
            pass
    print(k, flush=True)
    w.close(record.STATUS_CLOSED)
""")


def torn(rec: Record) -> str | None:
    """Why `rec` is not one of the hammer's states, or None if it is one."""
    k = rec.collectives
    values = {rec.waits_entered, rec.waits_completed, rec.steps, rec.phase_since_ns,
              rec.wait_since_ns, rec.last_progress_ns, rec.last_wait_ns, rec.max_wait_ns,
              rec.expect_since_ns, int(rec.expect_seconds)}
    if values != {k} or rec.expect_reason != str(k):
        return f"mixed hot/expect values {sorted(values)} for k={k}"
    if rec.rank != rec.world_size or rec.rank % 500 or rec.rank > k:
        return f"identity rank {rec.rank} world {rec.world_size} at k={k}"
    numbers = [c.number for c in rec.flight]
    if numbers != list(range(max(1, k - FLIGHT_SLOTS + 1), k + 1)):
        return f"flight numbers {numbers[:3]}..{numbers[-3:]} for k={k}"
    if any(c.issued_ns != c.number or c.nbytes != c.number or c.op != "all_sum"
           for c in rec.flight):
        return "flight entry with mixed fields"
    return None


def test_concurrent_reads_never_see_a_torn_record(tmp_path: Path) -> None:
    path, stop = tmp_path / "hammer.rec", tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", HAMMER, str(path), str(stop)],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        fd = os.open(path, os.O_RDONLY)
        snapshots, busy, raw_reads, raw_torn = 0, 0, 0, 0
        seen: set[int] = set()
        started = time.monotonic()
        try:
            while time.monotonic() - started < 30:
                try:
                    rec = record.read_fd(fd)
                except RecordBusy:
                    busy += 1
                else:
                    snapshots += 1
                    seen.add(rec.collectives)
                    assert torn(rec) is None, f"torn snapshot: {torn(rec)}"
                # The control: the same bytes without the seqlock do tear sometimes, which
                # shows the hammer really overlaps the reads checked above.
                raw = os.pread(fd, RECORD_SIZE, 0)
                raw_reads += 1
                try:
                    raw_torn += torn(record.decode(raw)) is not None
                except RecordError:
                    raw_torn += 1
                if snapshots >= 5000 and raw_torn >= 1 and len(seen) >= 100:
                    break
        finally:
            os.close(fd)
        stop.touch()
        out, _ = writer.communicate(timeout=20)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0
    assert snapshots >= 5000, (snapshots, busy)
    assert busy < snapshots / 10, (snapshots, busy)
    assert len(seen) >= 100, "the reads did not follow the writer"
    assert raw_torn >= 1, f"no torn raw copy in {raw_reads}: the test did not overlap writes"
    assert int(out.split()[-1]) >= max(seen)


def test_a_record_held_mid_write_raises_busy_after_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "1.rec"
    writer = make_writer(path)
    write_hot(writer, 1, 1, 1, 1, Phase.RUNNING, 0, 0, 0, 0, 0, 0)
    writer.begin()  # and never end: seq stays odd
    fd = os.open(path, os.O_RDONLY)
    try:
        started = time.monotonic()
        with pytest.raises(RecordBusy):
            record.read_fd(fd, attempts=3)
        assert time.monotonic() - started < 0.5
    finally:
        os.close(fd)
    started = time.monotonic()
    with pytest.raises(RecordBusy, match="mid-write"):
        record.read_path(str(path))
    assert time.monotonic() - started < 5
    assert issubclass(RecordBusy, RecordError)
    writer.end()
    assert record.read_path(str(path)).collectives == 1
    writer.close(record.STATUS_CLOSED)


# -- rejection of bad files ----------------------------------------------------------------

CORRUPTIONS = {
    "magic": lambda b: put(b, "<8s", 0, b"MLXWDRAC"),
    "magic zeroed": lambda b: put(b, "<8s", 0, b"\0" * 8),
    "version 0": lambda b: put(b, "<H", 8, 0),
    "version 2": lambda b: put(b, "<H", 8, RECORD_VERSION + 1),
    "version 65535": lambda b: put(b, "<H", 8, 65535),
    "size field": lambda b: put(b, "<I", 12, RECORD_SIZE * 2),
    "size field 0": lambda b: put(b, "<I", 12, 0),
    "pid 0": lambda b: put(b, "<q", 16, 0),
    "pid negative": lambda b: put(b, "<q", 16, -5),
    "phase 0": lambda b: put(b, "<Q", PHASE_AT, 0),
    "phase 99": lambda b: put(b, "<Q", PHASE_AT, 99),
    "phase huge": lambda b: put(b, "<Q", PHASE_AT, 2**64 - 1),
    "expect NaN": lambda b: put(b, "<d", record.EXPECT_OFFSET, math.nan),
    "expect negative": lambda b: put(b, "<d", record.EXPECT_OFFSET, -1.0),
    "expect -inf": lambda b: put(b, "<d", record.EXPECT_OFFSET, -math.inf),
    "all zero": lambda b: bytearray(RECORD_SIZE),
    "all ones": lambda b: bytearray(b"\xff" * RECORD_SIZE),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_a_corrupt_record_is_rejected_with_record_error(tmp_path: Path, name: str) -> None:
    data = bytes(CORRUPTIONS[name](valid_bytes(tmp_path)))
    with pytest.raises(RecordError) as err:
        record.decode(data)
    assert type(err.value) is RecordError
    path = tmp_path / "bad.rec"
    path.write_bytes(data)
    with pytest.raises(RecordError):
        record.read_path(str(path))


def test_a_foreign_version_says_which_versions(tmp_path: Path) -> None:
    data = put(valid_bytes(tmp_path), "<H", 8, RECORD_VERSION + 1)
    with pytest.raises(RecordError, match=rf"version {RECORD_VERSION + 1}\b.*\b{RECORD_VERSION}\b"):
        record.decode(bytes(data))


@pytest.mark.parametrize("length", [0, 1, 200, RECORD_SIZE - 1])
def test_a_truncated_file_is_rejected(tmp_path: Path, length: int) -> None:
    path = tmp_path / "short.rec"
    path.write_bytes(bytes(valid_bytes(tmp_path)[:length]))
    with pytest.raises(RecordError, match="truncated"):
        record.read_path(str(path))


@pytest.mark.parametrize("length", [0, 100, RECORD_SIZE - 1, RECORD_SIZE + 1, 2 * RECORD_SIZE])
def test_decode_rejects_a_buffer_of_the_wrong_size(tmp_path: Path, length: int) -> None:
    data = bytes(valid_bytes(tmp_path)) * 2
    with pytest.raises(RecordError, match="size"):
        record.decode(data[:length])


def test_a_symlink_is_not_followed(tmp_path: Path) -> None:
    real = tmp_path / "real.rec"
    real.write_bytes(bytes(valid_bytes(tmp_path)))
    assert record.read_path(str(real)).pid == IDENTITY["pid"]
    link = tmp_path / "link.rec"
    link.symlink_to(real)
    with pytest.raises(RecordError):
        record.read_path(str(link))
    dangling = tmp_path / "dangling.rec"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(RecordError):
        record.read_path(str(dangling))


def test_a_missing_file_is_a_record_error(tmp_path: Path) -> None:
    with pytest.raises(RecordError):
        record.read_path(str(tmp_path / "gone.rec"))


def test_a_directory_is_a_record_error(tmp_path: Path) -> None:
    # A directory (or anything but a regular file) named like a record must be reported,
    # not crash the scanner with IsADirectoryError.
    directory = tmp_path / "7.rec"
    directory.mkdir()
    with pytest.raises(RecordError):
        record.read_path(str(directory))


def test_a_fifo_is_a_record_error(tmp_path: Path) -> None:
    fifo = tmp_path / "8.rec"
    os.mkfifo(fifo)
    with pytest.raises(RecordError):
        record.read_path(str(fifo))


def test_non_utf8_text_decodes_without_error(tmp_path: Path) -> None:
    data = valid_bytes(tmp_path)
    put(data, "<64s", 56, b"host-\xff\xfe\xc3")
    put(data, "<64s", 120, b"\x80job\xed\xa0\x80")
    put(data, "<16s", 184, b"ri\xffng")
    put(data, "<48s", REASON_AT, b"\xc0\xafreason")
    path = tmp_path / "text.rec"
    path.write_bytes(bytes(data))
    rec = record.read_path(str(path))
    assert rec.host.startswith("host-") and "\ufffd" in rec.host
    assert "job" in rec.job and "\ufffd" in rec.job
    assert rec.backend == "ri\ufffdng"
    assert rec.expect_reason.endswith("reason")


def test_unknown_op_and_dtype_codes_decode_as_placeholders(tmp_path: Path) -> None:
    data = valid_bytes(tmp_path)
    put(data, "<Q", OP_AT, 999)  # op waited on
    put(data, "<QQQHHI", record.FLIGHT_OFFSET + 3 * 32, 3, 9, 9, 65535, 4000, 0)
    rec = record.decode(bytes(data))
    assert rec.op == "?999"
    assert record.Collective(3, "?65535", "?4000", 9, 9) in rec.flight


# -- the documentation ---------------------------------------------------------------------


def test_the_python_snippet_in_the_format_doc_reads_a_live_record(tmp_path: Path) -> None:
    doc = (REPO / "docs" / "record-format.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert blocks, "docs/record-format.md has no python snippet"
    namespace: dict[str, object] = {}
    exec(compile(blocks[-1], "record-format.md", "exec"), namespace)  # noqa: S102
    writer = make_writer(tmp_path / "4242.rec")
    write_hot(writer, 7, 9, 8, 3, Phase.WAIT, record.OP_CODE["eval"], 1, 2, 3, 4, 5)
    writer.begin()
    writer.write_expect(30.0, 6, "load")
    writer.write_entry(7, 11, 64, record.OP_CODE["all_sum"], record.DTYPE_CODE["float32"])
    writer.end()
    got = namespace["read_record"](writer.path)  # type: ignore[operator]
    assert got["pid"] == IDENTITY["pid"] and got["rank"] == IDENTITY["rank"]
    assert got["job"] == IDENTITY["job"] and got["host"] == IDENTITY["host"]
    assert (got["collectives"], got["waits_completed"], got["steps"]) == (7, 8, 3)
    assert got["phase"] == Phase.WAIT and got["op"] == record.OP_CODE["eval"]
    assert got["flight"] == [(7, 11, 64, record.OP_CODE["all_sum"],
                              record.DTYPE_CODE["float32"])]
    data = put(bytearray(Path(writer.path).read_bytes()), "<H", 8, RECORD_VERSION + 1)
    other = tmp_path / "other.rec"
    other.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        namespace["read_record"](str(other))  # type: ignore[operator]
    writer.close(record.STATUS_CLOSED)
