"""The macOS command-line tools the probe runs, as stand-ins: `sample`, `ioreg`, `pmset`.

Run as `python -m watchdog.macsim.tools NAME ARGS...`: the macOS probe's command for
the tool (`MacProbe.tool`), so every caller that runs the real tool (the probe, the
evidence) runs the stand-in the same way, as a process of its own.

- `sample PID SECONDS [-file PATH]`: the live rank's native stacks, read with gdb (hardened as the
  daemon's own, watchdog/gdbstack.py) as often as fits in SECONDS (at least once),
  printed in `sample`'s report layout: the header, "Call graph:", one tree per thread
  headed `Thread_<id>` with the kernel's thread id (as on a Mac, not psutil's
  position), each frame `name  (in library) + offset  [address]` under a count of
  samples, indented two columns a level, then "Total number in stack". Guessed: the
  tree's `!` and `:` glyphs are not drawn (the parser reads depth by width only), the
  counts are gdb reads (a few), not 1 ms samples (about a thousand). A rank another
  gdb still holds (a sample before, killed at the daemon's time box, its gdb left to
  finish) is waited for, within OWN_BOX of the stand-in's start.
- `ioreg -r -c AGXDeviceUserClient -l -w0`: one client per Metal process, its
  `accumulatedGPUTime` the CPU time of MLX's compute thread, which stands for the GPU
  (gpu.py, with its test modes: a rank not listed, a GPU spinning on nothing).
- `powermetrics --samplers gpu_power -n 1 -i MS`: the GPU's residency and power from
  every Metal process's GPU time over MS milliseconds (gpu.py; 0 mW in mode
  "zero-watts").
- `powermetrics --samplers thermal`: "Current pressure level:" Nominal, or Moderate or
  Heavy with Linux's cpufreq capping a core below its maximum.
- `pmset -g therm`: the notes a Mac prints when nothing was recorded; with Linux's
  cpufreq capping a core below its maximum, the `CPU_Speed_Limit` block instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

from watchdog import gdbstack, host, procstat
from watchdog.macsim import gpu

TOOLS = ("sample", "ioreg", "pmset", "powermetrics")
_LIB = re.compile(r" from (\S+)")
_ADDRESS = re.compile(r"^#\d+\s+(0x[0-9a-fA-F]+) in ")


# Seconds from the stand-in's start it waits for another tracer of the rank to let go
# (under the daemon's 3 s time box for `sample`, stacksampler.SAMPLE_TIMEOUT). A stand-in
# killed at that box leaves its gdb to finish alone (it detaches cleanly: never killed
# mid-attach, which would leave a stop in the rank); the next sample's gdb, attaching
# meanwhile, failed at once, and under load (an MPI rank's 84 libraries take gdb 2-4 s)
# every later sample of a wedge read nothing. It now waits for that gdb to be gone.
OWN_BOX = 2.8


def gdb_read(pid: int, wait_until: float = 0.0) -> dict[int, list[tuple[str, str, str]]]:
    """Each thread's frames, root first, as (name, library, address), by kernel id; {}
    when another tracer still holds the rank at `wait_until` (monotonic)."""
    gdb = shutil.which("gdb", path=host.TOOL_PATH)  # never the caller's PATH
    if gdb is None:
        return {}
    while _traced(pid):
        if time.monotonic() >= wait_until:
            return {}
        time.sleep(0.05)
    done = subprocess.run(gdbstack.command(gdb, pid), capture_output=True, text=True,
                          timeout=20, stdin=subprocess.DEVNULL, check=False)
    threads: dict[int, list[tuple[str, str, str]]] = {}
    current: list[tuple[str, str, str]] | None = None
    for line in done.stdout.splitlines():
        match = gdbstack._THREAD.match(line)
        if match:
            current = threads.setdefault(int(match.group("tid")), [])
            continue
        found = gdbstack._FRAME.match(line)
        if found and current is not None:
            lib = _LIB.search(found.group("rest"))
            address = _ADDRESS.match(line)
            current.append((gdbstack.frame_name(found.group("rest")),
                            os.path.basename(lib.group(1)) if lib else "???",
                            address.group(1) if address else "0x0"))
    return {tid: list(reversed(frames)) for tid, frames in threads.items()}


# A Mac's MLX GPU stream thread while its command buffer runs, root first: asleep.
GPU_STREAM = (("thread_start", "libsystem_pthread.dylib", "0x1869f2b80"),
              ("_pthread_start", "libsystem_pthread.dylib", "0x1869f7c0c"),
              ("mlx::core::scheduler::StreamThread::thread_fn()", "libmlx.dylib",
               "0x104c38a10"),
              ("mlx::core::gpu::eval(mlx::core::array&)", "libmlx.dylib", "0x104d10f44"),
              ("-[_MTLCommandBuffer waitUntilCompleted]", "Metal", "0x1911b7a08"),
              ("std::__1::condition_variable::wait(std::__1::unique_lock<std::__1::mutex>&)",
               "libc++.1.dylib", "0x186962f3c"),
              ("_pthread_cond_wait", "libsystem_pthread.dylib", "0x1869f7fc4"),
              ("__psynch_cvwait", "libsystem_kernel.dylib", "0x1869ba3cc"))


def _traced(pid: int) -> bool:
    """Whether a tracer (a gdb) holds the process now (the stand-in reads Linux's /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return line.split()[1] != "0"
    except (OSError, IndexError):
        pass
    return False


def _start_ticks(pid: int) -> int | None:
    """The process's start, in clock ticks since boot (the stand-in reads Linux's /proc:
    procstat refuses to on the simulated Mac)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return procstat.start_ticks(f.read())
    except (OSError, ValueError, IndexError):
        return None


def sample_report(pid: int, reads: list[dict[int, list[tuple[str, str, str]]]],
                  name: str, seconds: int) -> str:
    order = sorted({tid for read in reads for tid in read}, key=lambda t: (t != pid, t))
    lines = [f"Sampling process {pid} for {seconds} second with 1 millisecond of run time "
             "between samples", "Sampling completed, processing symbols...",
             f"Analysis of sampling {name} (pid {pid}) every 1 millisecond",
             f"Process:         {name} [{pid}]", "Platform:        macOS (simulated)", "",
             "Call graph:"]
    for tid in order:
        tree: dict[tuple[str, str, str], list[Any]] = {}  # frame -> [count, children]
        count = 0
        for read in reads:
            frames = read.get(tid)
            if not frames:
                continue
            count += 1
            level = tree
            for frame in frames:
                node = level.setdefault(frame, [0, {}])
                node[0] += 1
                level = node[1]
        title = "   DispatchQueue_1: com.apple.main-thread  (serial)" if tid == pid else ""
        lines.append(f"    {count} Thread_{tid}{title}")
        _draw(tree, 0, lines)
    lines += ["", "Total number in stack (recursive counted multiple, when >=5):", "",
              "Sort by top of stack, same collapsed (when >= 5):", ""]
    return "\n".join(lines) + "\n"


def _draw(tree: dict[Any, Any], depth: int, lines: list[str]) -> None:
    for (frame, lib, address), (count, children) in sorted(tree.items(),
                                                            key=lambda kv: -kv[1][0]):
        lines.append(f"    +{'  ' * depth} {count} {frame}  (in {lib}) + 0  [{address}]")
        _draw(children, depth + 1, lines)


def sample(args: list[str]) -> int:
    if not args or not args[0].isdigit():
        print("Usage: sample <pid | partial-executable-name> [<duration> "
              "[<samplingInterval>]]", file=sys.stderr)
        return 1
    pid = int(args[0])
    seconds = int(args[1]) if len(args) > 1 and args[1].isdigit() else 10
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        print(f"sample cannot find any existing process you have access to which has a "
              f"name like '{pid}'", file=sys.stderr)
        return 1
    began = time.monotonic()
    deadline = began + seconds
    started = _start_ticks(os.getpid())  # the box counts from this process's start
    box_end = began + OWN_BOX - (
        time.clock_gettime(time.CLOCK_BOOTTIME) - started / os.sysconf("SC_CLK_TCK")
        if started is not None else 0.0)
    reads = [gdb_read(pid, box_end)]
    took = time.monotonic() - began
    while time.monotonic() + took < deadline:  # another read would not overrun
        reads.append(gdb_read(pid, deadline))
    for tid in gpu.hidden(pid):  # MLX's compute thread: a Mac's GPU stream thread, parked
        for read in reads:
            if tid in read:
                read[tid] = list(GPU_STREAM)
    report = sample_report(pid, [r for r in reads if r], name, seconds)
    if "-file" in args and args.index("-file") + 1 < len(args):
        with open(args[args.index("-file") + 1], "w") as out:
            out.write(report)
        print(f"Sample analysis of process {pid} written to file "
              f"{args[args.index('-file') + 1]}")
        return 0
    sys.stdout.write(report)
    return 0


def pmset(args: list[str]) -> int:
    if args[:2] != ["-g", "therm"]:
        print("pmset: the stand-in knows only -g therm", file=sys.stderr)
        return 1
    limit = cpufreq_limit()
    if limit is None or limit >= 100:
        print("Note: No thermal warning level has been recorded\n"
              "Note: No performance warning level has been recorded\n"
              "Note: No CPU power status has been recorded")
    else:
        print("Note: No thermal warning level has been recorded\n"
              "Note: No performance warning level has been recorded\n"
              "2026-12-04 12:00:00 +0000 CPU Power notify\n"
              f"\tCPU_Scheduler_Limit \t= 100\n\tCPU_Available_CPUs \t= {os.cpu_count()}\n"
              f"\tCPU_Speed_Limit \t= {limit}")
    return 0


def cpufreq_limit(root: str = "/sys/devices/system/cpu/cpu0/cpufreq") -> int | None:
    try:
        with open(f"{root}/scaling_max_freq") as f:
            allowed = int(f.read())
        with open(f"{root}/cpuinfo_max_freq") as f:
            most = int(f.read())
    except (OSError, ValueError):
        return None
    return round(100 * allowed / most) if most else None


def ioreg(args: list[str]) -> int:
    sys.stdout.write(gpu.ioreg_text())
    return 0


def powermetrics(args: list[str]) -> int:
    if os.geteuid() != 0:
        print("powermetrics must be invoked as the superuser", file=sys.stderr)
        return 1
    if "thermal" in args:  # Apple silicon's thermal pressure, from cpufreq's cap here
        limit = cpufreq_limit()
        level = ("Nominal" if limit is None or limit >= 100 else
                 "Moderate" if limit >= 70 else "Heavy")
        sys.stdout.write(f"**** Thermal pressure ****\n\nCurrent pressure level: {level}\n\n")
        return 0
    if "gpu_power" not in args:
        print("powermetrics: the stand-in knows only the gpu_power and thermal samplers",
              file=sys.stderr)
        return 1
    interval = 5000
    if "-i" in args and args.index("-i") + 1 < len(args):
        try:
            interval = max(10, int(args[args.index("-i") + 1]))
        except ValueError:
            pass
    began = time.monotonic()
    residency, milliwatts = gpu.gpu_power(interval / 1000)
    sys.stdout.write(gpu.powermetrics_text(residency, milliwatts,
                                           1000 * (time.monotonic() - began)))
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in TOOLS:
        print(f"usage: python -m watchdog.macsim.tools {{{','.join(TOOLS)}}} ...",
              file=sys.stderr)
        return 2
    return {"sample": sample, "ioreg": ioreg, "pmset": pmset,
            "powermetrics": powermetrics}[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
