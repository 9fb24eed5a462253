"""Parse `powermetrics --samplers gpu_power` (macOS, root only): the GPU's active
residency and its power, the two figures that tell a GPU at work from one that spins
on nothing (mlx #3830: 100% resident at ~3 W, a tiny spin kernel and no work).

Its text output, one block per sample (`-n N` prints N), as recorded on Apple silicon
(tests/support/data/powermetrics_gpu_power.txt):

    *** Sampled system activity (...) (502.43ms elapsed) ***

    **** GPU usage ****

    GPU HW active frequency: 338 MHz
    GPU HW active residency:   5.11% (338 MHz: 5.1% 618 MHz:   0% 796 MHz:   0%)
    GPU SW requested state: (P1 : 100% P2 :   0%)
    GPU idle residency:  94.89%
    GPU Power: 29 mW

The residency's distribution over the clock steps may wrap onto the next line; only the
first percentage of the line is the residency. Older releases said "GPU active
residency". The figures are the whole GPU's, not one process's.

Pure: text in, the last complete sample's reading out (None when no sample has both a
residency and a power); never raises. Never run on a Mac here (docs/macos.md).
"""

from __future__ import annotations

import re

from watchdog.daemon.sample import GpuPower

__all__ = ["GpuPower", "parse"]

MAX_TEXT = 1 << 20  # a sample is ~2 kB; a runaway output is cut, not parsed whole
_SAMPLE = "*** Sampled system activity"
_RESIDENCY = re.compile(r"^\s*GPU (?:HW )?active residency:\s*([0-9]*\.?[0-9]+)\s*%", re.M)
_POWER = re.compile(r"^\s*GPU Power:\s*([0-9]*\.?[0-9]+)\s*mW", re.M)
_FREQUENCY = re.compile(r"^\s*GPU (?:HW )?active frequency:\s*([0-9]*\.?[0-9]+)\s*MHz", re.M)


def parse(text: str) -> GpuPower | None:
    """The last sample's reading that has both a residency and a power line."""
    found = None
    for block in text[:MAX_TEXT].split(_SAMPLE):
        residency, power = _RESIDENCY.search(block), _POWER.search(block)
        if residency is None or power is None:
            continue
        frequency = _FREQUENCY.search(block)
        active = float(residency.group(1))
        if not 0.0 <= active <= 100.0:
            continue
        found = GpuPower(active, float(power.group(1)),
                         float(frequency.group(1)) if frequency else None)
    return found
