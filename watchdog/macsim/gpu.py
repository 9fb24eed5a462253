"""The simulated Mac's GPU: MLX's compute thread stands for it.

On a Mac, MLX computes on the GPU: while a long eval runs the rank's CPU threads sleep
(the main thread in `eval_impl`, the stream's thread waiting on its command buffer) and
the work shows only as the process's GPU time (`ioreg`'s `accumulatedGPUTime`). On
Linux's CPU backend the same work runs on the CPU stream's worker thread. So, on the
simulated Mac:

- the rank labels that thread (`label`, called by the hook at install: one
  `mx.synchronize()` starts the default stream's worker, and every thread it started is
  named LABEL through /proc/self/task/<tid>/comm);
- the stand-ins that show threads (psutil_mac, libproc) leave labelled threads out, the
  `sample` stand-in draws them as a Mac's GPU stream thread, parked (tools.py), and
  `ioreg` shows their CPU time as the process's `accumulatedGPUTime`, one
  AGXDeviceUserClient per Metal process (a process with a labelled thread);
- `powermetrics --samplers gpu_power` reports the GPU's residency and power from every
  Metal process's GPU time over its interval (resident at working watts while any
  computes, idle otherwise).

Where the simulation cannot stand for the Mac, it says so: an MPI rank (Open MPI's
variables in its environment) runs its collectives on the same CPU stream thread, which
a Mac runs apart from its GPU stream, so an MPI rank keeps its compute on the CPU (its
client listed, its GPU time 0); so does every rank under the mode "cpu". Only the
threads the default stream started at install are labelled (a stream made later, or a
worker started before the hook, computes on the CPU).

Test modes, a comma list in the rank's MLX_WATCHDOG_SIMULATE_GPU (or, for the
GPU-wide ones, the daemon's), give what a Mac can also give:

    unlisted    ioreg lists no client for this rank (its GPU time unknown)
    spin        mlx #3830: a kernel spins on nothing, the GPU time advancing with the
                wall clock, the GPU resident at ~3 W
    zero-watts  powermetrics reports the GPU's power as 0 mW (macOS 27, an M5 Max)
    cpu         no GPU profile: the rank computes on the CPU as before
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

LABEL = "mlx-gpu"
MODES_VARIABLE = "MLX_WATCHDOG_SIMULATE_GPU"
MPI_VARIABLE = "OMPI_COMM_WORLD_RANK"
# powermetrics' figures, from recorded output (tests/support/data/
# powermetrics_gpu_power.txt) and mlx #3830's report.
IDLE_RESIDENCY, IDLE_MILLIWATTS = 2.6, 23.0
WORK_MILLIWATTS = 8500.0  # a fully resident GPU at work
SPIN_MILLIWATTS = 3000.0  # #3830: fully resident, no work


def label(mx: Any, task: str = "/proc/self/task") -> list[int]:
    """Rank side: start the default stream's worker and name every thread it started
    LABEL; the ids named. Never raises (a simulation aid only)."""
    try:
        before = set(os.listdir(task))
        mx.synchronize()
        started = sorted(set(os.listdir(task)) - before, key=int)
        for tid in started:
            with open(f"{task}/{tid}/comm", "w") as f:
                f.write(LABEL)
        return [int(t) for t in started]
    except Exception:  # noqa: BLE001 - never into the user's program
        return []


def labelled(pid: int, proc: str = "/proc") -> list[int]:
    """The process's threads that stand for its GPU (named LABEL)."""
    out = []
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/comm") as f:
                if f.read().strip() == LABEL:
                    out.append(int(tid))
        except OSError:
            continue
    return out


_modes: dict[int, tuple[int, frozenset[str]]] = {}


def modes(pid: int, proc: str = "/proc") -> frozenset[str]:
    """The rank's test modes (its environment), "cpu" for an MPI rank; cached by pid
    and start."""
    start = _start(pid, proc)
    cached = _modes.get(pid)
    if cached is not None and cached[0] == start:
        return cached[1]
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            pairs = dict(p.split(b"=", 1) for p in f.read().split(b"\0") if b"=" in p)
    except OSError:
        return frozenset()
    found = {m.strip() for m in pairs.get(MODES_VARIABLE.encode(), b"").decode().split(",")
             if m.strip()}
    if MPI_VARIABLE.encode() in pairs:
        found.add("cpu")
    if len(_modes) > 4096:
        _modes.clear()
    _modes[pid] = (start, frozenset(found))
    return _modes[pid][1]


def hidden(pid: int, proc: str = "/proc") -> set[int]:
    """The threads a Mac would not show as the rank's CPU threads: its labelled ones,
    unless it computes on the CPU (mode "cpu", an MPI rank)."""
    tids = labelled(pid, proc)
    if not tids or "cpu" in modes(pid, proc):
        return set()
    return set(tids)


def _start(pid: int, proc: str) -> int:
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return -1


