"""`mlx-watchdog doctor --mac-check`: what only a Mac's hardware can tell, measured.

It starts a small MLX job of its own (one process computing on the GPU, then saving a
checkpoint), reads it the way the daemon does, and prints each figure beside what the
daemon assumes, pass or fail, with a JSON report an operator can send back
(docs/macos.md, "A Mac's first hour"). On the simulated Mac it runs against the
stand-ins (watchdog/macsim), and says so.

    threads      root reads the job's threads through libproc (their ids native)
    sample       `sample PID 1` within the daemon's box, its report read back (`-file`)
                 and no file left behind
    ioreg        the job's Metal client listed, its GPU time advancing while it
                 computes; how often it moved (the daemon compares two readings 3-6 s
                 apart)
    powermetrics the GPU's residency and power under real work (the daemon reads a
                 resident GPU under `gpu_spin_watts` as spinning on nothing, and 0 W as
                 no reading)
    save bytes   a checkpoint's bytes seen by the disk counters or the files' offsets
    wired        wired memory back after the job is killed
    thermal      what the node's thermal state reads now
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from watchdog import host

# The job: the hook labels its compute (simulated Mac), it computes until told, then
# saves a checkpoint of 64 MiB when its stdin says "save", and waits to be killed.
JOB = """
import sys, threading, mlx.core as mx
try:
    import watchdog
    watchdog.install()
except Exception:
    pass
print("up", flush=True)
a = mx.random.normal((1024, 1024)) / 32
go = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), go.set()), daemon=True).start()
while not go.is_set():
    mx.eval((a @ a) @ a)
