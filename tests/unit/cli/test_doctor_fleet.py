"""Issue 38, items 3 and 9: `doctor` checks what an operator of a fleet needs: the daemon
on the port watches the directories this config names; each peer resolves, answers, and
keeps a clock within the fences' window; the secret and the config file's mode; and
`--json` for checking many nodes."""

from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner

from tests.unit.cli.test_doctor import closed_port, find
from watchdog.cli.commands import cli
from watchdog.cli.node import doctor_fleet
from watchdog.cli.node.doctor_fleet import check_config, check_peers, check_watches
from watchdog.daemon.config import Settings
from watchdog.net.http import serve, shut
from watchdog.status import NodeStatus


@pytest.fixture
def node_http(tmp_path):
    """A real endpoint of the daemon's kind publishing a scanned snapshot that watches
    `tmp_path/records` (state in `tmp_path/state`)."""
    snap = NodeStatus(host="mac-2", daemon_pid=4321, version="9.9", time=time.time(),
                      scan_monotonic=1.0, dir=str(tmp_path / "records"),
                      state_dir=str(tmp_path / "state"), scanned=True)
    server = serve(("127.0.0.1", 0), lambda: snap, lambda: True)
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        shut(server)


@pytest.mark.slow
def test_the_daemon_on_the_port_watches_the_configs_directories(tmp_path, node_http):
    lines = check_watches(node_http, str(tmp_path / "records"), str(tmp_path / "state"))
    assert find(lines, "ok", f"the daemon at http://{node_http} (pid 4321) watches "
                             f"{tmp_path / 'records'} (state {tmp_path / 'state'})"), lines
    other = tmp_path / "elsewhere"
    (level, message), = check_watches(node_http, str(other), str(tmp_path / "state"))
    assert level == "fail"
    assert (f"watches records in {tmp_path / 'records'} (this config names {other}): ranks "
            f"publishing to {other} are not watched") in message
    assert check_watches(closed_port(), str(other), str(other)) == []  # the daemon check's


@pytest.mark.slow
def test_each_peer_resolves_answers_and_keeps_its_clock(node_http, monkeypatch):
    down = closed_port()
    settings = Settings(peers=(node_http, down, "no-such-host.invalid:9753"),
                        peer_timeout=1.0)
    lines = check_peers(settings)
    assert find(lines, "ok", f"peer {node_http} answers (mac-2, mlx-watchdog 9.9); clock "
                             "within 1s of ours"), lines
    assert find(lines, "warn", f"peer {down} does not answer")
    assert find(lines, "fail", "peer no-such-host.invalid:9753 does not resolve")
    # A peer whose clock is 45 s ahead: every fence between the two is refused.
    real = doctor_fleet.fetch_status
    monkeypatch.setattr(doctor_fleet, "fetch_status",
                        lambda base, timeout=2.0: (real(base, timeout)[0], 45.0))
    (level, message), = check_peers(Settings(peers=(node_http,)))
    assert level == "fail" and "its clock is +45s off ours, more than the fences' 30s " \
        "window: fences between the two are refused" in message
    monkeypatch.setattr(doctor_fleet, "fetch_status",
                        lambda base, timeout=2.0: (real(base, timeout)[0], -12.0))
    (level, message), = check_peers(Settings(peers=(node_http,)))
    assert level == "warn" and "its clock is -12s off ours" in message


def test_the_secret_and_the_config_files_mode(tmp_path):
    cfg = tmp_path / "node.toml"
    cfg.write_text('[watchdog]\npeers = ["mac-2:9753"]\nsecret = "' + "s" * 24 + '"\n')
    os.chmod(cfg, 0o644)
    settings = Settings(peers=("mac-2:9753",), secret="s" * 24)
    lines = check_config(str(cfg), settings)
    assert find(lines, "ok", "fences on: a secret of 24 characters")
    assert find(lines, "warn", f"config file {cfg} holds the fence secret and its group and "
                               f"everyone may read it (mode 644)")
    os.chmod(cfg, 0o600)
    assert not find(check_config(str(cfg), settings), "warn", "")
    lines = check_config(None, Settings(peers=("mac-2:9753",)))
    assert find(lines, "warn", "peers are configured but no secret: fences are off")
    assert find(lines, "warn", "token_urlsafe(24)")
    # A placeholder through the environment (the file's is refused as it is read).
    lines = check_config(None, Settings(secret="REPLACE-with-token_urlsafe-24"))
    assert find(lines, "fail", "the secret is still a placeholder")


