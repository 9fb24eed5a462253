"""mlx #3830's GPU that spins on nothing (macOS): `powermetrics --samplers gpu_power`
parsed from recorded output (tests/support/data/powermetrics_gpu_power.txt: an idle
GPU, then one under inference with its clock distribution wrapped onto a second line),
the pure rule that reads GPU time advancing on a fully resident GPU at low power as no
work, and the macOS probe running the tool (a stand-in printing the recording)."""

from __future__ import annotations

import sys

import pytest

from tests.support import DATA
from tests.support.fakes import FakeProbe, process_sample
from watchdog.daemon.config import Settings
from watchdog.daemon.judge.frames import asleep
from watchdog.daemon.judge.gpuwork import (
    SPIN_MILLIWATTS,
    describe,
    gpu_works,
    read,
    spins_on_nothing,
)
from watchdog.daemon.probes import Probe
from watchdog.daemon.probes.macos import MacProbe
from watchdog.daemon.probes.powermetrics import GpuPower, parse
from watchdog.daemon.probes.stacksampler import SAMPLE_EVERY, Identity, StackSampler
from watchdog.states import FrameKind

RECORDED = (DATA / "powermetrics_gpu_power.txt").read_text()
IDLE, AT_WORK = RECORDED.split("*** Sampled system activity")[1:]
# mlx #3830's report: the GPU 100% resident at ~3 W, a tiny spin kernel, no work.
SPINNING = """**** GPU usage ****

GPU HW active frequency: 1398 MHz
GPU HW active residency: 100.00% (338 MHz:   0% 1398 MHz: 100%)
GPU idle residency:   0.00%
GPU Power: 3012 mW
"""


def test_the_last_complete_sample_is_the_reading():
    assert parse(RECORDED) == GpuPower(99.35, 8503.0, 1277.0)  # the wrapped distribution
    assert parse(IDLE) == GpuPower(5.11, 29.0, 338.0)
    assert parse(SPINNING) == GpuPower(100.0, 3012.0, 1398.0)
    # An older release's label, no frequency line.
    assert parse("GPU active residency:  37.50%\nGPU Power: 1450 mW\n") == \
        GpuPower(37.5, 1450.0, None)


@pytest.mark.parametrize("text", [
    "", "no gpu data here", "GPU Power: 45 mW\nGPU idle residency: 87.50%",  # no residency
    "GPU HW active residency:  12.50% (396 MHz: 12%)",  # no power
    "GPU HW active residency: 250.00%\nGPU Power: 45 mW",  # not a share of anything
    "\x00\xff" * 1000, "GPU HW active residency: %\nGPU Power: mW",
])
def test_anything_else_reads_as_no_reading(text):
    assert parse(text) is None


def test_only_a_fully_resident_gpu_at_low_power_spins_on_nothing():
    assert spins_on_nothing(parse(SPINNING))
    assert not spins_on_nothing(parse(AT_WORK))  # inference: 99% at 8.5 W
    assert not spins_on_nothing(parse(IDLE))  # a little work: 5% at 29 mW
    assert not spins_on_nothing(None)
    assert describe(GpuPower(100.0, 3012.0)) == "GPU 100% resident at 3012 mW"


@pytest.mark.parametrize("moved, reading, works", [
    (True, SPINNING, False),  # #3830: GPU time advances on nothing
    (True, AT_WORK, True),
    (True, IDLE, True),  # a small model's decode step: work, never a guess
    (True, None, True),  # no reading (not root, no powermetrics): today's rule
    (False, IDLE, False),  # flat on an idle GPU: flat
    (False, SPINNING, None),  # flat while the GPU is busy (another's): no evidence
    (None, SPINNING, None),  # GPU time unknown stays unknown
])
def test_gpu_time_advancing_is_work_unless_the_gpu_spins_on_nothing(moved, reading, works):
    assert gpu_works(moved, parse(reading) if reading else None) is works


class GpuProbe(FakeProbe):
    """A Mac's rank asleep in eval whose GPU time advances `step` ns a sample (1 ms),
    and the GPU's `powermetrics` reading (one of the recordings above)."""

    def __init__(self, reading: str, step: int = 1_000_000) -> None:
        super().__init__({40: process_sample(40, uid=501, status="sleeping")})
        self.reading, self.gpu_ns, self.asked_power, self.step = reading, 0, 0, step

    def native_stacks(self, pid, timeout):
        return {1: ("__psynch_cvwait", "std::condition_variable::wait",
                    "mlx::core::eval_impl")}

    def gpu_time(self, pid, timeout):
        self.gpu_ns += self.step
        return self.gpu_ns

    def gpu_power(self, timeout):
        self.asked_power += 1
        return parse(self.reading)


