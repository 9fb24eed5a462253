"""Pure: whether a rank's GPU works, from its GPU time and the GPU's power (macOS).

A rank whose GPU time advances computes on the GPU (judge/frames.py), whatever its CPU
threads wait in. mlx #3830's hang breaks that: a tiny kernel spins on the GPU, which is
100% resident and draws ~3 W, and no work is done; read as computing, such a rank is
never a quiet hang and waits for `blocked_deadline`. The GPU's own figures tell it
apart: fully resident at a power far below what a resident GPU doing work draws.

    resident (>= SPIN_RESIDENCY %) at under SPIN_MILLIWATTS: spins on nothing
    anything else, or no reading (none, or 0 W): GPU time advancing is work (never
    end on a guess)

A GPU at low residency and low power with its time advancing does a little work (a
small model's decode step), and is left as computing.

The readings are the whole GPU's, and another user's work is on it too: they never
turn another's load into evidence against a rank. The spin is this rank's only when
its own GPU time covers at least SPIN_RESIDENCY of the time between its two samples
(`share`): a GPU kept resident by another's kernel while this rank does a little
work reads as work. And a rank's GPU time standing still while the whole GPU is busy
(BUSY_RESIDENCY) is no evidence of a quiet hang (unknown): its kernels may wait their
turn behind another's work. No reading (not root): the rank's own GPU time alone, as
before. The thresholds come from
recorded output (docs/macos.md, "The GPU that spins on nothing"): idle GPUs at 2.6-5.1%
and 23-29 mW, GPUs under inference at 99-100% and 8.5-9.5 W, #3830's report at 100% and
~3 W. They were never checked against a Mac here (docs/macos.md says what to check in
a Mac's first hour). The stack sampler reads the GPU's power when a rank's GPU time
advanced since its sample before (probes/stacksampler.py), and the judge reads each
sample through `read` (daemon/sightings.py).
"""

from __future__ import annotations

from watchdog.daemon.judge.frames import GPU_FLAT
from watchdog.daemon.sample import GpuPower

SPIN_RESIDENCY = 90.0  # percent of the sample the GPU was active: "100% resident"
SPIN_MILLIWATTS = 5000.0  # under this while resident: a kernel that does no work
# (the setting `gpu_spin_watts`; 0 turns the rule off)
# The whole GPU at least this resident: busy with work, this rank's or another's.
BUSY_RESIDENCY = 50.0


def spins_on_nothing(power: GpuPower | None, milliwatts: float = SPIN_MILLIWATTS,
                     share: float | None = 1.0) -> bool:
    """#3830's signature: the GPU fully resident at a power no work draws, and the
    rank's own GPU time (`share` of the time between its samples) accounting for it.
    A power of 0 W is no reading (macOS 27 reports the CPU's as 0 W; an M5 Max's
    readings alternate between 0 W and inflated values): never a GPU spinning on
    nothing."""
    return (power is not None and power.active_percent >= SPIN_RESIDENCY
            and 0.0 < power.milliwatts < milliwatts
            and share is not None and share * 100 >= SPIN_RESIDENCY)


def gpu_works(gpu_moved: bool | None, power: GpuPower | None,
              milliwatts: float = SPIN_MILLIWATTS, share: float | None = 1.0
              ) -> bool | None:
    """The rank's `gpu_moved` as the judge should read it: its GPU time advancing counts
    as work unless it spins on nothing (then False: GPU time flat in effect, so a
    quiet hang is still decided); flat on a GPU busy with work (another's) is unknown;
    None stays unknown."""
    if gpu_moved and spins_on_nothing(power, milliwatts, share):
        return False
    if gpu_moved is False and power is not None and power.active_percent >= BUSY_RESIDENCY:
        return None
    return gpu_moved


def describe(power: GpuPower) -> str:
    """The reading, as an incident says it: "GPU 100% resident at 3000 mW"."""
    return f"GPU {power.active_percent:.0f}% resident at {power.milliwatts:.0f} mW"


def read(gpu_moved: bool | None, power: GpuPower | None,
         milliwatts: float = SPIN_MILLIWATTS, share: float | None = 1.0
         ) -> tuple[bool | None, str]:
    """`gpu_works`, with the words frames.asleep and frames.classify say for a GPU whose
    time does not count as work."""
    works = gpu_works(gpu_moved, power, milliwatts, share)
    if gpu_moved and works is False and power is not None:
        return False, f"GPU time advancing on nothing ({describe(power)})"
    return works, GPU_FLAT


def behind(others: tuple[tuple[int, str], ...], power: GpuPower | None,
           milliwatts: float = SPIN_MILLIWATTS) -> str:
    """A rank whose own GPU time stands still while other processes' advances: what its
    work waits behind, in words ("pid 812 (python3.12)'s GPU work, GPU 99% resident at
    9100 mW"), or "" when that does not explain its wait. The GPU busy at working power
    (at least `milliwatts`) with another's time advancing does: another job generating
    or loading its weights on the same Mac (incident 2 of issue 55). A GPU read below
    working power does not (their work is too little to hold ours up); a power not read
    (not root, no powermetrics, 0 W) leaves it explained: never end a rank on a guess."""
    if not others:
        return ""
    if power is not None and power.milliwatts > 0 and power.milliwatts < milliwatts:
        return ""
    pid, name = others[0]
    who = f"pid {pid}" + (f" ({name})" if name else "")
    more = f" and {len(others) - 1} more" if len(others) > 1 else ""
    how = (describe(power) if power is not None and power.milliwatts > 0
           else "GPU power not read")
    return f"{who}{more}'s GPU work, {how}"