mx.save(sys.argv[1], mx.ones((16, 1024, 1024)))
print("saved", flush=True)
sys.stdin.readline()
"""
WATCH = 4.0  # seconds the job's GPU time is watched while it computes
POLL = 0.25


@dataclass
class Figure:
    """One measured figure: what was seen, what the daemon assumes, and the verdict."""

    check: str
    measured: str
    assumes: str
    level: str  # "pass", "fail", "warn" (could not be measured here)
    value: Any = None


def run_check(report_path: str | None = None) -> tuple[list[Figure], dict[str, Any]]:
    """Start the job, measure, end it; the figures and the JSON report."""
    from watchdog.daemon.judge.gpuwork import SPIN_MILLIWATTS, SPIN_RESIDENCY
    from watchdog.daemon.probes import probe
    from watchdog.daemon.probes.macos import MacProbe, read_offsets, read_threads

    p = probe()
    if not isinstance(p, MacProbe):
        raise RuntimeError("--mac-check measures a Mac (or the simulated one: "
                           "MLX_WATCHDOG_SIMULATE=macos); this is "
                           f"{host.platform_label()}")
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="mlx-watchdog-maccheck-") as work:
        env = {**os.environ, "MLX_WATCHDOG_DIR": work}
        checkpoint = os.path.join(work, "ckpt.npy")
        wired_before = p.wired_bytes()
        job = subprocess.Popen([sys.executable, "-c", JOB, checkpoint], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
        try:
            assert job.stdin is not None and job.stdout is not None
            if job.stdout.readline().strip() != "up":
                raise RuntimeError("the check's MLX job did not start (is mlx installed "
                                   "in this environment?)")
            time.sleep(1.0)  # under way
            figures.append(_threads(job.pid, p, read_threads))
            figures.append(_sample(job.pid, p))
            figures += _gpu(job.pid, p, SPIN_RESIDENCY, SPIN_MILLIWATTS)
            figures.append(_save(job, p, read_offsets))
        finally:
            with contextlib.suppress(OSError):
                job.send_signal(signal.SIGKILL)
            job.wait(30)
        figures.append(_wired(p, wired_before))
    thermal = p.thermal()
    figures.append(Figure("thermal", thermal or "not throttled (pmset, thermal pressure)",
                          "pmset's CPU speed limit and powermetrics' thermal pressure name a "
                          "straggler's thermal cause", "pass", thermal))
    report = {"host": os.uname().nodename, "platform": host.platform_label(),
              "python": sys.executable, "ok": not any(f.level == "fail" for f in figures),
              "figures": [asdict(f) for f in figures]}
    if report_path:
        with open(report_path, "w") as out:
            json.dump(report, out, indent=1)
    return figures, report


def _threads(pid: int, p: Any, read_threads: Any) -> Figure:
    threads = read_threads(pid, p.libproc)
    if threads:
        return Figure("threads", f"{len(threads)} threads read through libproc",
                      "root reads every rank's threads (PROC_PIDLISTTHREADIDS), ids native",
                      "pass", len(threads))
    sample = p.sample(pid)
    got = len(sample.threads) if sample is not None else 0
    return Figure("threads", f"libproc refused; psutil read {got}",
                  "root reads every rank's threads (PROC_PIDLISTTHREADIDS), ids native",
                  "fail", got)


def _sample(pid: int, p: Any) -> Figure:
    before = set(os.listdir(tempfile.gettempdir()))
    began = time.monotonic()
    stacks = p.native_stacks(pid, 30.0)
    took = time.monotonic() - began
    left = [n for n in set(os.listdir(tempfile.gettempdir())) - before
            if n.startswith("mlx-watchdog-sample-") or n.endswith(".sample.txt")]
    ok = bool(stacks) and took <= p.stack_timeout and not left
    return Figure("sample", f"{took:.2f}s, {len(stacks or {})} threads read"
                  + (f", left behind: {left}" if left else ""),
                  f"`sample PID 1 -file` within {p.stack_timeout:g}s, no report left",
                  "pass" if ok else "fail", round(took, 2))


def _gpu(pid: int, p: Any, residency: float, milliwatts: float) -> list[Figure]:
    readings = []
    why = ""
    until = time.monotonic() + WATCH
    while time.monotonic() < until:
        ns, why = p.gpu_reading(pid, 5.0)
        readings.append((time.monotonic(), ns))
        time.sleep(POLL)
    known = [(t, ns) for t, ns in readings if ns is not None]
    moves = [t for (t, ns), (_, before) in zip(known[1:], known, strict=False) if ns > before]
    gaps = [b - a for a, b in zip(moves, moves[1:], strict=False)]
    if not known:
        gpu = Figure("ioreg", f"GPU time unknown: {why}",
                     "ioreg lists every Metal rank with its accumulatedGPUTime", "fail")
    else:
        gap = max(gaps) if gaps else (WATCH if not moves else 0.0)
        gpu = Figure("ioreg", f"listed; moved {len(moves)} times in {WATCH:g}s, longest "
                     f"gap {gap:.2f}s", "GPU time of a computing rank advances between two "
                     "samples 3-6 s apart", "pass" if moves and gap < 3.0 else "fail",
                     {"moves": len(moves), "longest_gap": round(gap, 2)})
    power = p.gpu_power(10.0)
    if power is None:
        watts = Figure("powermetrics", "no reading (not root, or no powermetrics)",
                       "a reading under work; none leaves GPU time advancing as work", "warn")
    else:
        spins = power.active_percent >= residency and 0 < power.milliwatts < milliwatts
        watts = Figure("powermetrics", f"{power.active_percent:.0f}% resident at "
                       f"{power.milliwatts:.0f} mW under work",
                       f"a GPU at work is not read as spinning (>= {residency:g}% under "
                       f"{milliwatts:g} mW); 0 mW is no reading",
                       "fail" if spins else "pass" if power.milliwatts > 0 else "warn",
                       asdict(power))
    return [gpu, watts]


def _save(job: subprocess.Popen[str], p: Any, read_offsets: Any) -> Figure:
    assert job.stdin is not None and job.stdout is not None
    first = p.sample(job.pid)
    offsets = read_offsets(job.pid, p.libproc)
    job.stdin.write("save\n")
    job.stdin.flush()
    job.stdout.readline()
    later = p.sample(job.pid)
    moved_offsets = read_offsets(job.pid, p.libproc)
    disk = (later.io[1] - first.io[1]) if first and later and first.io and later.io else None
    moved = (moved_offsets - offsets) if offsets is not None and moved_offsets is not None \
        else None
    ok = bool(disk) or bool(moved)
    return Figure("save bytes", f"disk counters {disk} B written, offsets moved {moved} B "
                  "(64 MiB saved)", "a save's bytes are seen (disk counters, or the files' "
                  "offsets where they miss)", "pass" if ok else "warn",
                  {"disk": disk, "offsets": moved})


def _wired(p: Any, before: int | None) -> Figure:
    time.sleep(2.0)
    after = p.wired_bytes()
    if before is None or after is None:
        return Figure("wired", "no wired-memory reading", "wired memory comes back after a "
                      "kill (else the node is flagged for reboot)", "warn")
    grew = after - before
    return Figure("wired", f"{grew / 2**20:+.0f} MiB 2 s after the kill",
                  "wired memory comes back after a kill (else the node is flagged)",
                  "pass" if grew < 256 * 2**20 else "fail", grew)
