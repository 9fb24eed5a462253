"""The data-link probe (probes/datalink.py): a rank's peers read from its own TCP
connections, each reached by a fresh connect; an answer (even a refusal) is a path
that works, a connect that times out is a path that does not."""

from __future__ import annotations

import os
import socket

import pytest

from tests.support.users import fork_as
from watchdog.daemon.probes import datalink


def test_the_remote_ends_of_a_process_connections_are_its_peers():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        ends = datalink.peer_addresses(os.getpid())
        assert server.getsockname() in ends  # the side we connected to
        assert client.getsockname() in ends  # and the one that connected to us
    finally:
        for s in (client, accepted, server):
            s.close()


def test_a_listening_port_and_a_closed_one_both_answer():
    server = socket.create_server(("127.0.0.1", 0))
    try:
        assert datalink.connect(server.getsockname(), 1.0) == ""
    finally:
        server.close()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert datalink.connect(("127.0.0.1", port), 1.0) == ""  # refused: the host answered


def test_one_path_that_does_not_answer_is_down_and_no_connection_is_not_probed():
    said = {("10.0.0.2", 5151): "connect timed out after 1s", ("10.0.0.2", 40000): ""}
    ends = list(said)
    found = datalink.probe(7, 1.0, addresses=lambda pid: ends,
                           connector=lambda a, t: said[a])
    assert found == "down 10.0.0.2:5151 (connect timed out after 1s)"
    assert datalink.probe(7, 1.0, addresses=lambda pid: ends[1:],
                          connector=lambda a, t: said[a]) == datalink.UP
    assert datalink.probe(7, 1.0, addresses=lambda pid: []).startswith("not probed: ")


def test_the_prober_asks_once_per_period_and_forgets_ranks_no_longer_waiting():
    ran: list = []
    prober = datalink.Prober(lambda fn: (ran.append(fn), fn()), lambda: 0.5,
                             probe_=lambda pid, timeout: f"probed {pid}")
    prober.ask((1, 0.0), 10.0)
    prober.ask((1, 0.0), 11.0)  # within the period: not again
    assert len(ran) == 1 and prober.found[(1, 0.0)] == "probed 1"
    prober.ask((1, 0.0), 12.5)
    assert len(ran) == 2
    prober.forget([])
    assert prober.found == {} and prober.asked == {}
    prober.ask((2, 0.0), 20.0, "jaccl")  # RDMA, or MPI's own listener: never knocked on
    assert len(ran) == 2 and prober.found[(2, 0.0)] == "not probed: the jaccl backend"


def test_probes_under_way_are_bounded_and_a_rank_is_never_probed_twice_at_once():
    """Any user can have many ranks wait: the probes queued never grow past the bound,
    whatever the workers' pace (a dead peer takes the timeout per remote end)."""
    queued = []
    prober = datalink.Prober(queued.append, lambda: 1.0, probe_=lambda pid, timeout: datalink.UP)
    for pid in range(100):
        prober.ask((pid, 1.0), now=0.0)
    assert len(queued) == datalink.MAX_RUNNING
    prober.ask((0, 1.0), now=10.0)  # its probe still under way: not asked again
    assert len(queued) == datalink.MAX_RUNNING
    queued.pop(0)()  # one finishes
    assert prober.found[(0, 1.0)] == datalink.UP
    prober.ask((50, 1.0), now=10.0)
    assert len(queued) == datalink.MAX_RUNNING  # its room taken by another rank


# -- issue 37, items 7 and 8: another user's ranks and listeners -------------------------


def test_one_users_ranks_never_starve_anothers_probe():
    """16 of one user's ranks wait on a full accept queue (their probes slow): they
    hold one probe slot between them, so another user's rank is probed at once."""
    submitted: list[object] = []
    prober = datalink.Prober(submitted.append, lambda: 1.0)
    for n in range(16):
        prober.ask((1000 + n, 1.0), 10.0, "ring", uid=65534)
    prober.ask((7, 1.0), 10.0, "ring", uid=0)
    assert len(submitted) == 2 and (7, 1.0) in prober.running
    assert sum(1 for key in prober.running if key[0] >= 1000) == 1


