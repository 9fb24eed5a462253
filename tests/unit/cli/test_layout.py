"""Where a command lives (watchdog/cli/commands.py's docstring): in the package of what it
serves, listed once in COMMANDS, with its heavy imports inside its body."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import REPO
from watchdog.cli import commands

GROUPS = ("look", "node", "service", "launch", "demo")


def test_every_command_is_listed_once_and_defined_in_its_group_package() -> None:
    assert len(set(commands.COMMANDS)) == len(commands.COMMANDS)
    assert commands.cli.commands == {c.name: c for c in commands.COMMANDS}
    for command in commands.COMMANDS:
        module = command.callback.__module__ if command.callback else ""
        package = module.removeprefix("watchdog.cli.").split(".")[0]
        assert package in GROUPS, (command.name, module)


def test_loading_the_command_line_loads_no_command_s_work() -> None:
    code = ("import json, sys; import watchdog.cli.commands; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('watchdog'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, check=True, timeout=60)
    loaded = set(json.loads(done.stdout))
    for heavy in ("watchdog.daemon.runner", "watchdog.cli.demo.story",
                  "watchdog.launch.supervisor", "watchdog.cli.node.doctor",
                  "watchdog.cli.look.sampling", "watchdog.rank.hook"):
        assert heavy not in loaded, heavy
