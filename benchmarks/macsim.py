"""Run a benchmark on the simulated Mac (docs/macos.md, "The simulated Mac"): the daemon
and every rank it starts with MLX_WATCHDOG_SIMULATE=macos, so the macOS path runs whole,
each macOS source a stand-in of watchdog/macsim reading the live process.

    python -m benchmarks.macsim wedge --runs 2 --healthy 150 --lookalike 120
    python -m benchmarks.macsim daemon_cost --counts 1 8 --seconds 30

The benchmark's own arguments follow its name. Every process the test support starts
(tests/support/ranks.py's base_env: the daemon, ring ranks, servers) gets the variable.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from tests.support import lm_server, lm_train, ranks

SIMULATED = {"MLX_WATCHDOG_SIMULATE": "macos"}
BENCHMARKS = ("wedge", "daemon_cost", "stragglers", "server_hang", "train_hang")


def simulated_env(original: Any) -> Any:
    def base_env(record_dir: Path | str, **extra: str) -> dict[str, str]:
        return original(record_dir, **{**SIMULATED, **extra})

    return base_env


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        raise SystemExit(f"usage: python -m benchmarks.macsim {{{','.join(BENCHMARKS)}}} ...")
    name = sys.argv.pop(1)
    patched = simulated_env(ranks.base_env)
    for module in (ranks, lm_server, lm_train):
        module.base_env = patched  # type: ignore[attr-defined]
    print(f"on the simulated Mac ({SIMULATED}): benchmarks.{name}", flush=True)
    importlib.import_module(f"benchmarks.{name}").main()


if __name__ == "__main__":
    main()
