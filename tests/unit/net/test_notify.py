"""sd_notify against real AF_UNIX datagram sockets, as systemd would listen."""

import logging
import os
import socket
import uuid

import pytest

from watchdog.net.notify import notify, watchdog_interval


@pytest.fixture
def listener(tmp_path):
    """A datagram socket bound in tmp_path, like systemd's notify socket."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        yield sock, str(path)


@pytest.mark.parametrize("message", ["READY=1", "WATCHDOG=1", "STATUS=scanning 3 ranks"])
def test_datagram_arrives_on_path_socket(listener, message):
    sock, path = listener
    assert notify(message, {"NOTIFY_SOCKET": path}) is True
    assert sock.recv(4096) == message.encode()


def test_each_call_is_one_datagram(listener):
    sock, path = listener
    env = {"NOTIFY_SOCKET": path}
    assert notify("READY=1", env) and notify("WATCHDOG=1", env)
    assert [sock.recv(4096), sock.recv(4096)] == [b"READY=1", b"WATCHDOG=1"]


def test_abstract_socket():
    name = f"mlx-watchdog-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name}) is True
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_no_notify_socket_is_a_no_op():
    assert notify("READY=1", {}) is False
    assert notify("READY=1", {"NOTIFY_SOCKET": ""}) is False


def test_default_env_is_the_process_environment(monkeypatch, listener):
    sock, path = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert notify("READY=1") is True
    assert sock.recv(4096) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert notify("READY=1") is False


def test_missing_socket_is_logged_not_raised(tmp_path, caplog):
    missing = str(tmp_path / "gone.sock")
    with caplog.at_level(logging.DEBUG, logger="watchdog.net.notify"):
        assert notify("WATCHDOG=1", {"NOTIFY_SOCKET": missing}) is False
    assert "gone.sock" in caplog.text


@pytest.mark.parametrize(
    "address",
    ["relative.sock", "vsock:2:1234", "/" + "x" * 200, "@", "/tmp/\0nul"],
)
def test_unusable_addresses_return_false(address):
    assert notify("READY=1", {"NOTIFY_SOCKET": address}) is False


def test_unencodable_message_returns_false(listener):
    _, path = listener
    assert notify("STATUS=\udcff", {"NOTIFY_SOCKET": path}) is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "1500"}, 0.0015),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "thirty"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": ""}, None),
        ({"WATCHDOG_PID": str(os.getpid())}, None),
    ],
)
def test_watchdog_interval(env, expected):
    assert watchdog_interval(env) == expected
