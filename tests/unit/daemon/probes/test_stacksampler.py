"""The bounded stack sampler (probes/stacksampler.py) with a fake probe, and the Linux
probe's native stacks (real gdb on a real child) and sockets' queues (real sockets)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.support.fakes import FakeProbe, process_sample
from watchdog.daemon.judge.sighting import FRESH
from watchdog.daemon.probes import ProcessSample
from watchdog.daemon.probes.linux import LinuxProbe
from watchdog.daemon.probes.stacksampler import (
    HOLD_LEAD,
    MAX_EVERY,
    QUIET_QUEUES_EVERY,
    SAMPLE_EVERY,
    SAMPLE_TIMEOUT,
    Identity,
    StackSampler,
)
from watchdog.daemon.probes.tcptables import tcp_queues

STACKS = {7: ("__libc_recv", "SocketThread::worker()")}


class StackProbe(FakeProbe):
    def __init__(self, samples: dict[int, ProcessSample]) -> None:
        super().__init__(samples)
        self.traced: list[int] = []
        self.queues: tuple[tuple[int, int, int], ...] | None = ((11, 0, 64),)

    def native_stacks(self, pid, timeout):
        self.traced.append(pid)
        return dict(STACKS)

    def socket_queues(self, pid):
        return self.queues


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sampler(samples: dict[int, ProcessSample]) -> tuple[StackSampler, StackProbe, Clock]:
    probe, clock = StackProbe(samples), Clock()
    return StackSampler(probe, lambda fn: fn(), clock), probe, clock


RANK = Identity(pid=40, start_time=1.7e9, uid=501)


def test_a_rank_is_sampled_at_most_once_every_few_seconds():
    s, probe, clock = sampler({40: process_sample(40, uid=501, status="running")})
    s.ask(RANK, (7,), clock.now)
    s.ask(RANK, (7,), clock.now + SAMPLE_EVERY / 2)
    assert probe.traced == [40]
    s.ask(RANK, (7,), clock.now + SAMPLE_EVERY)
    assert probe.traced == [40, 40] and s.taken == 2
    found = s.found[(40, 1.7e9)]
    assert found.stacks == STACKS and found.busy == (7,) and not found.error


@pytest.mark.parametrize("sample, why", [
    (process_sample(40, uid=502, status="running"), "another owner"),
    (process_sample(40, start_time=1.8e9, uid=501, status="running"), "a recycled pid"),
    (dataclasses.replace(process_sample(40, uid=501, status="running"), uids=(501, 0, 0, 0)),
     "a setuid process"),
    (process_sample(40, uid=501, status="stopped"), "a stopped rank (a pause)"),
])
def test_never_traced_unless_it_is_the_rank_and_it_runs(sample, why):
    s, probe, clock = sampler({40: sample})
    s.ask(RANK, (7,), clock.now)
    assert probe.traced == [], why
    assert s.found[(40, 1.7e9)].error.startswith("not sampled"), why


def test_a_gone_rank_is_not_traced():
    s, probe, clock = sampler({})
    s.ask(RANK, (), clock.now)
    assert probe.traced == [] and s.taken == 0


def test_its_own_trace_stop_is_known_since_a_given_time():
    s, _, clock = sampler({40: process_sample(40, uid=501, status="running")})
    key = (40, 1.7e9)
    assert not s.tracing(key, clock.now - 1)
    s.ask(RANK, (7,), clock.now)  # ends at clock.now
    assert s.tracing(key, clock.now - 1)  # the interval since the last scan held it
    assert not s.tracing(key, clock.now + 0.5)  # the next interval did not


def test_queues_that_stand_still_say_since_when_and_the_bytes_unread():
    s, probe, _ = sampler({})
    key = (40, 1.7e9)
    assert s.track_queues(key, 40, 10.0).since == 10.0
    found = s.track_queues(key, 40, 14.0)
    assert found.since == 10.0 and found.unread == 64
    probe.queues = ((11, 0, 0),)  # the peer's bytes were read: they move
    assert s.track_queues(key, 40, 15.0).since == 15.0
    s.forget([])
    assert s.queues == {} and s.found == {}


def test_tcp_queues_reads_the_rows_of_the_sockets_asked_for():
    text = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
            "   uid  timeout inode\n"
            "   0: 0100007F:1F90 0100007F:C350 01 00000000:00000040 00:00000000 00000000"
            "     0        0 4242 1 0000000000000000 20 4 30 10 -1\n"
            "   1: 0100007F:1F91 0100007F:C351 01 00000010:00000000 00:00000000 00000000"
            "     0        0 4343 1 0000000000000000 20 4 30 10 -1\n")
    assert tcp_queues(text, {4242}) == [(4242, 0, 64)]
    assert tcp_queues(text, {4242, 4343}) == [(4242, 0, 64), (4343, 16, 0)]
    assert tcp_queues("garbage\nmore garbage", {1}) == []


def test_the_ipv6_table_is_read_only_for_sockets_the_ipv4_one_lacks(tmp_path):
    header = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
              "   uid  timeout inode\n")

    def row(inode: int, rx: int) -> str:
        return (f"   0: 0100007F:1F90 0100007F:C350 01 00000000:{rx:08X} 00:00000000 "
                f"00000000     0        0 {inode} 1 0000000000000000 20 4 30 10 -1\n")

    (tmp_path / "40" / "fd").mkdir(parents=True)
    (tmp_path / "40" / "net").mkdir()
    (tmp_path / "40" / "fd" / "5").symlink_to("socket:[4242]")
    (tmp_path / "40" / "net" / "tcp").write_text(header + row(4242, 64))
    # Read, it would add a second row: the kernel walks its whole table for each file.
    (tmp_path / "40" / "net" / "tcp6").write_text(header + row(4242, 1) + row(4343, 16))
    probe = LinuxProbe(proc=str(tmp_path))
    assert probe.socket_queues(40) == ((4242, 0, 64),)
    (tmp_path / "40" / "fd" / "6").symlink_to("socket:[4343]")  # an IPv6 socket too
    assert probe.socket_queues(40) == ((4242, 0, 1), (4242, 0, 64), (4343, 0, 16))


def test_one_network_namespace_s_table_is_read_once_a_scan_for_all_its_ranks(tmp_path,
                                                                           monkeypatch):
    from watchdog.daemon.probes import linux

    header = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
              "   uid  timeout inode\n")
    rows = "".join(f"   {n}: 0100007F:1F90 0100007F:C350 01 00000000:00000040 00:00000000 "
                   f"00000000     0        0 {inode} 1 0000000000000000 20 4 30 10 -1\n"
                   for n, inode in enumerate((4040, 4141)))
    (tmp_path / "ns").mkdir()
    (tmp_path / "ns" / "net-a").write_text("")
    for pid, inode in ((40, 4040), (41, 4141)):
        (tmp_path / str(pid) / "fd").mkdir(parents=True)
        (tmp_path / str(pid) / "net").mkdir()
        (tmp_path / str(pid) / "ns").mkdir()
        (tmp_path / str(pid) / "ns" / "net").symlink_to(tmp_path / "ns" / "net-a")
        (tmp_path / str(pid) / "fd" / "5").symlink_to(f"socket:[{inode}]")
        (tmp_path / str(pid) / "net" / "tcp").write_text(header + rows)
    opened: list[str] = []

    def counting_open(path, *args, **kwargs):
        opened.append(str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(linux, "open", counting_open, raising=False)
    probe = LinuxProbe(proc=str(tmp_path))
    assert probe.socket_queues(40) == ((4040, 0, 64),)
    assert probe.socket_queues(41) == ((4141, 0, 64),)  # the same namespace's table
    assert [p for p in opened if p.endswith("/net/tcp")] == [f"{tmp_path}/40/net/tcp"]
    probe.tables = {k: (at - linux.TABLE_FRESH, text) for k, (at, text) in
                    probe.tables.items()}  # the next scan: read again
    assert probe.socket_queues(41) == ((4141, 0, 64),)
    assert opened[-1] == f"{tmp_path}/41/net/tcp"


@pytest.mark.slow
def test_bytes_unread_in_a_real_socket_show_in_its_queue():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        client.sendall(b"x" * 64)
        probe = LinuxProbe()
        deadline = time.monotonic() + 5
        rows: tuple = ()
        while time.monotonic() < deadline:
            rows = probe.socket_queues(os.getpid()) or ()
            if any(rx == 64 for _, _, rx in rows):
                break
            time.sleep(0.05)
        assert any(rx == 64 for _, _, rx in rows), rows
    finally:
        for s in (client, peer, server):
            s.close()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gdb") is None, reason="no gdb")
def test_gdb_reads_a_real_process_in_under_a_second_of_its_time():
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        began = time.monotonic()
        stacks = LinuxProbe().native_stacks(child.pid, 10.0)
        took = time.monotonic() - began
        assert stacks and child.pid in stacks, stacks
        assert any("_PyEval_EvalFrameDefault" in f or "PyEval" in f
                   for f in stacks[child.pid]), stacks[child.pid]
        assert took < 3.0, took  # ~0.5 s here; the target is stopped only while gdb reads
        assert child.poll() is None  # it runs on after the sample
    finally:
        child.kill()
        child.wait()


def test_settle_waits_for_a_sample_under_way_and_no_longer_than_its_bound():
    s = StackSampler(StackProbe({}), lambda fn: fn())  # the real clock
    key = (40, 1.7e9)
    began = time.monotonic()
    s.settle([key])  # none under way: at once
    assert time.monotonic() - began < 0.05
    s.running.add(key)  # one that never ends: waited for up to the bound
    s.settle([key], timeout=0.1)
    assert 0.09 <= time.monotonic() - began < 1.0


def test_each_sample_says_whether_the_gpu_time_moved_since_the_one_before():
    class GpuProbe(StackProbe):
        gpu = [100, 100, 250]

        def gpu_time(self, pid, timeout):
            return self.gpu.pop(0)

    probe = GpuProbe({40: process_sample(40, uid=501, status="running")})
    s, key = StackSampler(probe, lambda fn: fn(), Clock()), (40, 1.7e9)
    moved = []
    for n in range(3):
        s.ask(RANK, (7,), 1000.0 + n * SAMPLE_EVERY)
        moved.append(s.found[key].gpu_moved)
    assert moved == [None, False, True]


def test_another_users_slow_ranks_never_take_every_slot():
    """Issue 48, defect 4: ten ranks of one user, each holding its sample for the whole
    time box (gdb blocked on a FIFO the rank names), listed first at every scan; the
    victim's ranks get their share of the slots as soon as one frees, and keep it."""
    attacker = {600 + n: process_sample(600 + n, uid=1001, status="running") for n in range(10)}
    victim = {40: process_sample(40, uid=501, status="running"),
              41: process_sample(41, uid=501, status="running")}
    pending: list = []
    s = StackSampler(StackProbe({**attacker, **victim}), pending.append, Clock())

    def scan(now: float) -> None:  # the scan's order: the attacker's ranks first
        for pid in attacker:
            s.ask(Identity(pid, 1.7e9, 1001), (pid,), now)
        for pid in victim:
            s.ask(Identity(pid, 1.7e9, 501), (pid,), now)

    scan(1000.0)
    assert {pid for pid, _ in s.running} <= set(attacker) and len(s.running) == 4
    pending.pop(0)()  # one of the attacker's samples ends (cut at its time box)
    scan(1001.0)
    pending.pop(0)()
    scan(1002.0)
    assert sorted(pid for pid, _ in s.running if pid in victim) == [40, 41], s.running
    assert sum(pid in attacker for pid, _ in s.running) == 2


