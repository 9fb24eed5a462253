"""The rank record: byte layout round trip, consistent reads of a live record (v2 without a
lock, v1 under its seqlock), and rejection of bad files."""

from __future__ import annotations

import math
import os
import random
import re
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.support import REPO
from tests.support.record_v1 import V1Writer
from tests.support.records import SyntheticWriter
from watchdog import record
from watchdog.record import RECORD_SIZE, RECORD_VERSION, Record, RecordBusy, RecordError, layout
from watchdog.record.layout import FLIGHT_SLOTS
from watchdog.states import Phase

# Offsets of single fields, from the layout's own constants.
SLOT0 = layout.SLOTS_OFFSET
SINCE_AT = SLOT0 + 8 * layout.S_SINCE
OP_AT = SLOT0 + 8 * layout.S_OP
REASON_AT = layout.EXPECT_OFFSET + 16

IDENTITY = dict(pid=4242, start_time=1700000000.25, uid=501, host="mac-studio-1",
                job="j0123456789a", rank=2, world_size=3, backend="ring", dump_signal=12)


def make_writer(path: Path, **overrides: object) -> SyntheticWriter:
    fields = {**IDENTITY, **overrides}
    return SyntheticWriter(str(path), **fields)  # type: ignore[arg-type]


def write_hot(writer: SyntheticWriter, *values: int) -> None:
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


def valid_v1_bytes(tmp_path: Path) -> bytearray:
    """The bytes of a valid version-1 record, as a rank started before v2 leaves them."""
    path = tmp_path / "valid-v1.rec"
    writer = V1Writer(str(path), **IDENTITY)  # type: ignore[arg-type]
    writer.begin()
    writer.write_hot(1, 2, 2, 1, Phase.RUNNING, 0, 10, 0, 10, 5, 5)
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
    write_hot(writer, 11, 22, 21, 5, Phase.WAIT, record.OP_CODE["item"], 2000, 2000, 3000,
              4000, 5000)
    writer.begin()
    writer.write_expect(900.5, 6000, "checkpoint")
    writer.write_entry(11, 7000, 4096, record.OP_CODE["all_gather"],
                       record.DTYPE_CODE["bfloat16"])
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
    assert (rec.phase_since_ns, rec.wait_since_ns, rec.last_progress_ns) == (2000, 2000, 3000)
    assert (rec.last_wait_ns, rec.max_wait_ns) == (4000, 5000)
    assert (rec.expect_seconds, rec.expect_since_ns, rec.expect_reason) == (900.5, 6000,
                                                                             "checkpoint")
    assert rec.flight == (record.Collective(11, "all_gather", "bfloat16", 4096, 7000),)
    assert rec.version == 3 and rec.waiting_threads == 1
    # The same bytes decode the same way without the file.
    assert record.decode(path.read_bytes()) == rec

    writer.close(record.STATUS_CLOSED, remove=False)
    closed = record.read_path(str(path))
    assert closed.status == record.STATUS_CLOSED and closed.closed
    assert closed.collectives == 11  # closing keeps the last numbers for the reader


def test_every_op_and_dtype_name_round_trips(tmp_path: Path) -> None:
    writer = make_writer(tmp_path / "1.rec")
    pairs = list(zip(record.OPS[1:], (record.DTYPES[1:] * 3)[:len(record.OPS) - 1], strict=True))
    write_hot(writer, len(pairs), 0, 0, 0, Phase.RUNNING, 0, 0, 0, 0, 0, 0)
    writer.begin()
    for number, (op, dtype) in enumerate(pairs, start=1):
        writer.write_entry(number, number * 10, number * 100, record.OP_CODE[op],
                           record.DTYPE_CODE[dtype])
    writer.end()
    rec = record.read_path(writer.path)
    assert [(c.op, c.dtype) for c in rec.flight] == pairs
    for op in record.OPS[1:]:
        write_hot(writer, 0, 0, 0, 0, Phase.WAIT, record.OP_CODE[op], 1, 1, 0, 0, 0)
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

