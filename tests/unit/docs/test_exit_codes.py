"""Issue 38, item 6: the exit codes the docs promise are the program's. The table of
docs/operations.md, its `launch` table, and every sentence of the README and the docs
that says a command exits with a code are read and held to `watchdog/cli/exits.py` (the
README said `cluster status` exits 2 when no node answers: it exits 4; operations.md
said an error of mlx-watchdog itself in `launch` is 1: it is 3)."""

from __future__ import annotations

import re

from tests.support import REPO
from watchdog.cli import exits
from watchdog.cli.launch.commands import launch

OPERATIONS = REPO / "docs" / "operations.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def table_after(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header row starts `header`, cells stripped."""
    lines = text[text.index(header):].splitlines()
    rows = []
    for line in lines[2:]:  # past the header and its rule
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def codes_in(cell: str) -> set[int]:
    """`0`, `10` - `13`, `130` (`143` for SIGTERM): the codes a cell names."""
    found = {int(n) for n in re.findall(r"`(\d+)`", cell)}
    for low, high in re.findall(r"`(\d+)` - `(\d+)`", cell):
        found |= set(range(int(low), int(high) + 1))
    return found


def test_the_operations_table_is_the_programs_table():
    rows = table_after(OPERATIONS.read_text(encoding="utf-8"), "| code | meaning | from |")
    documented = set().union(*(codes_in(row[0]) for row in rows))
    assert documented == {code for code, _ in exits.TABLE}
    said = {code: row[1] + " " + row[2] for row in rows for code in codes_in(row[0])}
    assert "cluster status" in said[exits.NO_ANSWER] and "no node" in said[exits.NO_ANSWER]
    assert "verdict" in said[exits.VERDICT] and "usage" in said[exits.USAGE]
    assert "setup" in said[exits.SETUP] and "wait-healthy" in said[exits.REFUSED]


# The launch table's rows, by what they say, and the code the program gives each.
LAUNCH_ROWS = {"every rank exited 0": {exits.OK},
               "the watchdog ended the job": {exits.TORN_DOWN},
               "fence ended it": {exits.TORN_DOWN},
               "died of a signal": {exits.RANKS_FAILED},
               "exited non-zero on its own": {exits.RANKS_FAILED},
               "Ctrl-C": {exits.INTERRUPTED, exits.TERMINATED},
               "not fit": {exits.REFUSED},
               "without progress": {exits.GAVE_UP}}


def test_the_launch_table_gives_the_programs_codes():
    from watchdog.launch import relaunch

    rows = table_after(OPERATIONS.read_text(encoding="utf-8"),
                       "| how the attempt ended | relaunched | `launch` exits |")
    assert len(rows) == len(LAUNCH_ROWS)
    for row in rows:
        (expected,) = [codes for words, codes in LAUNCH_ROWS.items() if words in row[0]]
        assert codes_in(row[2]) == expected, row
    ending = relaunch.Ending
    assert relaunch.exit_code(ending.WATCHDOG) == relaunch.exit_code(ending.FENCED) == \
        exits.TORN_DOWN
    assert relaunch.exit_code(ending.CRASHED) == exits.RANKS_FAILED
    assert relaunch.exit_code(ending.INTERRUPTED, 15) == exits.TERMINATED


# What a sentence says a command exits with, and the code it must name.
SENTENCES = [
    (r"(\d+) (?:when|if) no node answer", exits.NO_ANSWER),
    (r"exits `?(\d+)`? when no node\s+answers", exits.NO_ANSWER),
    (r"`(\d+)` is an error of `mlx-watchdog` itself", exits.SETUP),
    (r"--check`? exits (\d+)", exits.VERDICT),
    (r"node status`?[^|\n]*?\(exits? (\d+) if so\)", exits.VERDICT),
    (r"wait-healthy[^|\n]*?\(exits (\d+) if not", exits.REFUSED),
    (r"doctor`? \(exits (\d+) on a failure\)", exits.VERDICT),
    (r"`mlx-watchdog run` exits (\d+) with one line, no traceback", exits.SETUP),
    (r"`launch` exits (\d+) when it refuses", exits.REFUSED),
    (r"\((?:give up )?\(?exit (\d+)\) after this many attempts", exits.GAVE_UP),
]


def test_every_sentence_naming_an_exit_code_names_the_programs():
    seen = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for pattern, code in SENTENCES:
            for match in re.finditer(pattern, text):
                seen += 1
                line = text.count("\n", 0, match.start()) + 1
                assert int(match.group(1)) == code, (
                    f"{page.name}:{line}: {match.group(0)!r} says {match.group(1)}, the "
                    f"program exits {code}")
    assert seen >= 8, "the sentences were not found: the patterns are stale"


def test_launch_help_names_every_code_it_exits_with():
    said = launch.help or ""
    for code in (exits.OK, exits.USAGE, exits.SETUP, exits.RANKS_FAILED, exits.TORN_DOWN,
                 exits.REFUSED, exits.GAVE_UP, exits.INTERRUPTED, exits.TERMINATED):
        assert re.search(rf"\b{code}\b", said), (code, said)