def _cpu_ns(pid: int, tids: Iterable[int], proc: str) -> int:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * 1_000_000_000 // tick
        except (OSError, ValueError, IndexError):
            continue
    return total


def gpu_ns(pid: int, proc: str = "/proc", work_only: bool = False) -> int | None:
    """The process's accumulated GPU nanoseconds as a Mac's ioreg would show them; None
    for a process that is not a Metal one (no labelled thread) or whose client is not
    listed (mode "unlisted"). `work_only`: without a spinning kernel's time (the power
    it draws is work's), listed or not."""
    tids = labelled(pid, proc)
    if not tids:
        return None
    found = modes(pid, proc)
    if "unlisted" in found and not work_only:
        return None
    ns = 0 if "cpu" in found else _cpu_ns(pid, tids, proc)
    if "spin" in found and not work_only:  # a kernel spinning: GPU time goes by
        start = _start(pid, proc)
        ns += max(0, time.clock_gettime_ns(time.CLOCK_BOOTTIME)
                  - start * 1_000_000_000 // os.sysconf("SC_CLK_TCK"))
    return ns


def metal_pids(proc: str = "/proc") -> list[int]:
    """Every process with a labelled thread (a Metal process)."""
    out = []
    for name in os.listdir(proc):
        if name.isdigit() and labelled(int(name), proc):
            out.append(int(name))
    return sorted(out)


def ioreg_text(proc: str = "/proc") -> str:
    """`ioreg -r -c AGXDeviceUserClient -l -w0` as a Mac prints it: one client per
    Metal process, its properties sorted by key (probes/gputime.py)."""
    blocks = []
    for pid in metal_pids(proc):
        ns = gpu_ns(pid, proc)
        if ns is None:
            continue
        try:
            with open(f"{proc}/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        submitted = time.monotonic_ns() * 3 // 125  # mach absolute time
        blocks.append(
            f"+-o AGXDeviceUserClient  <class AGXDeviceUserClient, id 0x{0x1000a0000 + pid:x}, "
            "!registered, !matched, active, busy 0, retain 7>\n"
            "    {\n"
            f'      "AppUsage" = ({{"API"="Metal","lastSubmittedTime"={submitted},'
            f'"accumulatedGPUTime"={ns}}})\n'
            '      "CommandQueueCount" = 1\n'
            '      "CommandQueueCountMax" = 2\n'
            f'      "IOUserClientCreator" = "pid {pid}, {name}"\n'
            '      "IOUserClientDefaultLocking" = Yes\n'
            "    }\n"
            "    \n")
    return "".join(blocks)


def gpu_power(interval: float, environ: dict[str, str] | os._Environ[str] = os.environ,
              proc: str = "/proc") -> tuple[float, float]:
    """The whole GPU's (active residency %, power mW) over `interval` seconds, from
    every Metal process's GPU time."""
    pids = metal_pids(proc)
    first = {pid: gpu_ns(pid, proc, work_only=True) for pid in pids}
    began = time.monotonic_ns()
    time.sleep(interval)
    spent = time.monotonic_ns() - began
    advanced = 0  # real work's GPU time, every process's (a spinning kernel's apart)
    for pid in pids:
        now = gpu_ns(pid, proc, work_only=True)
        if now is not None and first.get(pid) is not None:
            advanced += max(0, now - (first[pid] or 0))
    wide = {m.strip() for m in environ.get(MODES_VARIABLE, "").split(",")}
    for pid in pids:
        wide |= modes(pid, proc)
    working = max(IDLE_RESIDENCY, min(100.0, 100.0 * advanced / max(1, spent)))
    power = IDLE_MILLIWATTS + (WORK_MILLIWATTS - IDLE_MILLIWATTS) * working / 100.0
    if "spin" in wide:  # #3830: fully resident, the spin's power with any work's on top
        working, power = 100.0, min(WORK_MILLIWATTS + SPIN_MILLIWATTS,
                                    SPIN_MILLIWATTS + power - IDLE_MILLIWATTS)
    return working, 0.0 if "zero-watts" in wide else power


def powermetrics_text(residency: float, milliwatts: float, elapsed_ms: float) -> str:
    """One sample of `powermetrics --samplers gpu_power` as Apple silicon prints it."""
    stamp = time.strftime("%a %b %d %H:%M:%S %Y +0000", time.gmtime())
    return ("Machine model: Mac15,10 (simulated)\nOS version: 24G623\nBoot arguments:\n\n\n\n"
            f"*** Sampled system activity ({stamp}) ({elapsed_ms:.2f}ms elapsed) ***\n\n\n"
            "**** GPU usage ****\n\n"
            f"GPU HW active frequency: {1278 if residency > 50 else 338} MHz\n"
            f"GPU HW active residency: {residency:6.2f}% (338 MHz: {residency:.0f}%)\n"
            "GPU SW requested state: (P1 : 100% P2 :   0%)\n"
            f"GPU idle residency: {100.0 - residency:6.2f}%\n"
            f"GPU Power: {milliwatts:.0f} mW\n\n")