HAMMER_V1 = textwrap.dedent("""
    import os, sys, time
    from tests.support.record_v1 import V1Writer
    from watchdog import record
    from watchdog.states import Phase

    path, stop = sys.argv[1], sys.argv[2]
    w = V1Writer(path, pid=os.getpid(), start_time=1.0, uid=os.getuid(), host="h",
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
            w.set_identity(rank=k % 8000, world_size=k % 8000)  # within MAX_WORLD_SIZE
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


def torn_v1(rec: Record) -> str | None:
    """Why `rec` is not one of the v1 hammer's states, or None if it is one."""
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


@pytest.mark.slow
def test_concurrent_reads_of_a_v1_record_never_see_a_torn_record(tmp_path: Path) -> None:
    # A rank started before the upgrade writes v1 under its seqlock; the reader keeps
    # honouring it.
    path, stop = tmp_path / "hammer.rec", tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", HAMMER_V1, str(path), str(stop), str(REPO)],
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
                    assert rec.version == 1
                    assert torn_v1(rec) is None, f"torn snapshot: {torn_v1(rec)}"
                # The control: the same bytes without the seqlock do tear sometimes, which
                # shows the hammer really overlaps the reads checked above.
                raw = os.pread(fd, V1_SIZE, 0)
                raw_reads += 1
                try:
                    raw_torn += torn_v1(record.decode(raw)) is not None
                except RecordError:
                    raw_torn += 1
                if snapshots >= 3000 and raw_torn >= 1 and len(seen) >= 100:
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
    assert snapshots >= 3000, (snapshots, busy)
    assert busy < snapshots / 10, (snapshots, busy)
    assert len(seen) >= 100, "the reads did not follow the writer"
    assert raw_torn >= 1, f"no torn raw copy in {raw_reads}: the test did not overlap writes"
    assert int(out.split()[-1]) >= max(seen)


V1_SIZE = layout.SIZES[1]
THREADS = 3

# A rank's hot path at full speed in THREADS threads: each loops enter_wait, a collective,
# exit_wait, step, with nothing between. Collective n of thread t says nbytes = 16 n + t, so
# a reader can tell every flight entry's thread and number from its own bytes.
HAMMER_V2 = textwrap.dedent("""
    import os, sys, threading, time
    import mlx.core as mx
    import watchdog
    from watchdog import record

    directory, stop = sys.argv[1], sys.argv[2]
    threads = int(sys.argv[3])
    hb = watchdog.install(directory)
    assert hb.active
    EVAL, SUM = record.OP_CODE["eval"], record.OP_CODE["all_sum"]

    class Out:
        dtype = mx.float32
        nbytes = 0

    def hammer(t):
        out, n = Out(), 0
        enter, leave, issued, step = hb.enter_wait, hb.exit_wait, hb.collective, hb.step
        deadline = time.monotonic() + 60  # a safety net; the test stops us long before
        while True:
            for _ in range(1000):
                started = enter(EVAL)
                n += 1
                out.nbytes = 16 * n + t
                issued(SUM, out)
                leave(started, EVAL)
                step()
            if os.path.exists(stop) or time.monotonic() > deadline:
                return

    workers = [threading.Thread(target=hammer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    print(hb.path, flush=True)
    for w in workers:
        w.join()
    print(hb.collectives, flush=True)
""")


def torn(rec: Record, threads: int = THREADS) -> str | None:
    """Why `rec` is not a state the v2 hammer can be in, or None.

    A slot's words are read one by one while the writer runs, so a word stored later
    in the writer's cycle (steps) may read newer than one stored before it (completed):
    with the compiled hot path a thread goes round its cycle in about 100 ns. No
    relation between two counters is promised, only that each one grows (checked by
    the caller) and that a flight entry is whole.
    """
    if not 0 <= rec.waits_entered - rec.waits_completed <= threads:
        return f"entered {rec.waits_entered}, completed {rec.waits_completed}"
    # (a wait is closed a moment before it is counted: entered may lag by one a thread)
    if rec.waiting_threads > threads or (rec.phase is Phase.WAIT) != bool(rec.waiting_threads):
        return f"phase {rec.phase} with {rec.waiting_threads} threads waiting"
    if rec.phase is Phase.WAIT and (rec.wait_since_ns > time.monotonic_ns()
                                    or rec.op != "eval"):
        return f"wait since {rec.wait_since_ns} on {rec.op!r}"
    # A reader that could not get two close copies leaves out entries it cannot vouch
    # for (counted by the caller), but the ones it gives are whole.
    if len(rec.flight) > min(FLIGHT_SLOTS, rec.collectives):
        return f"{len(rec.flight)} flight entries for {rec.collectives} collectives"
    if rec.flight and rec.flight[-1].number != rec.collectives:
        return "the newest flight entry is not the last collective"
    last: dict[int, tuple[int, int]] = {}
    for c in rec.flight:
        n, t = divmod(c.nbytes, 16)
        if (c.op, c.dtype) != ("all_sum", "float32") or t >= threads:
            return f"flight entry {c}"
        if t in last and (n != last[t][0] + 1 or c.issued_ns < last[t][1]):
            return f"thread {t}: entry {n} after {last[t]} (a torn or missing entry)"
        last[t] = (n, c.issued_ns)
    return None


def raw_ring_torn(raw: bytes) -> bool:
    """The control: each slot's ring read naively from one copy, with the entry that may be
    in rewrite (the 65th): does it hold an entry that is not whole?"""
    for k in range(layout.THREAD_SLOTS):
        words = layout.SLOT.unpack_from(raw, layout.SLOTS_OFFSET + k * layout.SLOT_SIZE)
        n = words[layout.S_COLLECTIVES]
        prev = None
        for m in range(max(1, n - layout.RING + 1), n + 1):
            i = layout.S_RING + 2 * (m % layout.RING)
            issued, nbytes = words[i], words[i + 1] >> layout.KIND_SHIFT
            if nbytes // 16 != m or (prev is not None and issued < prev):
                return True
            prev = issued
    return False


def start_hammer(tmp_path: Path, threads: int = THREADS
                 ) -> tuple[subprocess.Popen[str], Path, Path]:
    records, stop = tmp_path / "records", tmp_path / "stop"
    records.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HAMMER_V2, str(records), str(stop),
                             str(threads)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().strip())
    assert path.name.endswith(".rec"), path
    return proc, path, stop