def test_one_timeout_is_asked_again_before_it_is_down():
    said = ["connect timed out after 1s", ""]
    assert datalink.probe(7, 1.0, addresses=lambda pid: [("10.0.0.2", 5151)],
                          connector=lambda a, t: said.pop(0)) == datalink.UP


def _full_listener(uid: int) -> tuple[int, int]:
    """A child of `uid` listening on 127.0.0.1 with a full accept queue it never
    takes from; (its pid, its port)."""
    import time

    def listen(write: int) -> None:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        os.write(write, str(server.getsockname()[1]).encode())
        time.sleep(60)

    pid, read = fork_as(uid, listen)
    port = int(os.read(read, 16))
    os.close(read)
    return pid, port


@pytest.mark.slow
def test_another_users_listener_with_a_full_queue_is_no_evidence_of_a_down_link():
    """The victim's released listening port bound by another user who keeps its accept
    queue full: the connect times out, but that listener is not the victim's peer.
    Before: the cause turned from `mismatch` to `data_link_down`."""
    import signal

    from tests.support.users import OTHER_UID

    pid, port = _full_listener(OTHER_UID)
    held: list[socket.socket] = []
    try:
        for _ in range(8):  # fill its queue: later connects get no answer
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            held.append(s)
        ends = lambda _pid: [("127.0.0.1", port)]  # noqa: E731
        assert datalink.connect(("127.0.0.1", port), 0.3).startswith("connect timed out")
        found = datalink.probe(7, 0.3, addresses=ends, owner=0)
        assert found.startswith("not probed") and "another user" in found, found
        # The same listener, the rank's own uid's: evidence, down after two timeouts.
        assert datalink.probe(7, 0.3, addresses=ends, owner=OTHER_UID).startswith("down ")
    finally:
        for s in held:
            s.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_the_listener_s_uid_is_read_from_the_tcp_tables_rows():
    from watchdog.daemon.probes.tcptables import tcp_listener_uid

    header = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
              "   uid  timeout inode\n")
    listen = ("   0: 0100007F:1414 00000000:0000 0A 00000000:00000000 00:00000000 00000000"
              "  1001        0 5151 1 0000000000000000 100 0 0 10 0\n")  # 127.0.0.1:5140
    anywhere = ("   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 "
                "00000000  1002        0 5252 1 0000000000000000 100 0 0 10 0\n")  # *:8080
    connected = ("   2: 0100007F:1F91 0100007F:C350 01 00000000:00000000 00:00000000 "
                 "00000000  1003        0 5353 1 0000000000000000 20 4 30 10 -1\n")
    v6 = ("   0: 00000000000000000000000001000000:1F92 00000000000000000000000000000000:0000"
          " 0A 00000000:00000000 00:00000000 00000000  1004        0 5454 1 0 100 0 0 10 0\n")
    text = header + listen + anywhere + connected
    assert tcp_listener_uid(text, "127.0.0.1", 5140) == 1001
    assert tcp_listener_uid(text, "10.0.0.2", 5140) is None  # another address
    assert tcp_listener_uid(text, "10.0.0.2", 8080) == 1002  # listens on every address
    assert tcp_listener_uid(text, "127.0.0.1", 8081) is None  # established, not listening
    assert tcp_listener_uid(header + v6, "::1", 8082) == 1004
    assert tcp_listener_uid("garbage\n 0: zz:zz 0 0A 0 0 0 x 0 0", "127.0.0.1", 1) is None


def test_a_real_listener_s_uid_on_this_host():
    server = socket.create_server(("127.0.0.1", 0))
    end = server.getsockname()
    try:
        assert datalink.listener_uid(end) == os.getuid()
    finally:
        server.close()
    assert datalink.listener_uid(end) is None
