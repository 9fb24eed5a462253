"""A pytest plugin that runs real-rank tests on the simulated Mac (docs/macos.md):

    PYTHONPATH=$PWD python3 -m pytest -p tests.support.on_simulated_mac tests/ranks/...

Every process the test support starts through `base_env` (the daemon, ring ranks,
mpirun, servers) gets MLX_WATCHDOG_SIMULATE=macos, and every /status the tests read
must say "macos (simulated)": a test that passes so ran the macOS path whole. A
module that imported `base_env` by name before this plugin loaded keeps the original:
load it with -p, so it comes first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support import ranks

SIMULATED = {"MLX_WATCHDOG_SIMULATE": "macos"}
_base_env = ranks.base_env
_status = ranks.DaemonProc.status
checked = [0]


def base_env(record_dir: Path | str, **extra: str) -> dict[str, str]:
    return _base_env(record_dir, **{**SIMULATED, **extra})


def status(self: ranks.DaemonProc) -> dict[str, Any]:
    data = _status(self)
    if "platform" in data:
        assert data["platform"] == "macos (simulated)", data["platform"]
        checked[0] += 1
    return data


ranks.base_env = base_env
ranks.DaemonProc.status = status  # type: ignore[method-assign]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"on the simulated Mac: {checked[0]} /status reads said "
                                "'macos (simulated)'")
