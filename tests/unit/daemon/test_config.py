"""Settings: defaults, the TOML file, command-line overrides, and one-line errors."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from watchdog.daemon.config import (
    HELP,
    LAUNCH_KEYS,
    ConfigError,
    LaunchSettings,
    Settings,
    build,
    build_launch,
    default_toml,
    load,
    load_file,
    load_launch,
    parse_listen,
)
from watchdog.daemon.judge.deadlines import Rules

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib


def test_defaults_are_valid() -> None:
    settings = build({}, {})
    assert settings == Settings()
    assert settings.deadline is None  # auto
    assert settings.mode == "enforce" and settings.kill_scope == "job"
    assert settings.confirm >= 2  # no single sample kills, by default too
    assert settings.listen_address == ("127.0.0.1", 9753)
    assert set(HELP) == {f.name for f in dataclasses.fields(Settings)} | set(LAUNCH_KEYS)
    assert not set(LAUNCH_KEYS) & {f.name for f in dataclasses.fields(Settings)}


def test_rules_carry_every_detector_setting() -> None:
    settings = build({}, {"deadline": 42, "confirm": 3, "spin_ratio": 0.7,
                          "blocked_deadline": 99, "init_deadline": 77})
    rules = settings.rules()
    assert {f.name for f in dataclasses.fields(Rules)} <= set(dataclasses.asdict(settings))
    for f in dataclasses.fields(Rules):
        assert getattr(rules, f.name) == getattr(settings, f.name), f.name


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "watchdog.toml"
    path.write_text(text)
    return str(path)


def test_toml_top_level_keys(tmp_path: Path) -> None:
    path = write(tmp_path, 'interval = 2.5\ndeadline = 30\nmode = "observe"\n'
                           'peers = ["10.0.0.2:9753", "[fe80::1]:9753"]\nconfirm = 3\n')
    settings = load(path, {})
    assert settings.interval == 2.5 and settings.deadline == 30.0
    assert settings.mode == "observe" and settings.confirm == 3
    assert settings.peers == ("10.0.0.2:9753", "[fe80::1]:9753")


def test_toml_under_watchdog_table_with_dashes(tmp_path: Path) -> None:
    path = write(tmp_path, '[watchdog]\nkill-scope = "rank"\ndeadline = "auto"\n'
                           'wired_threshold = 536870912\n')
    settings = load(path, {})
    assert settings.kill_scope == "rank" and settings.deadline is None
    assert settings.wired_threshold == 1 << 29 and isinstance(settings.wired_threshold, int)


def test_cli_overrides_beat_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[watchdog]\ninterval = 5\ndeadline = 30\nmode = "observe"\n')
    settings = load(path, {"interval": "0.5", "deadline": None, "mode": "enforce",
                           "grace": None, "peers": None})
    assert settings.interval == 0.5  # the command line wins
    assert settings.deadline == 30.0  # None: not given on the command line
    assert settings.mode == "enforce"
    assert settings.grace == Settings().grace


BAD = [
    pytest.param({"interval": -1}, "interval", id="negative interval"),
    pytest.param({"interval": "-1"}, "interval", id="negative interval as text"),
    pytest.param({"interval": float("nan")}, "interval", id="NaN"),
    pytest.param({"grace": "nan"}, "grace", id="NaN as text"),
    pytest.param({"kill_timeout": float("inf")}, "kill_timeout", id="inf"),
    pytest.param({"settle": "inf"}, "settle", id="inf as text"),
    pytest.param({"interval": 0}, "interval", id="zero interval"),
    pytest.param({"confirm": 0}, "confirm", id="confirm 0"),
    pytest.param({"confirm": 1.5}, "confirm", id="confirm not whole"),
    pytest.param({"spin_ratio": 1.5}, "spin_ratio", id="spin_ratio 1.5"),
    pytest.param({"spin_ratio": 0}, "spin_ratio", id="spin_ratio 0"),
    pytest.param({"mode": "x"}, "mode", id="mode x"),
    pytest.param({"kill_scope": "x"}, "kill_scope", id="kill_scope x"),
    pytest.param({"listen": "nope"}, "listen", id="listen nope"),
    pytest.param({"listen": "127.0.0.1:99999"}, "listen", id="listen port out of range"),
    pytest.param({"listen": ":9753"}, "listen", id="listen without host"),
    pytest.param({"peers": ["10.0.0.2:9753", "nope"]}, "peers", id="peers not HOST:PORT"),
    pytest.param({"peers": "10.0.0.2"}, "peers", id="peers as text without port"),
    pytest.param({"peers": [1, 2]}, "peers", id="peers not strings"),
    pytest.param({"no_such_key": 1}, "no_such_key", id="unknown key"),
    pytest.param({"interval": True}, "interval", id="bool where number"),
    pytest.param({"confirm": False}, "confirm", id="bool where whole number"),
    pytest.param({"deadline": True}, "deadline", id="bool deadline"),
    pytest.param({"deadline": "-1"}, "deadline", id="deadline -1"),
    pytest.param({"deadline": 0}, "deadline", id="deadline 0"),
    pytest.param({"deadline": "soon"}, "deadline", id="deadline soon"),
    pytest.param({"deadline": "inf"}, "deadline", id="deadline inf"),
    pytest.param({"interval": [1]}, "interval", id="list where number"),
    pytest.param({"dir": 5}, "dir", id="number where path"),
    pytest.param({"state_dir": ""}, "state_dir", id="empty path"),
    pytest.param({"retention": -1}, "retention", id="negative retention"),
    pytest.param({"wired_threshold": -1}, "wired_threshold", id="negative threshold"),
    pytest.param({"secret": "short"}, "secret", id="secret too short"),
]


def one_sentence(message: str) -> bool:
    return "\n" not in message and 0 < len(message) < 200 and "Traceback" not in message


@pytest.mark.parametrize(("values", "key"), BAD)
def test_bad_values_name_the_key_in_one_sentence(values: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build({}, values)
    assert key in str(err.value)
    assert one_sentence(str(err.value))


def test_a_bad_toml_value_in_a_file(tmp_path: Path) -> None:
    for text, key in (("interval = nan\n", "interval"), ("grace = inf\n", "grace"),
                      ("[watchdog]\nconfirm = true\n", "confirm"),
                      ('[watchdog]\ndeadline = "soon"\n', "deadline"),
                      ("[watchdog]\nbogus = 1\n", "bogus")):
        with pytest.raises(ConfigError, match=key):
            load(write(tmp_path, text), {})


def test_watchdog_must_be_a_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[watchdog\]"):
        load(write(tmp_path, "watchdog = 5\n"), {})


def test_keys_outside_the_watchdog_table_are_not_silently_ignored(tmp_path: Path) -> None:
    """A file with both top-level keys and [watchdog]: the top-level ones must not vanish."""
    path = write(tmp_path, "deadline = 30\n[watchdog]\ngrace = 5\n")
    try:
        settings = load(path, {})
    except ConfigError as err:
        assert "deadline" in str(err) and one_sentence(str(err))
    else:
        assert settings.deadline == 30.0 and settings.grace == 5.0


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as err:
        load_file(str(tmp_path / "absent.toml"))
    assert one_sentence(str(err.value))


def test_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML") as err:
        load_file(write(tmp_path, "interval = [\n"))
    assert one_sentence(str(err.value))


def test_unreadable_file(tmp_path: Path) -> None:
    # chmod 000 does not stop root (tests run as root); a directory cannot be read as a file.
    with pytest.raises(ConfigError, match="cannot read") as err:
        load_file(str(tmp_path))
    assert one_sentence(str(err.value))
    if os.geteuid() != 0:
        path = write(tmp_path, "interval = 1\n")
        os.chmod(path, 0)
        with pytest.raises(ConfigError, match="cannot read"):
            load_file(path)


def test_parse_listen() -> None:
    assert parse_listen("0.0.0.0:9753") == ("0.0.0.0", 9753)
    assert parse_listen("[::1]:80") == ("::1", 80)
    with pytest.raises(ConfigError):
        parse_listen("localhost")


def test_default_toml_parses_back_to_the_defaults(tmp_path: Path) -> None:
    text = default_toml()
    assert tomllib.loads(text) == {"watchdog": {}}  # everything commented out
    key_line = re.compile(r"^# ([a-z_]+) = ")
    uncommented = "\n".join(key_line.sub(r"\1 = ", line) for line in text.splitlines())
    section = tomllib.loads(uncommented)["watchdog"]
    assert set(section) == {f.name for f in dataclasses.fields(Settings)} | set(LAUNCH_KEYS)
    assert build(section, {}) == Settings()
    assert load(write(tmp_path, uncommented), {}) == Settings()
    assert build_launch(section, {}) == LaunchSettings()


# -- the command line: one line on stderr, never a traceback ----------------------------


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_WATCHDOG")}
    env["MLX_WATCHDOG_DIR"] = str(tmp_path / "records-not-created")
    env["MLX_WATCHDOG_STATE_DIR"] = str(tmp_path)  # no status.json: no daemon
    return env


CLI_ERRORS = [
    pytest.param(["run", "--interval", "-1"], "interval", id="run --interval -1"),
    pytest.param(["run", "--config", "{bad}"], "TOML", id="broken config file"),
    pytest.param(["run", "--config", "{missing}"], "does not exist", id="missing config file"),
    pytest.param(["run", "--nope"], "--nope", id="unknown option"),
    pytest.param(["run", "--listen", "bad"], "listen", id="run --listen bad"),
    pytest.param(["run", "--deadline", "soon"], "deadline", id="run --deadline soon"),
    pytest.param(["run", "--confirm", "0"], "confirm", id="run --confirm 0"),
    pytest.param(["status", "--dir", "/nonexistent"], "/nonexistent",
                 id="status --dir /nonexistent"),
    pytest.param(["inspect", "999999"], "999999", id="inspect 999999"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "needle"), CLI_ERRORS)
def test_cli_errors_are_one_line(argv: list[str], needle: str, tmp_path: Path,
                                 cli_env: dict[str, str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("interval = [\n")
    argv = [a.format(bad=bad, missing=tmp_path / "missing.toml") for a in argv]
    proc = subprocess.run([sys.executable, "-m", "watchdog.cli", *argv], env=cli_env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mlx-watchdog: ") and needle in lines[0]
    assert proc.stdout == ""


def test_peers_take_a_comma_separated_list_and_refuse_a_comma_in_a_host():
    from watchdog.daemon.config import build, parse_listen

    assert build({}, {"peers": ("a:1,b:2", "c:3")}).peers == ("a:1", "b:2", "c:3")
    assert build({"peers": ["a:1, b:2"]}, {}).peers == ("a:1", "b:2")
    with pytest.raises(ConfigError):
        parse_listen("a,b:1")


def test_launch_keys_are_launchs_alone_and_the_file_checks_them_as_before(
        tmp_path: Path) -> None:
    """The daemon's settings hold none of `launch`'s keys; the file still takes them
    (and `run` still refuses a bad one, with the same words and hints)."""
    path = write(tmp_path, "[watchdog]\nrestart = 2\nrestart_on = \"any\"\n"
                           "health_timeout = \"2m\"\ngrace = 3\n")
    settings = load(path, {})
    assert settings.grace == 3.0 and not hasattr(settings, "restart")
    launch = load_launch(path, {"restart": None, "warmup_waits": 4})
    assert launch == LaunchSettings(restart=2, restart_on="any", health_timeout=120.0,
                                    warmup_waits=4)
    bad = write(tmp_path, "[watchdog]\nrestart_on = \"sometimes\"\n")
    for reader in (load, load_launch):
        # Named with the file it is in (the operator's next step is to edit it).
        with pytest.raises(ConfigError, match=f"^config file {bad}: restart_on must be "
                                              "'torn-down' or 'any', got 'sometimes'$"):
            reader(bad, {})
    typo = write(tmp_path, "[watchdog]\nrestrat = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'restrat'; did you mean restart"):
        load(typo, {})


def test_a_node_is_never_its_own_peer():
    """One file for every node lists each node: its own entry is dropped at load (fences,
    the cluster view, doctor and wait-healthy read the peers from here), by its listen
    address, or its host name or an address of it with the listen's port; never a
    lookup."""
    import socket

    from watchdog.daemon.config import build, own_peers

    me = socket.gethostname()
    assert own_peers("10.9.9.1:9753", ("10.9.9.1:9753", "10.9.9.2:9753")) == ("10.9.9.1:9753",)
    assert own_peers("0.0.0.0:9753", (f"{me}:9753", "127.0.0.1:9753", "mac-2:9753",
                                      f"{me}:9999")) == (f"{me}:9753", "127.0.0.1:9753")
    assert own_peers("127.0.0.1:9753", ()) == ()
    settings = build({"listen": "0.0.0.0:9753", "peers": [f"{me}:9753", "mac-2:9753"]}, {})
    assert settings.peers == ("mac-2:9753",)
