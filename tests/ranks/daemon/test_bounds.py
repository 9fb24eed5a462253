"""Bounds: the daemon's memory, descriptors and work per scan under churn, junk and garbage.

The real daemon runs as a subprocess. Short-lived "ranks" are synthetic records
(SyntheticWriter) for live sleeping processes this test owns, so ten thousand
records cost no MLX process each; the hung jobs beside the junk are real ring
ranks.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.support.ranks import DaemonProc, RingJob, http_get, wait_for
from tests.support.records import SyntheticWriter
from watchdog import record
from watchdog.daemon.store import journal
from watchdog.record import OP_CODE, RECORD_SIZE, layout
from watchdog.states import Phase

pytestmark = pytest.mark.ranks

MB = 1 << 20


class Sleepers:
    """Plain `sleep` processes to stand behind synthetic records."""

    def __init__(self, count: int) -> None:
        self.procs = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
        self.start_times = {p.pid: psutil.Process(p.pid).create_time() for p in self.procs}

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


@pytest.fixture
def sleepers():
    made: list[Sleepers] = []

    def make(count: int) -> Sleepers:
        made.append(Sleepers(count))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def write_record(path: Path, pid: int, start_time: float, *, job: str, host: str = "h",
                 rank: int = 0, world_size: int = 1, phase: Phase = Phase.RUNNING,
                 wait_since: int = 0) -> SyntheticWriter:
    writer = SyntheticWriter(str(path), pid=pid, start_time=start_time, uid=os.getuid(), host=host,
                          job=job, rank=rank, world_size=world_size, backend="ring",
                          dump_signal=0)
    now = time.monotonic_ns()
    writer.begin()
    writer.write_hot(1, 1, 1, 0, phase, OP_CODE["eval"] if wait_since else 0, now, wait_since,
                     now, 0, 0)
    writer.end()
    return writer


def daemon_usage(daemon: DaemonProc) -> tuple[int, int]:
    proc = psutil.Process(daemon.proc.pid)
    return proc.memory_info().rss, proc.num_fds()


def all_exited(job: RingJob) -> bool:
    return all(p.poll() is not None for p in job.procs)


def freeze_and_expect_end(daemon: DaemonProc, job: RingJob, bound: float) -> dict:
    """SIGSTOP rank 1; the daemon must end the whole job within `bound` seconds."""
    job.wait_running()
    job.signal(1, signal.SIGSTOP)
    stopped = time.time()
    wait_for(lambda: all_exited(job), bound, what="the real hung job to be ended")
    inc = wait_for(lambda: [i for i in daemon.incidents() if set(i["pids"]) == set(job.pids)],
                   10, what="its incident")[-1]
    assert inc["culprit"]["pid"] == job.procs[1].pid
    assert min(s["time"] for s in inc["signals"]) - stopped < bound
    return inc


# -- churn ------------------------------------------------------------------------------

BATCH = 100


def churn(daemon: DaemonProc, sleepers: Sleepers, record_dir: Path, batch: int,
          job_of) -> None:
    """One batch: a record per sleeper, seen by the daemon, then closed and removed."""
    host = f"batch-{batch}"
    writers = [write_record(record_dir / f"{host}-{i}.rec", p.pid, sleepers.start_times[p.pid],
                            job=job_of(batch, i), host=host)
               for i, p in enumerate(sleepers.procs)]
    wait_for(lambda: sum(r["host"] == host for r in daemon.status()["ranks"]) == len(writers),
             20, interval=0.02, what=f"the daemon to see {host}")
    for w in writers:
        w.close(record.STATUS_CLOSED)
    wait_for(lambda: not daemon.status()["ranks"], 20, interval=0.02,
             what=f"the daemon to forget {host}")


def test_memory_and_fds_stay_flat_while_ten_thousand_records_come_and_go(
        tmp_path, record_dir, state_dir, sleepers):
    pool = sleepers(BATCH)
    batches = 100  # 10,000 records
    with DaemonProc(record_dir, state_dir, "--log-level", "info", interval=0.05, retention=0,
                    deadline=60) as daemon:
        def job_of(batch: int, i: int) -> str:
            return f"train-{i % 20}"  # twenty jobs that keep coming back

        for batch in range(20):  # warm-up: imports, caches, the allocator's arenas
            churn(daemon, pool, record_dir, batch, job_of)
        time.sleep(1)  # the exit watcher drops the pidfds of forgotten ranks within 0.2 s
        rss0, fds0 = daemon_usage(daemon)
        for batch in range(20, batches):
            churn(daemon, pool, record_dir, batch, job_of)
        time.sleep(1)
        rss1, fds1 = daemon_usage(daemon)
        print(f"rss {rss0 / MB:.1f} -> {rss1 / MB:.1f} MiB, fds {fds0} -> {fds1}")
        assert pool.alive(), "a sleeper was signalled"
        assert daemon.incidents() == []
        assert rss1 - rss0 < 15 * MB, (rss0, rss1)
        assert fds1 - fds0 < 10, (fds0, fds1)
        assert daemon.status()["counters"]["loop_errors"] == 0
        # Nothing left but the daemon's own pointer (which says who watches the directory).
        assert [p.name for p in record_dir.iterdir()] == [journal.POINTER]
        # Every record was watched: 10,000 "watching" lines, none missed.
        assert daemon.log().count("watching pid") >= batches * BATCH


def test_a_record_removed_while_being_read_is_not_invalid(tmp_path, monkeypatch):
    """A rank that exits between the daemon's listing and its open is gone, not garbage
    (otherwise every clean exit may bump mlx_watchdog_invalid_records_total, which
    fires the MLXWatchdogInvalidRecords alert)."""
    from watchdog.daemon import recdir

    me = psutil.Process()
    path = tmp_path / f"{me.pid}.rec"
    write_record(path, me.pid, me.create_time(), job="j").close(record.STATUS_CLOSED,
                                                                remove=False)
    real_read_path = record.read_path

    def exits_meanwhile(p: str, *args, **kwargs) -> record.Record:
        os.unlink(p)  # the rank closes and removes its record right now
        return real_read_path(p, *args, **kwargs)

    monkeypatch.setattr(recdir.record, "read_path", exits_meanwhile)
    rec, why, _ = recdir.read_record(str(path))
    assert rec is None and why == "", why


def test_series_of_finished_jobs_do_not_accumulate(tmp_path, record_dir, state_dir, sleepers):
    """2,000 healthy one-rank jobs come and go: none may stay in /metrics or /status.

    A job that was killed keeps its kill counter for an hour (the repeated-kills
    alert looks back that far); a job never killed has nothing to count once its
    ranks are forgotten. Otherwise a node serving many short jobs exports a series
    per job of the last hour and rewrites them all into status.json on every scan.
    """
    pool = sleepers(BATCH)
    with DaemonProc(record_dir, state_dir, interval=0.05, retention=0, deadline=60) as daemon:
        url = daemon.url()
        _, _, before = http_get(url + "/metrics")
        for batch in range(20):
            churn(daemon, pool, record_dir, batch, lambda b, i: f"job-{b}-{i}")
        time.sleep(0.5)
        _, _, after = http_get(url + "/metrics")
        jobs = daemon.status()["counters"]["job_kills"]
        assert len(jobs) <= 10, f"{len(jobs)} finished jobs still counted"
        assert len(after) - len(before) < 16 << 10, (len(before), len(after))


# -- junk -------------------------------------------------------------------------------

def fill_junk(record_dir: Path, count: int, prefix: str) -> None:
    """`count` junk files: half `*.rec` of wrong sizes, half other names."""
    rng = random.Random(7)
    for i in range(count):
        name = f"{prefix}{i:06d}" + (".rec" if i % 2 == 0 else rng.choice([".txt", ".tmp", ""]))
        with open(record_dir / name, "wb") as f:
            f.write(os.urandom(rng.choice([0, 1, 17, 100, 4095])))


def scan_figures(status: dict) -> tuple[float, float]:
    """(mean scan seconds, upper bound of the slowest scan's histogram bucket)."""
    c = status["counters"]
    bounds = [*status["scan_bucket_bounds"], float("inf")]
    slowest = max(i for i, n in enumerate(c["scan_buckets"]) if n)
    return c["scan_sum"] / c["scan_count"], bounds[slowest]


def test_junk_flood_keeps_scans_bounded_and_the_real_hang_is_ended(tmp_path, record_dir,
                                                                   state_dir):
    fill_junk(record_dir, 20_000, "zz-junk-")  # named to sort after the real records
    with DaemonProc(record_dir, state_dir, deadline=2) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        freeze_and_expect_end(daemon, job, 40)
        status = daemon.status()
        mean, slowest = scan_figures(status)
        print(f"{status['counters']['scan_count']} scans, mean {mean * 1000:.1f} ms, "
              f"slowest <= {slowest} s")
        assert mean < 1.0 and slowest <= 5.0  # 2 spinning ranks share the 2 cores
        # Each junk file is reported once at most, not on every scan.
        files = record_dir_count(record_dir)
        assert status["counters"]["invalid_records"] <= files
        assert daemon.log().count("skipping") <= files
        assert daemon.alive()


def record_dir_count(record_dir: Path) -> int:
    return sum(1 for _ in record_dir.iterdir())


def test_junk_named_to_sort_first_cannot_hide_a_real_hang(tmp_path, record_dir, state_dir):
    """Anyone may write in the (sticky, world-writable) record directory: 5,000 junk
    `*.rec` files that sort before every real record must not push the real ones
    past the per-scan limit for good."""
    for i in range(5_000):
        (record_dir / f"0-junk-{i:05d}.rec").write_bytes(b"")
    with DaemonProc(record_dir, state_dir, deadline=2) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        job.wait_running()
        wait_for(lambda: set(daemon.ranks()) >= set(job.pids), 20,
                 what="the daemon to watch the real ranks beside the junk")
        freeze_and_expect_end(daemon, job, 40)


# -- a thousand garbage records -----------------------------------------------------------

def garbage_files(record_dir: Path, template: bytes, count: int, seed: int = 1) -> dict[str, int]:
    """`count` files of fuzzed records in the directory; returns how many of each kind."""
    rng = random.Random(seed)
    kinds: dict[str, int] = {}
    seq_at, hot_at = layout.SEQ_OFFSET, layout.SLOTS_OFFSET  # slot 0's state
    for i in range(count):
        kind = ("random", "bitflip", "truncated", "version", "odd_seq", "absurd",
                "stale", "text")[i % 8]
        kinds[kind] = kinds.get(kind, 0) + 1
        data = bytearray(template)
        if kind == "random":
            data = bytearray(rng.randbytes(RECORD_SIZE))
        elif kind == "bitflip":
            for _ in range(rng.randint(1, 16)):
                data[rng.randrange(RECORD_SIZE)] ^= 1 << rng.randrange(8)
        elif kind == "truncated":
            data = data[: rng.randrange(RECORD_SIZE)]
        elif kind == "version":
            struct.pack_into("<H", data, 8, rng.choice([0, 2, 3, 255, 65535]))
        elif kind == "odd_seq":  # a writer that froze (or pretends to) mid-write
            struct.pack_into("<Q", data, seq_at, rng.randrange(1 << 62) * 2 + 1)
        elif kind == "absurd":
            for word in range(11):
                struct.pack_into("<Q", data, hot_at + 8 * word,
                                 rng.choice([0, 1, (1 << 64) - 1, 1 << 63, rng.randrange(1 << 64)]))
            struct.pack_into("<Q", data, hot_at + 8 * 4, rng.choice([1, 2, 3, 4]))  # a phase
            struct.pack_into("<q", data, 16, rng.choice([1, 2**31 - 1, 2**62]))  # pid
        elif kind == "stale":  # the live sleeper's pid, another start time
            struct.pack_into("<d", data, 24, rng.uniform(1e9, 1.7e9))
        elif kind == "text":
            for offset, size in ((56, 64), (120, 64), (184, 16), (312, 48)):
                data[offset:offset + size] = rng.randbytes(size)
        (record_dir / f"garbage-{i:04d}.rec").write_bytes(bytes(data))
    return kinds


def test_a_thousand_garbage_records_beside_a_real_hung_job(tmp_path, record_dir, state_dir,
                                                           sleepers):
    victim = sleepers(1)
    pid = victim.procs[0].pid
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "t.rec"
        # The template claims a wait as old as the machine: only the identity
        # (a live process we own, with its real start time) would make it count.
        w = write_record(path, pid, victim.start_times[pid] + 1000.0, job="garbage",
                         world_size=2, phase=Phase.WAIT, wait_since=1)
        template = path.read_bytes()
        w.close(record.STATUS_CLOSED)
    kinds = garbage_files(record_dir, template, 1000)
    assert sum(kinds.values()) == 1000
    with DaemonProc(record_dir, state_dir, deadline=2) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        inc = freeze_and_expect_end(daemon, job, 45)
        assert inc["verdict"] == "stalled"
        # The garbage is read 16 files a scan (its owner's share: MAX_READS_PER_UID),
        # the job's own new records first: all of it read soon after the kill.
        status = wait_for(lambda: (s := daemon.status())["counters"]["invalid_records"]
                          >= 800 and s, 40, what="the garbage read")
        assert status["counters"]["loop_errors"] == 0
        mean, slowest = scan_figures(status)
        print(f"garbage: {kinds}; scans mean {mean * 1000:.1f} ms, slowest <= {slowest} s")
        assert mean < 1.0, mean
        assert victim.alive(), "a process behind a garbage record was signalled"
        assert {p for i in daemon.incidents() for p in i["pids"]} == set(job.pids)
        assert daemon.alive()
