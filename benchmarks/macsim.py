"""Run a benchmark on the simulated Mac (docs/macos.md, "The simulated Mac"): the daemon
and every rank it starts with MLX_WATCHDOG_SIMULATE=macos, so the macOS path runs whole,
each macOS source a stand-in of watchdog/macsim reading the live process.

    python -m benchmarks.macsim wedge --runs 2 --healthy 150 --lookalike 120
    python -m benchmarks.macsim wedge --backend mpi --runs 2 --healthy 0
    python -m benchmarks.macsim daemon_cost --counts 1 8 --seconds 30
    python -m benchmarks.macsim frozen
    python -m benchmarks.macsim saves
    python -m benchmarks.macsim gpu [--seconds 120] [--unknown]

`gpu` (issue 54): one daemon at its defaults, the GPU profile (MLX's compute stands for
the GPU, every CPU thread asleep in the eval), at once: a single process computing
SECONDS in one eval, a ring job whose rank 1 computes SECONDS while rank 0 waits in the
all_sum, and a ring job parked in an all_sum (a quiet hang). The two computing jobs must
end on their own with no incident, status saying their GPU time advances; the quiet hang
is ended (seconds to its end). With --unknown, every rank's `ioreg` client is unlisted
(GPU time unknown): the computing jobs are still held, and the quiet hang must be held
too (said "GPU time unknown"), up to `blocked_deadline`.

`frozen`: one daemon at its defaults; a ring job whose rank 1 is stopped for 40 s then
resumed (it must survive), then one whose rank 1 stays stopped (seconds to its end).

`saves`: the real trainer's two checkpoint scenarios of tests/ranks/clients/
test_mlx_lm_train.py, one job each at once under one daemon at its defaults: rank 0's
checkpoint to slow storage (a FIFO drained over 150 s) must hold the job, the run
finishing with no incident; one to storage that never answers (a FIFO never opened) is
ended at the floor of silence plus 15 s, rank 0 and its save named.

The benchmark's own arguments follow its name. Every process the test support starts
(tests/support/ranks.py's base_env: the daemon, ring ranks, mpirun and its ranks,
servers) gets the variable.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from tests.support import lm_server, lm_train, netbed, ranks

SIMULATED = {"MLX_WATCHDOG_SIMULATE": "macos"}
BENCHMARKS = ("wedge", "daemon_cost", "stragglers", "throttled", "server_hang", "train_hang",
              "frozen", "saves", "gpu")


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
    elif name == "saves":
        saves()
    elif name == "gpu":
        seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) \
            if "--seconds" in sys.argv else 120.0
        gpu(seconds, "--unknown" in sys.argv)
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


def saves(slow_seconds: float = 150.0, save_at: int = 20) -> None:
    import tempfile
    import threading
    import time

    from tests.support.lm_server import DefaultDaemon, build_model
    from tests.support.lm_train import LmTrain, SlowStorage, build_dataset, checkpoint_name
    from tests.support.ranks import wait_for

    with tempfile.TemporaryDirectory(prefix="mlxwd-macsim-saves-") as tmp:
        root = Path(tmp)
        (root / "records").mkdir()
        model, data = build_model(root / "model"), build_dataset(root / "data")
        with DefaultDaemon(root / "records", root / "state") as daemon:
            def job(name: str) -> LmTrain:
                return LmTrain(root / name, root / "records", model, data,
                               iters=save_at + 4, save_every=save_at, eval_every=10)
            slow_job, stuck_job = job("slow"), job("stuck")
            slow = SlowStorage(slow_job.adapters / checkpoint_name(save_at),
                               seconds=slow_seconds)
            SlowStorage(stuck_job.adapters / checkpoint_name(save_at))  # never opened
            slow.start()
            reasons: dict[str, set[str]] = {"slow": set(), "stuck": set()}
            lines: dict[str, str] = {}

            def watch(name: str, train: LmTrain) -> None:
                with train:
                    began = time.monotonic()
                    if name == "slow":
                        first = train.adapters / "adapters.safetensors"
                        wait_for(lambda: first.exists() and first.stat().st_size > 0, 300,
                                 interval=0.2, what="the first save")
                        slow.size = first.stat().st_size
                    else:
                        wait_for(lambda: (r := train.records().get(0)) is not None
                                 and r.op == "save_safetensors" and r.phase.label == "wait",
                                 300, interval=0.2, what="rank 0 in the save")
                        began = time.monotonic()

                    def done() -> bool:
                        for r in daemon.status()["ranks"]:
                            if r["pid"] in train.pids:
                                reasons[name].add(r["reason"] or "")
                        return train.finished()
                    wait_for(done, slow_seconds + 300, interval=0.5, what=f"{name} ended")
                    took = time.monotonic() - began
                    found = [i for i in daemon.incidents()
                             if set(i["pids"]) & set(train.pids)]
                    held = sorted(r for r in reasons[name] if "held" in r)
                    lines[name] = (f"  {name} save: ended {took:.1f} s after "
                                   f"{'the save began' if name == 'stuck' else 'the start'}, "
                                   f"codes {train.codes()}, {len(found)} incidents"
                                   + (f" (cause {found[0]['cause']}, culprit "
                                      f"{found[0]['culprit']})" if found else "")
                                   + f"; held: {held[:2]}")
            threads = [threading.Thread(target=watch, args=(n, j))
                       for n, j in (("slow", slow_job), ("stuck", stuck_job))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            slow.stopping.set()
            print(f"  slow storage: {slow.received} of {slow.size} bytes in "
                  f"{(slow.ended or time.monotonic()) - (slow.began or time.monotonic()):.1f} s",
                  flush=True)
            for name in ("slow", "stuck"):
                print(lines.get(name, f"  {name}: no result"), flush=True)



def gpu(seconds: float = 120.0, unknown: bool = False) -> None:
    import os
    import subprocess
    import tempfile
    import time

    from tests.support import SUPPORT
    from tests.support.lm_server import DefaultDaemon
    from tests.support.ranks import RingJob, base_env, wait_for
    from tests.support.wedges import armed, build_shim

    mode = {"MLX_WATCHDOG_SIMULATE_GPU": "unlisted"} if unknown else {}
    with tempfile.TemporaryDirectory(prefix="mlxwd-macsim-gpu-") as tmp:
        root = Path(tmp)
        (root / "records").mkdir()
        shim = build_shim(root)
        trigger = root / "park-now"
        with DefaultDaemon(root / "records", root / "state") as daemon:
            records = daemon.record_dir
            with RingJob(root / "park", records, 2, "loop",
                         env={**armed(shim, trigger, "park", "*"), **mode}) as parked, \
                    RingJob(root / "peer", records, 2, "slowpeer", args=(str(seconds),),
                            env=mode) as peer:
                log = open(root / "solo.log", "wb")  # noqa: SIM115 - the process's own
                solo = subprocess.Popen(
                    [sys.executable, str(SUPPORT / "solo_prog.py"), "long", str(seconds)],
                    stdout=log, stderr=subprocess.STDOUT,
                    env=base_env(records, MLX_WATCHDOG="1", **mode))
                parked.wait_running(collectives=50)
                wait_for(lambda: "slowpeer:" in peer.log(1), 120, what="rank 1 computing")
                trigger.touch()
                began = time.monotonic()
                said: dict[str, str] = {}
                ended_at = None
                while solo.poll() is None or any(p.poll() is None for p in peer.procs):
                    ranks = daemon.ranks()
                    for name, pid in (("solo", solo.pid), ("peer rank 1", peer.pids[1]),
                                      ("peer rank 0", peer.pids[0]),
                                      ("parked rank 0", parked.pids[0])):
                        reason = (ranks.get(pid) or {}).get("reason") or ""
                        if "GPU time" in reason or "held" in reason:
                            said[name] = reason
                    if ended_at is None and all(p.poll() is not None for p in parked.procs):
                        ended_at = time.monotonic() - began
                    time.sleep(1.0)
                    if time.monotonic() - began > seconds + 240:
                        break
                took = time.monotonic() - began
                incidents = daemon.incidents()
                ours = [i for i in incidents if set(i["pids"]) & {solo.pid, *peer.pids}]
                quiet = [i for i in incidents if set(i["pids"]) & set(parked.pids)]
                print(f"  {'GPU time unknown (unlisted)' if unknown else 'GPU profile'}: "
                      f"{seconds:.0f} s evals ran {took:.0f} s; solo exit {solo.returncode}, "
                      f"peer exits {[p.returncode for p in peer.procs]}; incidents on them: "
                      f"{len(ours)}", flush=True)
                for name, reason in said.items():
                    print(f"    {name}: {reason[:200]}", flush=True)
                end = f"ended {ended_at:.1f} s after the park" if ended_at else "not ended"
                cause = quiet[-1]["cause"] if quiet else "no incident"
                print(f"  quiet hang: {end} ({cause}); load {os.getloadavg()[0]:.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
