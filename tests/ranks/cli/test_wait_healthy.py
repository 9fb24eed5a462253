"""`mlx-watchdog node wait-healthy` against a real daemon: a peer's reboot flag is read
from its /status.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.ranks import REPO, DaemonProc
from watchdog.daemon.store import journal
from watchdog.launch.relaunch import EXIT_REFUSED


@pytest.mark.ranks
def test_a_peer_flagged_for_reboot_is_read_from_its_status(tmp_path, state_dir):
    records, peer_state = tmp_path / "peer-records", tmp_path / "peer-state"
    records.mkdir()
    peer_state.mkdir()
    journal.set_reboot_flag(str(peer_state), "unkillable rank 2")
    with DaemonProc(records, peer_state) as peer:
        address = peer.url().removeprefix("http://")
        config = tmp_path / "node.toml"
        config.write_text(f'[watchdog]\npeers = ["{address}", "127.0.0.1:9"]\n'
                          f"peer_timeout = 2\n")
        done = subprocess.run(
            [sys.executable, "-m", "watchdog.cli", "--config", str(config), "node",
             "wait-healthy", "--timeout", "0", "--state-dir", str(state_dir)],
            env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
            timeout=60)
    assert done.returncode == EXIT_REFUSED, done.stderr
    assert "mlx-watchdog: note: peer 127.0.0.1:9 unreachable: its reboot flag not checked" \
        in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        f"mlx-watchdog: node not fit: peer {address} (")
    assert done.stderr.splitlines()[-1].endswith(") is flagged for reboot (unkillable rank 2)")


@pytest.mark.ranks
def test_a_peer_whose_slots_are_held_fails_the_gate_closed(tmp_path, state_dir):
    """Issue 30, item 5: a local user on the flagged peer holds more idle connections
    than its HTTP cap; the peer cannot answer, and its flag must not be skipped: the
    gate refuses ("unreachable"), it does not say the node is fit."""
    import socket

    from watchdog.net import http as httpd

    records, peer_state = tmp_path / "peer-records", tmp_path / "peer-state"
    records.mkdir()
    peer_state.mkdir()
    journal.set_reboot_flag(str(peer_state), "unkillable rank 2")
    held: list[socket.socket] = []
    with DaemonProc(records, peer_state) as peer:
        address = peer.url().removeprefix("http://")
        host, port = address.rsplit(":", 1)
        try:
            for _ in range(httpd.MAX_CONNECTIONS + 8):
                held.append(socket.create_connection((host, int(port)), timeout=5))
            config = tmp_path / "node.toml"
            config.write_text(f'[watchdog]\npeers = ["{address}"]\npeer_timeout = 1\n')
            done = subprocess.run(
                [sys.executable, "-m", "watchdog.cli", "--config", str(config), "node",
                 "wait-healthy", "--timeout", "0", "--state-dir", str(state_dir)],
                env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                timeout=60)
        finally:
            for s in held:
                s.close()
    assert done.returncode == EXIT_REFUSED, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        f"mlx-watchdog: node not fit: peer {address} unreachable: its reboot flag not checked")


@pytest.mark.ranks
def test_a_peer_keeps_slots_of_its_own_when_local_users_hold_the_rest(tmp_path, state_dir):
    """Issue 30, item 5: a user on the flagged node B holds more idle connections than
    B's shared cap, from B's own address (here 127.0.0.2); A (127.0.0.1, one of B's
    peers) still reads B's flag through the slots B keeps for its peers."""
    import socket

    from watchdog.net import http as httpd

    records, peer_state = tmp_path / "peer-records", tmp_path / "peer-state"
    records.mkdir()
    peer_state.mkdir()
    journal.set_reboot_flag(str(peer_state), "unkillable rank 2")
    held: list[socket.socket] = []
    with DaemonProc(records, peer_state, peers="127.0.0.1:9") as peer:
        address = peer.url().removeprefix("http://")
        host, port = address.rsplit(":", 1)
        try:
            for _ in range(httpd.MAX_CONNECTIONS + 8):
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.connect((host, int(port)))
                held.append(s)
            config = tmp_path / "node.toml"
            config.write_text(f'[watchdog]\npeers = ["{address}"]\npeer_timeout = 1\n')
            done = subprocess.run(
                [sys.executable, "-m", "watchdog.cli", "--config", str(config), "node",
                 "wait-healthy", "--timeout", "0", "--state-dir", str(state_dir)],
                env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                timeout=60)
        finally:
            for s in held:
                s.close()
    assert done.returncode == EXIT_REFUSED, done.stderr
    assert done.stderr.splitlines()[-1].endswith(") is flagged for reboot (unkillable rank 2)")