def stop_hammer(proc: subprocess.Popen[str], stop: Path) -> int:
    stop.touch()
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    return int(out.split()[-1])


@pytest.mark.slow
@pytest.mark.usefixtures("hotpath")
def test_concurrent_reads_of_a_live_hot_path_never_see_a_torn_record(tmp_path: Path) -> None:
    # v2 has no lock and no seqlock on the hot path: three threads of a real Heartbeat
    # write their slots flat out while this reads. Every snapshot must be a state the
    # writer can be in, and every counter must only grow from one snapshot to the next.
    proc, path, stop = start_hammer(tmp_path)
    try:
        fd = os.open(path, os.O_RDONLY)
        snapshots, raw_reads, raw_torn, short = 0, 0, 0, 0
        previous: Record | None = None
        started = time.monotonic()
        try:
            while time.monotonic() - started < 30:
                rec = record.read_fd(fd)  # RecordBusy is a failure: the hot path has no seqlock
                snapshots += 1
                assert rec.version == record.RECORD_VERSION
                assert torn(rec) is None, f"torn snapshot: {torn(rec)}"
                short += len(rec.flight) < min(FLIGHT_SLOTS, rec.collectives)
                if previous is not None:
                    for field in ("collectives", "waits_completed", "steps",
                                  "last_progress_ns", "max_wait_ns"):
                        assert getattr(rec, field) >= getattr(previous, field), field
                    # Entered is derived (completed + open waits): a thread closes its
                    # wait before it counts it (no call in between, for signal safety),
                    # so a read in that gap sees one fewer, never more than one a thread.
                    assert (rec.waits_entered
                            >= previous.waits_entered - previous.waiting_threads)
                previous = rec
                raw = os.pread(fd, record.RECORD_SIZE, 0)
                raw_reads += 1
                raw_torn += raw_ring_torn(raw)
                if snapshots >= 3000 and raw_torn >= 3 and rec.collectives >= 100_000:
                    break
        finally:
            os.close(fd)
    finally:
        total = stop_hammer(proc, stop)
    assert snapshots >= 3000, snapshots
    assert short < snapshots / 20, f"{short} of {snapshots} reads without a whole flight"
    assert previous is not None and previous.collectives >= 10_000, "the hammer did not run"
    assert raw_torn >= 3, f"no torn raw ring in {raw_reads} reads: the test did not overlap"
    assert total >= previous.collectives


