"""Issue 38, item 3: the recipe's placeholder secret is refused with how to make one,
and a config file holding a secret that others may read is warned about (`run`, a
reload, `doctor`)."""

from __future__ import annotations

import logging
import os

import pytest

from watchdog.cli.commands import main
from watchdog.cli.exits import USAGE
from watchdog.daemon.config import ConfigError, Settings, build, secret_exposed
from watchdog.daemon.runner import describe

HOWTO = "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"


@pytest.mark.parametrize("placeholder", ["REPLACE-with-token_urlsafe-24",
                                         "replace-me-with-a-real-secret", "REPLACEMEREPLACEME"])
def test_the_recipes_placeholder_is_no_secret(placeholder):
    with pytest.raises(ConfigError) as err:
        build({"secret": placeholder}, {})
    said = str(err.value)
    assert "placeholder" in said and HOWTO in said and "\n" not in said
    assert placeholder not in said  # a secret's value is never echoed
    assert build({"secret": "a" * 16 + "REPLACE"}, {}).secret == "a" * 16 + "REPLACE"


def test_a_short_secret_says_how_to_make_one():
    with pytest.raises(ConfigError, match="at least 16 characters; make one with: "):
        build({"secret": "short"}, {})


def test_run_refuses_the_placeholder_in_one_line(tmp_path, capsys):
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'[watchdog]\ndir = "{tmp_path}/rec"\nstate_dir = "{tmp_path}/state"\n'
                   'secret = "REPLACE-with-token_urlsafe-24"   # the same on every Mac\n')
    with pytest.raises(SystemExit) as exit_:
        main(["--config", str(cfg), "run", "--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert exit_.value.code == USAGE
    assert err.count("\n") == 1 and err.startswith("mlx-watchdog: ") and HOWTO in err, err
    assert not (tmp_path / "state").exists()  # refused before anything was made


def test_a_config_with_a_secret_that_others_read_is_warned_about(tmp_path):
    cfg = tmp_path / "node.toml"
    cfg.write_text('[watchdog]\nsecret = "' + "s" * 24 + '"\n')
    os.chmod(cfg, 0o644)
    said = secret_exposed(str(cfg))
    assert said == (f"config file {cfg} holds the fence secret and its group and everyone "
                    f"may read it (mode 644): whoever reads it can end this cluster's jobs; "
                    f"chmod 600 {cfg}")
    os.chmod(cfg, 0o640)
    assert "and its group may read it (mode 640)" in secret_exposed(str(cfg))
    settings = Settings(dir=str(tmp_path), state_dir=str(tmp_path), secret="s" * 24)
    warned = [line for level, line in describe(settings, str(cfg)) if level == logging.WARNING]
    assert warned == [secret_exposed(str(cfg))]
    os.chmod(cfg, 0o600)
    assert secret_exposed(str(cfg)) == ""
    assert not [line for level, line in describe(settings, str(cfg))
                if level == logging.WARNING]
    cfg.write_text('[watchdog]\nmode = "observe"\n')  # no secret in it: nothing to hide
    os.chmod(cfg, 0o644)
    assert secret_exposed(str(cfg)) == "" and secret_exposed(str(tmp_path / "none")) == ""
