"""The wedge's "nothing moves" on a Mac: the sockets' buffer counts (soi_snd/soi_rcv)
for ring and MPI, whose bytes cross them; none for JACCL (RDMA) or NCCL, whose sockets
stand still while their collectives move bytes elsewhere (docs/limits.md)."""

from __future__ import annotations

import pytest

from watchdog import backends
from watchdog.daemon.probes import Probe
from watchdog.daemon.probes.stacksampler import StackSampler


class Sockets(Probe):
    def __init__(self) -> None:
        self.asked = 0

    def socket_queues(self, pid: int) -> tuple[tuple[int, int, int], ...]:
        self.asked += 1
        return ((7, 0, 64),)


@pytest.mark.parametrize("backend, read", [
    ("ring", True), ("mpi", True), (None, True), ("jaccl", False), ("nccl", False)])
def test_quiet_sockets_count_only_where_the_bytes_cross_them(backend, read):
    probe = Sockets()
    sampler = StackSampler(probe, lambda *a: None)
    queues = sampler.track_queues(("u", 1), 123, 10.0, backend)
    assert backends.bytes_on_sockets(backend) is read
    assert (queues.queues is not None) is read and probe.asked == int(read)
    assert queues.unread == (64 if read else 0)
