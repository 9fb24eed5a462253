"""Help and errors as a person reads them: every option described, defaults shown one
way, the command lists whole, `-V`, durations with units everywhere (and said so), a
config typo named with its file and the key it likely meant, and words from inside the
project only.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.support import REPO
from watchdog import __version__
from watchdog.cli.commands import cli
from watchdog.daemon.config import ConfigError, load_file


def every_command() -> list[tuple[list[str], click.Command]]:
    found: list[tuple[list[str], click.Command]] = []

    def walk(command: click.Command, words: list[str]) -> None:
        found.append((words, command))
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, [*words, name])
    walk(cli, [])
    return found


def help_text(words: list[str]) -> str:
    done = CliRunner().invoke(cli, [*words, "--help"], terminal_width=80)
    assert done.exit_code == 0, done.output
    return done.output


def test_every_option_is_described_and_defaults_are_shown_one_way():
    for words, command in every_command():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, f"mlx-watchdog {' '.join(words)} {param.opts[0]}: no help"
        text = " ".join(help_text(words).split())
        for bracket in re.findall(r"\[([^\]]*)\]", text):
            # [default: ...] is the one way; option metavars and choices are the rest.
            assert bracket.startswith("default: ") or re.fullmatch(
                r"[A-Z]+|OPTIONS|ARGS|ARGS\.\.\.|[\w|-]+|[\d.]*<?=?x[<>]=[\d.]+",
                bracket), (words, bracket)


def test_the_command_lists_are_whole():
    for words, command in every_command():
        if not isinstance(command, click.Group):
            continue
        text = help_text(words)
        listed = text.split("Commands:", 1)[1]
        assert "..." not in listed, (words, listed)
        for name, sub in command.commands.items():
            first = sub.get_short_help_str(limit=200)
            assert " ".join(first.split()) in " ".join(listed.split()), (name, listed)


def test_version_has_a_short_flag():
    for flag in ("-V", "--version"):
        done = CliRunner().invoke(cli, [flag])
        assert done.exit_code == 0 and done.output == f"mlx-watchdog, version {__version__}\n"


def test_run_help_speaks_plainly():
    text = " ".join(help_text(["run"]).split())
    assert "the group's" not in text
    assert "mlx-watchdog --config FILE run" in text
    assert "Every duration takes seconds or a unit (500ms, 90s, 2m, 1h)" in text
    assert "--deadline SECONDS|AUTO how long a wait may last (seconds, or 90s, 2m as every " \
           "duration)" in text


@pytest.mark.parametrize("words", [["status", "--deadline"], ["watch", "--interval"],
                                   ["cluster", "status", "--timeout"], ["demo", "--deadline"],
                                   ["node", "wait-healthy", "--timeout"]])
def test_every_duration_takes_units_and_says_so(words, tmp_path):
    *command, flag = words
    text = " ".join(help_text(command).split())
    assert re.search(rf"{flag} \S+ [^[]*\((?:[^)]*)?(seconds, or|'auto' or a duration)", text) \
        or re.search(rf"{flag} \S+ [^[]*seconds, or \d", text), (flag, text)
    done = CliRunner().invoke(cli, [*command, flag, "soon"])  # refused before it runs
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert re.search(r"'soon' is not a duration|duration > 0", done.output), done.output


def test_a_duration_with_a_unit_is_taken(tmp_path):
    (tmp_path / "rec").mkdir()
    done = CliRunner().invoke(cli, ["status", "--deadline", "2m", "--dir", str(tmp_path / "rec"),
                                    "--state-dir", str(tmp_path)])
    assert done.exit_code == 0 and "no ranks in" in done.output, done.output
    done = CliRunner().invoke(cli, ["watch", "--interval", "200ms", "--count", "1",
                                    "--dir", str(tmp_path / "rec"), "--state-dir", str(tmp_path)])
    assert done.exit_code == 0, done.output


@pytest.mark.parametrize("text, said", [
    ("[watchdog]\ndeadlin = 60\n", "unknown setting 'deadlin'; did you mean deadline?"),
    ("deadlne = 60\n", "unknown setting 'deadlne'; did you mean deadline?"),
    ("[watchdog]\nzzz = 1\n", "unknown setting 'zzz'"),
    ("[watchdg]\ndeadline = 60\n", "unknown section [watchdg]: did you mean [watchdog]?"),
    ("[metrics]\nlisten = 1\n", "unknown section [metrics]: the only one is [watchdog]"),
])
def test_a_config_typo_names_the_file_and_what_was_meant(tmp_path: Path, text, said):
    path = tmp_path / "mlx-watchdog.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_file(str(path))
    assert str(err.value) == f"config file {path}: {said}"
    if "zzz" in text:
        assert "did you mean" not in str(err.value)


def test_a_config_typo_is_one_line_from_the_command(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[watchdog]\ninterva = 2\n")
    done = CliRunner().invoke(cli, ["--config", str(path), "status"])
    assert done.exit_code != 0 and "Traceback" not in done.output


WORDS_FROM_OUTSIDE = re.compile(r"\bthe seeds'|\bseeds' ")


def test_no_words_from_outside_the_project():
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "watchdog").rglob("*.py"))]
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert not WORDS_FROM_OUTSIDE.search(text), f"{path.relative_to(REPO)} says 'seeds''"
    assert "no slots of its own" not in (REPO / "watchdog" / "net" / "http.py").read_text()