@pytest.mark.slow
@pytest.mark.usefixtures("hotpath")
def test_a_rank_stopped_anywhere_in_its_hot_path_leaves_a_whole_record(tmp_path: Path) -> None:
    # SIGSTOP lands wherever the rank is: with v1 about 1 stop in 100 froze the seqlock odd
    # (the record then read only as RecordBusy's last copy). A v2 hot path writes no seqlock:
    # every stop, wherever it lands, must leave a record that reads whole at once.
    proc, path, stop = start_hammer(tmp_path, threads=2)
    rng = random.Random(13)
    stops = 0
    try:
        ps = psutil.Process(proc.pid)
        while stops < 150:
            time.sleep(rng.uniform(0, 0.003))
            proc.send_signal(signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 10
                while ps.status() != psutil.STATUS_STOPPED:
                    assert time.monotonic() < deadline, "the hammer did not stop"
                    time.sleep(0.001)
                fd = os.open(path, os.O_RDONLY)
                try:
                    rec = record.read_fd(fd, attempts=3)  # busy here is the failure
                    assert rec.version == record.RECORD_VERSION
                    assert torn(rec, threads=2) is None, f"stop {stops}: {torn(rec, 2)}"
                finally:
                    os.close(fd)
            finally:
                proc.send_signal(signal.SIGCONT)
            stops += 1
    finally:
        stop_hammer(proc, stop)
    assert stops == 150


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
    "version 3": lambda b: put(b, "<H", 8, RECORD_VERSION + 1),
    "version 1 in a v2 file": lambda b: put(b, "<H", 8, 1),
    "version 65535": lambda b: put(b, "<H", 8, 65535),
    "size field": lambda b: put(b, "<I", 12, RECORD_SIZE * 2),
    "size field 0": lambda b: put(b, "<I", 12, 0),
    "size field of v1": lambda b: put(b, "<I", 12, V1_SIZE),
    "pid 0": lambda b: put(b, "<q", 16, 0),
    "pid negative": lambda b: put(b, "<q", 16, -5),
    "expect NaN": lambda b: put(b, "<d", layout.EXPECT_OFFSET, math.nan),
    "expect negative": lambda b: put(b, "<d", layout.EXPECT_OFFSET, -1.0),
    "expect -inf": lambda b: put(b, "<d", layout.EXPECT_OFFSET, -math.inf),
    "all zero": lambda b: bytearray(RECORD_SIZE),
    "all ones": lambda b: bytearray(b"\xff" * RECORD_SIZE),
}

V1_PHASE_AT = 208 + 4 * 8
V1_CORRUPTIONS = {
    "phase 0": lambda b: put(b, "<Q", V1_PHASE_AT, 0),
    "phase 99": lambda b: put(b, "<Q", V1_PHASE_AT, 99),
    "phase huge": lambda b: put(b, "<Q", V1_PHASE_AT, 2**64 - 1),
    "expect NaN": lambda b: put(b, "<d", 296, math.nan),
    "version 2 in a v1 file": lambda b: put(b, "<H", 8, 2),
    "size field": lambda b: put(b, "<I", 12, RECORD_SIZE),
    "pid 0": lambda b: put(b, "<q", 16, 0),
}


