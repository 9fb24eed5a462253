"""Facts the docs state that the code decides (issue 28, item 13): the record's size,
an invalid record's reason, that the daemon never reboots, one hang-to-kill range on
every page that quotes it, and no placeholder where a reader copies a command."""

from __future__ import annotations

import re

from tests.support import REPO
from watchdog.cli.service.unit import render
from watchdog.record import RecordError, layout
from watchdog.record.reader import decode

DOCS = REPO / "docs"


def test_the_record_size_is_the_layouts():
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    kib = layout.RECORD_SIZE // 1024
    assert f"One {kib} KiB file ({layout.RECORD_SIZE:,} bytes) per rank" in text
    assert f"mmap, {kib} KiB" in text
    assert not re.search(r"\b16 KiB\b", text)


def test_the_invalid_record_example_is_what_the_reader_says():
    try:
        decode(b"x" * 12)
    except RecordError as err:
        said = str(err)
    else:
        raise AssertionError("a 12-byte record parsed")
    assert f'"size 12, expected {layout.RECORD_SIZE}"' in (DOCS / "metrics.md").read_text(
        encoding="utf-8"), said
    assert said == f"size 12, expected {layout.RECORD_SIZE}"


def test_nothing_says_the_daemon_reboots():
    plist = render("launchd", executable="/usr/local/bin/mlx-watchdog",
                   config="/etc/mlx-watchdog.toml", record_dir="/var/run/mlx-watchdog",
                   state_dir="/var/db/mlx-watchdog")
    for name, text in (("README.md", (REPO / "README.md").read_text(encoding="utf-8")),
                       ("the plist", plist),
                       ("launchd/", (REPO / "launchd" / "com.github.mlx-watchdog.plist")
                        .read_text(encoding="utf-8"))):
        assert "rebooting need" not in " ".join(text.split()), name
        assert "it never reboots" in " ".join(text.split()), name


def test_one_hang_to_kill_range_everywhere():
    quoted = {}
    for page in (REPO / "README.md", DOCS / "configuration.md", DOCS / "performance.md"):
        text = " ".join(page.read_text(encoding="utf-8").split())
        # A frozen peer's (or a hung server's) figure; a stuck save's is its own.
        quoted[page.name] = set(re.findall(
            r"about (\d+-\d+) s (?:later at|after the (?:hang|freeze)|from the freeze)", text))
    assert all(quoted.values()) and len(set().union(*quoted.values())) == 1, quoted


def test_no_placeholder_in_a_command_to_copy():
    for page in (*DOCS.glob("*.md"), REPO / "README.md"):
        for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```",
                                page.read_text(encoding="utf-8"), re.S):
            assert "<you>" not in block, page.name