def test_forgetting_ranks_while_a_worker_records_a_sample_does_not_fail_the_scan():
    s, _, clock = sampler({})
    landed, stacks = (41, 1.7e9), s.sample(RANK, ())

    class Key(tuple):
        """A rank's key whose lookup lets a worker's sample land mid-scan, as a sample
        ending on another thread does (Stacks written into `found`)."""

        scanning = False

        def __hash__(self) -> int:
            if Key.scanning:
                s.found.setdefault(landed, stacks)
            return tuple.__hash__(self)

    gone = Key((40, 1.7e9))
    s.found[gone] = stacks
    Key.scanning = True
    s.forget([(42, 1.7e9)])  # raised "dictionary changed size during iteration"
    assert list(s.found) == [landed], s.found  # the scan's rank forgotten, the new kept


def sampled_at(s: StackSampler, probe: StackProbe, clock: Clock, seconds: int,
               busy: tuple[int, ...] = (), change_at: float = -1.0,
               hold: float = 0.0) -> list[float]:
    """Ask once a second (a scan) for `seconds`; when each sample was taken. At
    `change_at` the rank's frames change (it moved on in its wait)."""
    taken, start = [], clock.now
    for t in range(seconds):
        clock.now = start + t
        if t == change_at:
            probe.native_stacks = lambda pid, timeout: {7: ("__libc_read", "load")}
        s.track_queues((40, 1.7e9), 40, clock.now)
        s.ask(RANK, busy, clock.now, start + hold)
        if s.asked.get((40, 1.7e9)) == clock.now:
            taken.append(float(t))
    return taken