@pytest.mark.parametrize("name", sorted(V1_CORRUPTIONS))
def test_a_corrupt_v1_record_is_rejected_with_record_error(tmp_path: Path, name: str) -> None:
    data = bytes(V1_CORRUPTIONS[name](valid_v1_bytes(tmp_path)))
    with pytest.raises(RecordError) as err:
        record.decode(data)
    assert type(err.value) is RecordError
    path = tmp_path / "bad.rec"
    path.write_bytes(data)
    with pytest.raises(RecordError):
        record.read_path(str(path))


def test_a_v1_record_still_reads_every_field(tmp_path: Path) -> None:
    # A rank started before the upgrade keeps its v1 record until it exits.
    path = tmp_path / "4242.rec"
    writer = V1Writer(str(path), **IDENTITY)  # type: ignore[arg-type]
    writer.begin()
    writer.write_hot(11, 22, 21, 5, Phase.WAIT, record.OP_CODE["item"], 1000, 2000, 3000,
                     4000, 5000)
    writer.write_expect(900.5, 6000, "checkpoint")
    writer.write_entry(1, 7000, 4096, record.OP_CODE["all_gather"],
                       record.DTYPE_CODE["bfloat16"])
    writer.end()
    assert path.stat().st_size == V1_SIZE
    rec = record.read_path(str(path))
    assert rec.version == 1 and rec.waiting_threads == 1
    assert (rec.pid, rec.rank, rec.world_size, rec.job) == (4242, 2, 3, "j0123456789a")
    assert (rec.collectives, rec.waits_entered, rec.waits_completed, rec.steps) == (11, 22, 21, 5)
    assert rec.phase is Phase.WAIT and rec.op == "item"
    assert (rec.phase_since_ns, rec.wait_since_ns, rec.last_progress_ns) == (1000, 2000, 3000)
    assert (rec.last_wait_ns, rec.max_wait_ns) == (4000, 5000)
    assert (rec.expect_seconds, rec.expect_reason) == (900.5, "checkpoint")
    assert rec.flight == (record.Collective(1, "all_gather", "bfloat16", 4096, 7000),)
    writer.begin()  # and its seqlock is honoured
    with pytest.raises(RecordBusy):
        record.read_path(str(path))
    writer.end()
    writer.close(record.STATUS_CLOSED, remove=False)
    assert record.read_path(str(path)).closed


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
    put(data, "<QQ", SINCE_AT, 5, 999)  # in a wait on op 999
    put(data, "<QQ", SLOT0 + 8 * (layout.S_RING + 2), 9, 9 << 16 | 200 << 8 | 250)
    rec = record.decode(bytes(data))
    assert rec.op == "?999" and rec.phase is Phase.WAIT
    assert record.Collective(1, "?250", "?200", 9, 9) in rec.flight


# -- the documentation ---------------------------------------------------------------------


