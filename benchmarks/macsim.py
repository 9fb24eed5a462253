"""Run a benchmark on the simulated Mac (docs/macos.md, "The simulated Mac"): the daemon
and every rank it starts with MLX_WATCHDOG_SIMULATE=macos, so the macOS path runs whole,
each macOS source a stand-in of watchdog/macsim reading the live process.

    python -m benchmarks.macsim wedge --runs 2 --healthy 150 --lookalike 120
    python -m benchmarks.macsim daemon_cost --counts 1 8 --seconds 30
    python -m benchmarks.macsim frozen

`frozen`: one daemon at its defaults; a ring job whose rank 1 is stopped for 40 s then
resumed (it must survive), then one whose rank 1 stays stopped (seconds to its end).

The benchmark's own arguments follow its name. Every process the test support starts
(tests/support/ranks.py's base_env: the daemon, ring ranks, servers) gets the variable.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from tests.support import lm_server, lm_train, netbed, ranks

SIMULATED = {"MLX_WATCHDOG_SIMULATE": "macos"}
BENCHMARKS = ("wedge", "daemon_cost", "stragglers", "server_hang", "train_hang", "frozen")


def simulated_env(original: Any) -> Any:
    def base_env(record_dir: Path | str, **extra: str) -> dict[str, str]:
        return original(record_dir, **{**SIMULATED, **extra})

    return base_env


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        raise SystemExit(f"usage: python -m benchmarks.macsim {{{','.join(BENCHMARKS)}}} ...")
    name = sys.argv.pop(1)
    patched = simulated_env(ranks.base_env)
    for module in (ranks, lm_server, lm_train, netbed):
        module.base_env = patched  # type: ignore[attr-defined]
    print(f"on the simulated Mac ({SIMULATED}): benchmarks.{name}", flush=True)
    if name == "frozen":
        frozen()
    else:
        importlib.import_module(f"benchmarks.{name}").main()


def frozen(pause: float = 40.0) -> None:
    import signal
    import tempfile
    import time

    from tests.support.lm_server import DefaultDaemon
    from tests.support.ranks import RingJob, wait_for

    with tempfile.TemporaryDirectory(prefix="mlxwd-macsim-") as tmp:
        root = Path(tmp)
        (root / "records").mkdir()
        with DefaultDaemon(root / "records", root / "state") as daemon:
            with RingJob(root / "pause", daemon.record_dir, 2, "loop") as job:
                job.wait_running(collectives=300)
                job.signal(1, signal.SIGSTOP)
                time.sleep(pause)
                job.signal(1, signal.SIGCONT)
                time.sleep(5)
                alive = all(p.poll() is None for p in job.procs)
                print(f"  pause {pause:.0f} s: job alive {alive}, "
                      f"{len(daemon.incidents())} incidents", flush=True)
            before = len(daemon.incidents())
            with RingJob(root / "frozen", daemon.record_dir, 2, "loop") as job:
                job.wait_running(collectives=300)
                job.signal(1, signal.SIGSTOP)
                began = time.monotonic()
                wait_for(lambda: all(p.poll() is not None for p in job.procs), 300,
                         interval=0.2, what="the frozen job ended")
                took = time.monotonic() - began
                inc = wait_for(lambda: [i for i in daemon.incidents()[before:]
                                        if i.get("outcome")], 30, what="the incident")[-1]
                print(f"  frozen peer ended {took:.1f} s after its SIGSTOP (verdict "
                      f"{inc['verdict']}, cause {inc['cause']}, culprit rank "
                      f"{inc['culprit']['rank']}, {inc['culprit']['state']})", flush=True)


if __name__ == "__main__":
    main()