def test_a_rank_of_a_quiet_job_is_held_until_its_deadline_nears():
    # Its deadline 60 s away: two samples to see it unchanged, then none until HOLD_LEAD
    # before the deadline, then the usual gap (each sample stays fresh for the verdict).
    s, probe, clock = sampler({40: process_sample(40, uid=501, status="sleeping")})
    taken = sampled_at(s, probe, clock, 70, hold=60.0 - HOLD_LEAD)
    assert taken[:2] == [0.0, SAMPLE_EVERY], taken
    assert not [t for t in taken if 2 * SAMPLE_EVERY + 1 < t < 60.0 - HOLD_LEAD], taken
    later = [t for t in taken if t >= 60.0 - HOLD_LEAD]
    assert later[0] == 60.0 - HOLD_LEAD and later[1] - later[0] == MAX_EVERY, taken
    assert len(taken) <= 6, taken  # 13 without the hold


def test_a_rank_asleep_and_unchanged_is_sampled_less_often_but_always_freshly():
    s, probe, clock = sampler({40: process_sample(40, uid=501, status="sleeping")})
    taken = sampled_at(s, probe, clock, 45)
    gaps = [b - a for a, b in zip(taken, taken[1:], strict=False)]
    assert gaps[:2] == [SAMPLE_EVERY, 2 * SAMPLE_EVERY] and max(gaps) == MAX_EVERY, gaps
    assert len(taken) <= 9, taken  # 15 at the fixed 3 s gap
    # A sample the judge takes stays fresh (judge/wedge.py) until the next one is in, even
    # when the scan that asks for it and the sample's whole time box come on top.
    assert MAX_EVERY + 1.0 + SAMPLE_TIMEOUT <= FRESH


