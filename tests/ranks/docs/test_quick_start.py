"""Every command of the README's "Quick start" that can run on Linux without root runs, as
written, in an empty HOME and working directory, and exits 0 (the filter is checked in
tests/unit/docs/test_readme.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO
from tests.unit.docs.test_readme import (
    cli_script,
    readme,
    runnable_here,
    script_dirs,
    section,
    shell_lines,
)

COMMAND_TIMEOUT = 180  # the demo takes ~15 s here; a loaded 2-core machine is slower


def user_env(tmp_path: Path) -> dict[str, str]:
    """A fresh user's environment: empty HOME, no MLX_* settings, this checkout's code."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO),
               PATH=os.pathsep.join([*script_dirs(), os.environ.get("PATH", "")]))
    return env


@pytest.mark.ranks
def test_quick_start_runs_as_written(tmp_path):
    lines = [line for line in shell_lines(section(readme(), "Quick start"))
             if runnable_here(line)]
    assert any(line.startswith("mlx-watchdog demo") for line in lines), lines
    cli_script()  # fail clearly when the package is not installed
    work = tmp_path / "work"
    work.mkdir()
    env = user_env(tmp_path)
    for line in lines:
        try:
            proc = subprocess.run(["bash", "-c", line], cwd=work, env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired as err:
            pytest.fail(f"{line!r} did not finish within {COMMAND_TIMEOUT}s:\n"
                        f"{err.stdout or ''}{err.stderr or ''}")
        assert proc.returncode == 0, (f"{line!r} exited {proc.returncode}:\n"
                                      f"{proc.stdout}\n{proc.stderr}")