@pytest.mark.parametrize("reading, own, kind", [
    (None, 1.0, FrameKind.WAITING),
    ("spinning", 1.0, FrameKind.WAITING),  # its own GPU time covers the window: its spin
    ("spinning", 0.01, FrameKind.COMPUTING),  # another's spin keeps the GPU resident
    ("at_work", 1.0, FrameKind.COMPUTING)])
def test_the_sampler_reads_the_gpu_when_its_time_advances_and_the_judge_reads_it(
        reading, own, kind):
    """Wired: a rank's GPU time advancing since its sample before, the sampler reads the
    GPU's power; the judge reads that sample's rank as waiting when the GPU spins on
    nothing by the rank's own GPU time (so a quiet hang is still decided), as computing
    when it works, or when the rank's own time covers 1% of the window: the whole GPU's
    spin is then another's, never evidence against this rank (issue 57)."""
    probe = GpuProbe({"spinning": SPINNING, "at_work": AT_WORK}.get(reading or "", ""),
                     step=int(own * SAMPLE_EVERY * 1e9))
    clock = [1000.0]
    s = StackSampler(probe, lambda fn: fn(), lambda: clock[0])
    who = Identity(40, 1.7e9, 501)
    s.ask(who, (), 1000.0)
    if reading is None:  # one sample: nothing to compare its GPU time with
        assert probe.asked_power == 0
        found = s.found[(40, 1.7e9)]
        assert found.gpu_moved is None
        return
    clock[0] += SAMPLE_EVERY
    s.ask(who, (), 1000.0 + SAMPLE_EVERY)
    found = s.found[(40, 1.7e9)]
    assert found.gpu_moved is True and probe.asked_power == 1
    assert found.gpu_share == pytest.approx(own)
    works, flat = read(found.gpu_moved, found.gpu_power, share=found.gpu_share)
    seen = asleep(found.stacks, "ring", works, main=1, flat=flat)
    assert seen.kind == kind, seen
    if reading == "spinning" and own == 1.0:
        assert seen.what.endswith("GPU time advancing on nothing (GPU 100% resident at "
                                  f"{parse(SPINNING).milliwatts:.0f} mW)"), seen


def stand_in(script: str):
    """A `powermetrics` that runs `script` with its arguments."""
    return lambda path: ([sys.executable, "-c", script] if path == "/usr/bin/powermetrics"
                         else None)


def test_the_macos_probe_reads_the_gpu_through_powermetrics(tmp_path):
    recording = tmp_path / "out.txt"
    recording.write_text(RECORDED)
    wants = ["--samplers", "gpu_power", "-n", "1", "-i", "500"]
    script = (f"import sys\nif sys.argv[1:] != {wants!r}: sys.exit(2)\n"
              f"sys.stdout.write(open({str(recording)!r}).read())")
    assert MacProbe(tool=stand_in(script)).gpu_power(10.0) == GpuPower(99.35, 8503.0, 1277.0)


@pytest.mark.parametrize("script", [
    "import sys; sys.stderr.write('powermetrics must be invoked as the superuser\\n'); "
    "sys.exit(1)",  # not root
    "import time; time.sleep(30)",  # hangs past its time box
    "print('nothing the parser knows')",
])
def test_no_reading_when_powermetrics_cannot_give_one(script):
    assert MacProbe(tool=stand_in(script)).gpu_power(0.5) is None


def test_no_reading_without_powermetrics_or_off_a_mac():
    assert MacProbe(tool=lambda name: None).gpu_power(1.0) is None
    assert Probe().gpu_power(1.0) is None


def test_gpu_spin_watts_0_turns_the_rule_off_and_a_lower_one_narrows_it():
    spinning = parse(SPINNING)
    assert spinning is not None
    assert read(True, spinning, 0.0)[0] is True  # the setting at 0: GPU time is work
    assert read(True, spinning, spinning.milliwatts)[0] is True  # not under it
    assert read(True, spinning, spinning.milliwatts + 1)[0] is False
    assert Settings().rules().gpu_spin_watts == SPIN_MILLIWATTS / 1000


def test_a_gpu_time_read_ahead_tells_flat_from_advancing_at_the_first_sample():
    """A rank past half its wedge deadline has its GPU time read once ahead (ioreg only):
    its first stack sample already has two readings; without, it says why not."""
    probe = GpuProbe(AT_WORK)
    probe.gpu_clock = True  # type: ignore[misc]
    s = StackSampler(probe, lambda fn: fn(), lambda: 1000.0)
    who = Identity(40, 1.7e9, 501)
    s.prime(who, 995.0)
    s.ask(who, (), 1000.0)
    found = s.found[(40, 1.7e9)]
    assert found.gpu_moved is True and found.gpu_why == ""
    cold = StackSampler(GpuProbe(AT_WORK), lambda fn: fn(), lambda: 1000.0)
    cold.ask(who, (), 1000.0)
    first = cold.found[(40, 1.7e9)]
    assert first.gpu_moved is None and "one reading" in first.gpu_why