@pytest.mark.slow
def test_doctor_json_for_a_fleet(tmp_path, node_http, monkeypatch):
    record, state = tmp_path / "records", tmp_path / "state"
    record.mkdir(mode=0o1777)
    os.chmod(record, 0o1777)
    state.mkdir(mode=0o755)
    monkeypatch.setenv("MLX_WATCHDOG_DIR", str(record))
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'[watchdog]\ndir = "{record}"\nstate_dir = "{state}"\n'
                   f'listen = "{node_http}"\npeers = ["{node_http}"]\n'
                   f'secret = "{"s" * 24}"\n')
    os.chmod(cfg, 0o640)
    result = CliRunner().invoke(cli, ["--config", str(cfg), "doctor", "--json"])
    report = json.loads(result.output)
    checks = {(c["check"], c["level"]) for c in report["checks"]}
    assert ("daemon's directories", "ok") in checks, report
    assert ("peers", "ok") in checks and ("config", "warn") in checks, report
    assert set(report) == {"host", "ok", "checks"}
    assert result.exit_code == (0 if report["ok"] else 1)
    assert all(set(c) == {"check", "level", "message"} for c in report["checks"])
    text = CliRunner().invoke(cli, ["--config", str(cfg), "doctor"]).output
    assert f"[OK  ] the daemon at http://{node_http} (pid 4321) watches {record}" in text
    assert f"[WARN] config file {cfg} holds the fence secret and its group may read it" in text
    # Its own address among its peers (one file for every node): skipped, said so.
    assert f"[OK  ] peer {node_http} is this node (its listen {node_http}): skipped" in text


@pytest.mark.slow
def test_a_hostile_peer_s_words_reach_the_terminal_escaped(tmp_path):
    """Issue 48, defects 6 and 7: a peer's host and version are anything it sends; raw,
    an escape redraws a FAIL line as "[OK  ]" and sets the terminal's title, and a bidi
    override shows a name reversed. Neither an escape byte nor a format character
    reaches the terminal."""
    evil = "\r[OK  ] all fine\x1b]0;pwned\x07\u202egnp.exe\u200b"
    snap = NodeStatus(host=evil, daemon_pid=4321, version=evil, time=time.time(),
                      scan_monotonic=1.0, dir=evil, state_dir=str(tmp_path), scanned=True)
    server = serve(("127.0.0.1", 0), lambda: snap, lambda: True)
    try:
        peer = f"127.0.0.1:{server.server_address[1]}"
        cfg = tmp_path / "node.toml"
        cfg.write_text(f'[watchdog]\nlisten = "{peer}"\npeers = ["{peer}"]\n')
        output = CliRunner().invoke(cli, ["--config", str(cfg), "doctor"]).output
    finally:
        shut(server)
    assert "\\x1b]0;pwned\\x07" in output or "\\u202e" in output, output
    for line in output.splitlines():
        assert line.isprintable(), repr(line)
    assert "\x1b" not in output and "\r" not in output and "\u202e" not in output


@pytest.mark.parametrize("answer", [b'{"job": "x", "uid": 0, "ending": []}',
                                    b'{"proof": "' + b"0" * 64 + b'"}'],
                         ids=["unproven-200", "wrong-proof"])
def test_doctor_proves_the_secret_only_from_a_proof_and_hands_out_nothing_signed(answer):
    """Issue 57, item 11. An impostor at a peer's address answers every POST 200: doctor
    used to say "the secrets match" and hand it a signed fence. Now the match needs the
    secret's proof of doctor's random challenge; nothing signed is ever sent."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from watchdog.net import fence

    seen: list[dict[str, str]] = []

    class Impostor(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        peer = f"127.0.0.1:{server.server_address[1]}"
        level, message = doctor_fleet.check_secret(peer, Settings(secret="s" * 24))
    finally:
        shut(server)
    assert "secrets match" not in message, message
    assert level == ("warn" if b"ending" in answer else "fail"), message
    assert len(seen) == 1 and fence.SIGNATURE not in seen[0] and fence.CHALLENGE in seen[0]