@pytest.mark.parametrize("what", ["busy", "frames", "bytes"])
def test_anything_that_moves_keeps_the_sampling_at_its_pace(what):
    s, probe, clock = sampler({40: process_sample(40, uid=501, status="running")})
    if what == "busy":  # a thread spins (a wedge's shape): every sample counts
        assert sampled_at(s, probe, clock, 30, busy=(7,)) == [float(t) for t in range(0, 30, 3)]
        return
    if what == "frames":
        taken = sampled_at(s, probe, clock, 40, change_at=15)
    else:  # bytes move on its sockets between two samples
        taken = []
        for t in range(40):
            clock.now = 1000.0 + t
            probe.queues = ((11, 0, t // 10),)  # the peer's bytes arrive every 10 s
            s.track_queues((40, 1.7e9), 40, clock.now)
            s.ask(RANK, (), clock.now)
            if s.asked.get((40, 1.7e9)) == clock.now:
                taken.append(float(t))
    gaps = [b - a for a, b in zip(taken, taken[1:], strict=False)]
    assert SAMPLE_EVERY in gaps[3:], (what, taken)  # back to the pace after a change


def test_a_quiet_ranks_queues_are_read_every_few_seconds_not_every_scan():
    s, probe, clock = sampler({40: process_sample(40, uid=501, status="sleeping")})
    reads = []
    probe.socket_queues = lambda pid: reads.append(pid) or ((11, 0, len(reads)),)
    for t in range(10):  # a scan a second
        s.track_queues((40, 1.7e9), 40, 1000.0 + t, "ring", QUIET_QUEUES_EVERY)
    assert len(reads) == 4, reads  # at 0, 3, 6 and 9 s
    queues = s.queues[(40, 1.7e9)]
    assert queues.since == 1009.0 and queues.unread == 4  # moved at the last read