@pytest.mark.usefixtures("hotpath")
def test_the_python_snippet_in_the_format_doc_reads_a_live_record(tmp_path: Path) -> None:
    doc = (REPO / "docs" / "record-format.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert blocks, "docs/record-format.md has no python snippet"
    namespace: dict[str, object] = {}
    exec(compile(blocks[-1], "record-format.md", "exec"), namespace)  # noqa: S102
    read_record = namespace["read_record"]
    # A live record, written by the hook's own hot path in two threads.
    from watchdog.rank.hook import Heartbeat

    writer = make_writer(tmp_path / "4242.rec")
    hb = Heartbeat(writer)

    class Out:
        nbytes, dtype = 64, None

    for _ in range(70):
        hb.collective(record.OP_CODE["all_sum"], Out())
    waiting, release = threading.Event(), threading.Event()

    def other() -> None:
        hb.step()
        started = hb.enter_wait(record.OP_CODE["item"])
        waiting.set()
        release.wait(30)
        hb.exit_wait(started, record.OP_CODE["item"])

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert waiting.wait(30)
        started = hb.enter_wait(record.OP_CODE["eval"])
        hb.exit_wait(started, record.OP_CODE["eval"])
        with hb.expect(30.0, "load"):
            got = read_record(writer.path)  # type: ignore[operator]
            rec = record.read_path(writer.path)
    finally:
        release.set()
        thread.join()
    assert got["pid"] == IDENTITY["pid"] and got["rank"] == IDENTITY["rank"]
    assert got["job"] == IDENTITY["job"] and got["host"] == IDENTITY["host"]
    assert (got["collectives"], got["waits_completed"], got["steps"]) == (70, 1, 1)
    assert (got["collectives"], got["waits_completed"], got["steps"]) == (
        rec.collectives, rec.waits_completed, rec.steps)
    assert got["waiting_threads"] == rec.waiting_threads == 1
    assert got["op"] == record.OP_CODE["item"] and got["wait_since_ns"] == rec.wait_since_ns
    assert (got["expect_seconds"], got["expect_reason"]) == (30.0, "load")
    assert got["last_progress_ns"] == rec.last_progress_ns
    assert [(i, n, op) for i, n, _, op in got["flight"]] == [
        (c.issued_ns, c.nbytes, record.OP_CODE[c.op]) for c in rec.flight]
    assert len(got["flight"]) == 64
    # The pace table: the one eval counted (the item is still open), as the reader sums it.
    assert got["pace"] == {record.OP_CODE["eval"]: (1, rec.max_wait_ns)}
    assert rec.pace == (record.Pace("eval", 1, rec.max_wait_ns),)
    data = put(bytearray(Path(writer.path).read_bytes()), "<H", 8, RECORD_VERSION + 1)
    other_path = tmp_path / "other.rec"
    other_path.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        read_record(str(other_path))  # type: ignore[operator]
    hb.close()


def test_the_seqlock_reader_reads_seq_before_the_identity(record_dir, monkeypatch):
    """A write that starts and ends while one pread copies the record: the copy
    holds the old identity and the new (even) seq. Taken alone, the copy's seq
    and a re-read agree: a torn record. The seq read first differs."""
    path = record_dir / "r.rec"
    w = SyntheticWriter(str(path), pid=os.getpid(), start_time=1.0, uid=os.getuid(), host="h",
                     job="old-job", rank=0, world_size=2, backend="ring", dump_signal=0)
    old = path.read_bytes()
    w.set_identity(rank=1, world_size=2, job="new-job")
    w.close(record.STATUS_OPEN, remove=False)
    new = path.read_bytes()
    torn = old[:layout.SEQ_OFFSET] + new[layout.SEQ_OFFSET:]  # old identity, new seq
    state = {"copied": False}
    real_pread = os.pread

    def pread(fd, size, offset):
        if size == record.RECORD_SIZE:
            first, state["copied"] = not state["copied"], True
            return torn if first else new
        current = new if state["copied"] else old  # the writer finished during the copy
        return current[offset:offset + size]

    monkeypatch.setattr(os, "pread", pread)
    fd = os.open(path, os.O_RDONLY)
    try:
        rec = record.read_fd(fd)
    finally:
        monkeypatch.setattr(os, "pread", real_pread)
        os.close(fd)
    assert (rec.job, rec.rank) == ("new-job", 1)


def test_the_writer_holds_only_what_a_program_of_ours_writes():
    """Writes only tests make (a whole state, a pace entry, a collective) live in
    tests/support/records.py: every public method of RecordWriter is called by the package."""
    package = REPO / "watchdog"
    source = "\n".join(p.read_text(encoding="utf-8") for p in package.rglob("*.py")
                       if p.name != "writer.py")
    methods = [n for n in vars(record.RecordWriter) if not n.startswith("_")
               and callable(getattr(record.RecordWriter, n))]
    assert methods and all(f".{name}(" in source for name in methods), methods
    assert not {"write_hot", "write_pace", "write_entry"} & set(vars(record.RecordWriter))
