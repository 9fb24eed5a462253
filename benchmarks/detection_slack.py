"""Detection slack: from a frozen peer to the survivors' end, minus the deadline.

Each run: a real 3-rank MLX ring job (tests/support/rank_prog.py `loop`: all_sum
rounds, hook installed) under the real daemon (`mlx-watchdog run`, interval
1 s, a fixed deadline, the daemon's default grace, confirm and evidence
timeout unless given). Once the daemon has watched the job for a few scans
(and a random fraction of an interval more, so the freeze falls at any phase
of the daemon's ticks), rank 1 gets SIGSTOP; ranks 0 and 2 spin in a wait that never returns. Times
(wall clock, all relative to the SIGSTOP, minus the deadline):

    decision  the incident's `time` (the scan that found the job hung)
    evidence  first signal of the ladder minus the incident's `time` (stack
              dumps: faulthandler via the dump signal, then py-spy or gdb,
              bounded by --evidence-timeout)
    sigterm   the first SIGTERM to a survivor (rank 0 or 2) in `signals`
    exit      both survivors seen gone by this script (polled every 5 ms)

The evidence stretch is split further by its files' modification times:
when the Python stacks (faulthandler) were copied and when the native
samplers finished, both counted from the incident's `time`.

Target: median slack to the kill <= 1 interval + grace.

    python -m benchmarks.detection_slack --runs 10 --deadline 5
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.ranks import DaemonProc, RingJob, wait_for


def evidence_done(incident: dict, kind: str) -> float:
    """Seconds from the incident's `time` to the last evidence file of `kind` written.

    Python stacks (faulthandler, every rank asked at once) are copied first,
    then the native samplers (py-spy or gdb) run side by side; the files'
    modification times split the evidence stretch between the two.
    """
    times = [os.stat(f).st_mtime for f in incident.get("evidence", [])
             if f.endswith(f"-{kind}.txt") and os.path.exists(f)]
    return max(times) - incident["time"] if times else float("nan")


def one_run(workdir: Path, args: argparse.Namespace, rng: random.Random
            ) -> dict[str, float | str]:
    records, state = workdir / "records", workdir / "state"
    records.mkdir()
    daemon = DaemonProc(records, state, "--log-level", "info", interval=args.interval,
                        deadline=args.deadline, grace=args.grace,
                        evidence_timeout=args.evidence_timeout, kill_timeout=10,
                        confirm=args.confirm, blocked_deadline=600, settle=5,
                        listen="127.0.0.1:0")
    job = RingJob(workdir, records, 3, "loop")
    try:
        daemon.start()
        job.start()
        job.wait_running(timeout=120)
        wait_for(lambda: len(daemon.ranks()) == 3, 60, what="the daemon sees 3 ranks")
        # A few scans (CPU samples of every rank), then a random phase against the
        # daemon's ticks: the wait above ends just after a scan, and freezing at a
        # fixed offset from it would measure one phase only (the worst, here).
        time.sleep(3 * args.interval + rng.uniform(0, args.interval))
        load = os.getloadavg()[0]
        frozen = time.time()
        job.signal(1, signal.SIGSTOP)
        survivors = [job.procs[0], job.procs[2]]
        wait_for(lambda: all(p.poll() is not None for p in survivors),
                 args.deadline + args.evidence_timeout + args.grace + 60, interval=0.005,
                 what="the survivors' end")
        exited = time.time()
        incident = wait_for(lambda: daemon.incidents(), 60, what="the incident")[0]
        survivor_pids = {p.pid for p in survivors}
        signals = incident["signals"]
        first_signal = min(s["time"] for s in signals)
        sigterm = min(s["time"] for s in signals
                      if s["signal"] == "SIGTERM" and s["pid"] in survivor_pids)
        culprit = (incident.get("culprit") or {}).get("rank")
        d = args.deadline
        return {"decision": incident["time"] - frozen - d,
                "evidence": first_signal - incident["time"],
                "python_stacks": evidence_done(incident, "python"),
                "native_stacks": evidence_done(incident, "native"),
                "sigterm": sigterm - frozen - d, "exit": exited - frozen - d,
                "verdict": incident["verdict"], "culprit": str(culprit),
                "evidence_files": str(len(incident.get("evidence", []))), "load": load}
    finally:
        job.stop()
        daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--deadline", type=float, default=5.0)
    parser.add_argument("--grace", type=float, default=10.0, help="daemon default 10")
    parser.add_argument("--evidence-timeout", type=float, default=10.0,
                        help="daemon default 10")
    parser.add_argument("--confirm", type=int, default=2, help="daemon default 2")
    parser.add_argument("--seed", type=int, default=1, help="for the freeze's phase")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"interval {args.interval:g}s, deadline {args.deadline:g}s, grace {args.grace:g}s, "
          f"evidence timeout {args.evidence_timeout:g}s, confirm {args.confirm}; "
          f"{os.cpu_count()} cpus", flush=True)
    results = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            r = one_run(Path(tmp), args, rng)
        results.append(r)
        print(f"run {run + 1:2d}: decision {r['decision']:+.2f}s  evidence {r['evidence']:.2f}s "
              f"(python {r['python_stacks']:.2f}, native {r['native_stacks']:.2f})"
              f"  sigterm {r['sigterm']:+.2f}s  exit {r['exit']:+.2f}s  ({r['verdict']}, "
              f"culprit rank {r['culprit']}, {r['evidence_files']} evidence files, "
              f"load {r['load']:.2f})", flush=True)
    print(f"slack after the {args.deadline:g}s deadline, {args.runs} runs (median / worst):")
    labels = {"decision": "decision (incident time)",
              "evidence": "evidence (part of sigterm)",
              "python_stacks": "  python stacks copied at",
              "native_stacks": "  native stacks done at",
              "sigterm": "first SIGTERM to a survivor", "exit": "survivors gone"}
    for key, label in labels.items():
        values = [float(r[key]) for r in results if not math.isnan(float(r[key]))]
        if not values:
            print(f"  {label:<29} {'-':>6}    {'-':>6}   (no such files)")
            continue
        missing = len(results) - len(values)
        print(f"  {label:<29} {statistics.median(values):6.2f}s / {max(values):6.2f}s"
              + (f"   ({missing} runs without such files)" if missing else ""))
    target = args.interval + args.grace
    kill = statistics.median(float(r["sigterm"]) for r in results)
    print(f"target: median slack to the kill <= interval + grace = {target:g}s: "
          f"{'met' if kill <= target else 'MISSED'} ({kill:.2f}s to SIGTERM)")


if __name__ == "__main__":
    main()
