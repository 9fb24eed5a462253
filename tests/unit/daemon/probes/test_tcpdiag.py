"""The kernel's TCP counters per socket (probes/tcpdiag.py) read from real sockets, and
the sampler's stillness made exact by them (probes/stacksampler.py): a trickle that the
queues never show is seen moving."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest

from tests.support.fakes import FakeProbe
from watchdog.daemon.probes import tcpdiag
from watchdog.daemon.probes.linux import LinuxProbe
from watchdog.daemon.probes.stacksampler import StackSampler


def pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    return server, client, peer


def until(check, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    return check()


def test_a_real_transfer_moves_both_ends_counters():
    server, client, peer = pair()
    try:
        sender, receiver = os.fstat(client.fileno()).st_ino, os.fstat(peer.fileno()).st_ino
        before = tcpdiag.dump()
        assert before[sender].bytes_acked is not None and before[receiver].rx_queue == 0
        client.sendall(b"x" * 5000)
        after = until(lambda: (rows := tcpdiag.dump())[sender].bytes_acked
                      >= before[sender].bytes_acked + 5000 and rows)
        assert after[receiver].bytes_received == before[receiver].bytes_received + 5000
        assert after[receiver].rx_queue == 5000  # received, not read: the queue shows it
        assert os.fstat(server.fileno()).st_ino not in after  # a listener is not dumped
    finally:
        for s in (client, peer, server):
            s.close()


def test_the_probe_gives_every_socket_of_the_process_its_counters():
    server, client, peer = pair()
    try:
        mine = {os.fstat(s.fileno()).st_ino for s in (client, peer)}
        counters = LinuxProbe().socket_counters(os.getpid())
        assert counters is not None and mine <= {inode for inode, _, _ in counters}
    finally:
        for s in (client, peer, server):
            s.close()


def test_a_namespace_the_dump_cannot_read_gives_no_counters(tmp_path):
    (tmp_path / "40" / "ns").mkdir(parents=True)
    (tmp_path / "40" / "ns" / "net").write_text("")  # another inode than ours
    assert LinuxProbe(proc=str(tmp_path)).socket_counters(40) is None


def test_a_kernel_error_or_a_cut_message_is_raised_not_read_as_no_sockets():
    error = struct.pack("=IHHII", 36, tcpdiag.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -1)
    with pytest.raises(tcpdiag.DiagError):
        tcpdiag.parse(error + bytes(16), {})
    with pytest.raises(tcpdiag.DiagError):
        tcpdiag.parse(struct.pack("=IHHII", 400, tcpdiag.SOCK_DIAG_BY_FAMILY, 0, 1, 0), {})
    done = struct.pack("=IHHII", 20, tcpdiag.NLMSG_DONE, 0, 1, 0) + bytes(4)
    assert tcpdiag.parse(done, {}) is True


class Counting(FakeProbe):
    """Queues that never change (the peer reads at once), counters as given."""

    def __init__(self) -> None:
        super().__init__({})
        self.counters: tuple[tuple[int, int, int], ...] | None = ((11, 100, 0),)

    def socket_queues(self, pid):
        return ((11, 0, 0),)

    def socket_counters(self, pid):
        return self.counters


def test_counters_that_move_under_still_queues_reset_the_stillness():
    probe = Counting()
    s = StackSampler(probe, lambda fn: fn())
    key = (40, 1.7e9)
    assert s.track_queues(key, 40, 10.0, "ring").since == 10.0
    assert s.track_queues(key, 40, 14.0, "ring").since == 10.0  # nothing moved
    probe.counters = ((11, 101, 0),)  # one byte acknowledged
    found = s.track_queues(key, 40, 15.0, "ring")
    assert found.since == 15.0 and found.exact
    probe.counters = None  # no longer told: the queues alone, which stand still
    found = s.track_queues(key, 40, 20.0, "ring")
    assert found.since == 15.0 and not found.exact


@pytest.mark.slow
def test_a_trickle_the_queues_never_show_is_seen_moving_by_its_counters():
    server, client, peer = pair()
    stop = threading.Event()

    def trickle() -> None:  # 16 bytes every 0.3 s, read at once: the queues stay empty
        while not stop.is_set():
            client.sendall(b"y" * 16)
            peer.recv(64)
            stop.wait(0.3)

    class Mine(FakeProbe):
        def socket_queues(self, pid):
            mine = {os.fstat(client.fileno()).st_ino, os.fstat(peer.fileno()).st_ino}
            return tuple(r for r in (LinuxProbe().socket_queues(pid) or ()) if r[0] in mine)

        def socket_counters(self, pid):
            mine = {os.fstat(client.fileno()).st_ino, os.fstat(peer.fileno()).st_ino}
            return tuple(r for r in (LinuxProbe().socket_counters(pid) or ()) if r[0] in mine)

    exact = StackSampler(Mine({}), lambda fn: fn())
    queues_only = StackSampler(Mine({}), lambda fn: fn())
    queues_only.probe.socket_counters = lambda pid: None  # type: ignore[method-assign]
    worker = threading.Thread(target=trickle)
    worker.start()
    try:
        began = time.monotonic()
        while time.monotonic() - began < 3.0:
            now = time.monotonic()
            seen = exact.track_queues((1, 1.0), os.getpid(), now, "ring")
            blind = queues_only.track_queues((1, 1.0), os.getpid(), now, "ring")
            time.sleep(0.1)
        assert now - seen.since < 1.5, "the counters saw the trickle move"
        assert now - blind.since > 2.5, "the queues alone read it as still"
    finally:
        stop.set()
        worker.join()
        for s in (client, peer, server):
            s.close()
