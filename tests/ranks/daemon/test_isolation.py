"""No local user can get another user's job killed.

A job is (owner uid, job id): job ids are world-readable, so a record of
another uid naming a victim's job, hung or crashed, must bring down only
ranks of its own owner, locally and through the fences to other nodes.
Real processes of two uids (root and 65534), the real daemon.
"""

from __future__ import annotations

import os

import pytest

from tests.support.ranks import DaemonProc, free_ports, wait_for
from tests.support.users import OTHER_UID, UserProc, publish

pytestmark = [pytest.mark.ranks,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a second uid")]

SECRET = "correct horse battery staple"


@pytest.mark.parametrize("attacker_uid, victim_uid", [(OTHER_UID, 0), (0, OTHER_UID)])
def test_a_hung_record_of_another_uid_never_gets_the_victim_signalled(
        tmp_path, record_dir, state_dir, attacker_uid, victim_uid):
    with UserProc(attacker_uid) as attacker, UserProc(victim_uid) as victim, \
            DaemonProc(record_dir, state_dir, deadline=60, blocked_deadline=1) as daemon:
        publish(record_dir, victim.pid, victim_uid, "jvictim", hung=False)
        wait_for(lambda: victim.pid in daemon.ranks(), 10, what="the victim watched")
        publish(record_dir, attacker.pid, attacker_uid, "jvictim", hung=True)
        # The attacker's own rank is hung: it is ended (kill scope "job")...
        wait_for(lambda: attacker.poll() is not None, 30, what="the hung rank ended")
        (incident,) = wait_for(daemon.incidents, 10, what="the incident")
        assert incident["pids"] == [attacker.pid] and incident["uid"] == attacker_uid
        # ...and the victim, same job id, another uid, is not even sent SIGCONT.
        assert victim.poll() is None
        assert victim.signals() == []
        assert daemon.ranks()[victim.pid]["state"] == "running"


def test_a_crash_record_of_another_uid_fences_no_victim_on_a_peer(tmp_path):
    """A process of another uid declares world_size=2 and job "jvictim", is seen
    alive, and dies without closing its record: the fence its node sends names
    its uid, so the peer ends none of the victim's ranks."""
    ports = free_ports(2)
    peers = [f"127.0.0.1:{p}" for p in ports]
    daemons = [DaemonProc(tmp_path / f"n{i}" / "records", tmp_path / f"n{i}" / "state",
                          "--peers", peers[1 - i], listen=peers[i], secret=SECRET,
                          deadline=60, interval=0.1) for i in range(2)]
    for d in daemons:
        d.record_dir.mkdir(parents=True)
    with UserProc(OTHER_UID) as attacker, UserProc(0) as victim:
        try:
            for d in daemons:
                d.start()
            publish(daemons[1].record_dir, victim.pid, 0, "jvictim", hung=False, rank=1)
            wait_for(lambda: victim.pid in daemons[1].ranks(), 10, what="the victim watched")
            publish(daemons[0].record_dir, attacker.pid, OTHER_UID, "jvictim", hung=False)
            wait_for(lambda: attacker.pid in daemons[0].ranks(), 10,
                     what="the attacker seen alive")
            attacker.kill()  # dies with its record open: a crash
            wait_for(lambda: f"fenced job jvictim of uid {OTHER_UID}" in daemons[0].log(), 20,
                     what="node 0 fencing the attacker's job")
            wait_for(lambda: "fence from" in daemons[1].log(), 10, what="node 1 answering")
            assert f"of uid {OTHER_UID}" in daemons[1].log()
            assert victim.poll() is None and victim.signals() == []
            assert daemons[1].incidents() == []
            assert daemons[1].ranks()[victim.pid]["state"] == "running"
        finally:
            for d in daemons:
                d.stop()


def test_a_fence_without_an_owner_is_refused():
    from watchdog.net import fence

    body = b'{"job": "j", "nonce": "n1"}'
    ts = "1000.000"
    headers = {fence.TIMESTAMP: ts, fence.SIGNATURE: fence.sign(SECRET, ts, body)}
    with pytest.raises(fence.FenceRejected, match="uid"):
        fence.verify(SECRET, headers, body, fence.NonceCache(), now=1000.0)
    signed, headers = fence.make(SECRET, "j", "o", "r", None, now=1000.0, uid=OTHER_UID)
    assert fence.verify(SECRET, headers, signed, fence.NonceCache(), now=1000.0).uid \
        == OTHER_UID
