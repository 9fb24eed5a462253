"""What the node tells of a slow rank (judge/stragglers.py's why): major faults and
thermal zones on Linux, `pmset -g therm` and page-ins on macOS, parsed from what the
OS gives (recorded output, a fake sysfs tree, this process)."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import pytest

from watchdog.daemon.judge.stragglers import Pace, why
from watchdog.daemon.probes import Probe
from watchdog.daemon.probes.linux import (
    LinuxProbe,
    major_faults,
    read_major_faults,
    read_thermal,
    thermal_state,
)
from watchdog.daemon.probes.macos import (
    PAGEINS_OFFSET,
    RUSAGE_V2_SIZE,
    MacProbe,
    pmset_therm,
    rusage_pageins,
)

# `/proc/<pid>/stat` of a process whose command holds a parenthesis and spaces.
STAT = ("4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 1500 0 37 0 120 30 0 0 20 0 9 0 "
        "123456 1000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0")


def test_major_faults_is_field_twelve_past_the_command() -> None:
    assert major_faults(STAT) == 37


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc only")
def test_this_process_major_faults_read_and_sampled() -> None:
    with open("/proc/self/stat") as f:
        expected = int(f.read().rsplit(")", 1)[1].split()[9])
    got = read_major_faults(os.getpid())
    assert got is not None and got >= expected
    sample = LinuxProbe().sample(os.getpid())
    assert sample is not None and sample.major_faults is not None
    assert sample.major_faults >= expected
    assert read_major_faults(2 ** 22 + 7) is None  # no such process


def zone(root: Path, n: int, kind: str, temp: int, trips: list[tuple[str, int]]) -> None:
    d = root / f"thermal_zone{n}"
    d.mkdir(parents=True)
    (d / "type").write_text(kind + "\n")
    (d / "temp").write_text(f"{temp}\n")
    for i, (typ, t) in enumerate(trips):
        (d / f"trip_point_{i}_type").write_text(typ + "\n")
        (d / f"trip_point_{i}_temp").write_text(f"{t}\n")


def test_thermal_zones_past_a_passive_trip_are_throttling(tmp_path: Path) -> None:
    zone(tmp_path, 0, "acpitz", 40000, [("critical", 105000)])
    zone(tmp_path, 1, "x86_pkg_temp", 96000, [("passive", 95000), ("critical", 105000)])
    assert read_thermal(str(tmp_path)) == ("thermal zone x86_pkg_temp at 96\u00b0C "
                                           "(throttles at 95\u00b0C)")


def test_thermal_zones_below_their_trips_or_absent_say_nothing(tmp_path: Path) -> None:
    assert read_thermal(str(tmp_path / "none")) is None  # a VM: no thermal class
    zone(tmp_path, 0, "x86_pkg_temp", 60000, [("passive", 95000)])
    assert read_thermal(str(tmp_path)) is None
    assert thermal_state([("cpu", 99000, [("critical", 100000)])]) is None  # no passive
    assert Probe().thermal() is None  # a platform that cannot tell


# `pmset -g therm` on macOS 14, at rest and throttled.
PMSET_COOL = """Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
Note: No CPU power status has been recorded
"""
PMSET_HOT = """2026-07-01 12:00:00 +0000 Thermal Warning Level set to 1.
Thermal warning level 1 (moderate) has been recorded
Note: No performance warning level has been recorded
2026-07-01 12:00:00 +0000 CPU Power notify
\tCPU_Scheduler_Limit \t= 100
\tCPU_Available_CPUs \t= 12
\tCPU_Speed_Limit \t= 71
"""


def test_pmset_therm_throttled_and_at_rest() -> None:
    assert pmset_therm(PMSET_COOL) is None
    assert pmset_therm(PMSET_HOT) == ("Thermal warning level 1 (moderate) has been recorded; "
                                      "CPU speed limit 71% (thermal)")
    assert pmset_therm("\tCPU_Speed_Limit \t= 100\n") is None
    assert pmset_therm("\tCPU_Speed_Limit \t= lots\n") is None


def test_rusage_pageins_is_the_fifth_counter() -> None:
    buffer = bytearray(RUSAGE_V2_SIZE)
    struct.pack_into("<5Q", buffer, 16, 11, 22, 33, 44, 555)
    assert PAGEINS_OFFSET == 48 and rusage_pageins(bytes(buffer)) == 555
    with pytest.raises(ValueError):
        rusage_pageins(b"\0" * 40)


def test_a_throttled_macs_pmset_is_a_stragglers_cause(tmp_path: Path) -> None:
    """The macOS probe runs `pmset -g therm` (here a command printing its recorded
    output, through the probe's tool seam) and the straggler's why says thermal; a node
    throttled is no case of more work per step."""
    recorded = tmp_path / "pmset.txt"
    recorded.write_text(PMSET_HOT)
    printer = [sys.executable, "-c",
               f"import sys; sys.stdout.write(open({str(recorded)!r}).read())"]
    probe = MacProbe(tool=lambda path: printer if path == "/usr/bin/pmset" else None)
    thermal = probe.thermal()
    assert thermal is not None and thermal.endswith("CPU speed limit 71% (thermal)")
    flat_out = Pace(30.0, 0.0, 5.0, 0.0, 0.0, busy=0.97)
    assert why(flat_out, thermal) == thermal
    assert why(flat_out).startswith("more work per step")
    recorded.write_text(PMSET_COOL)
    assert probe.thermal() is None
    assert MacProbe(tool=lambda name: None).thermal() is None  # no pmset: no cause


def test_apple_silicons_thermal_pressure_is_a_stragglers_cause(tmp_path: Path) -> None:
    """On Apple silicon `pmset -g therm` prints only its notes, even throttled: the
    thermal pressure `powermetrics --samplers thermal` gives is read beside it."""
    from watchdog.daemon.probes.macos import thermal_pressure

    heavy = "**** Thermal pressure ****\n\nCurrent pressure level: Heavy\n\n"
    assert thermal_pressure(heavy) == "thermal pressure Heavy"
    assert thermal_pressure(heavy.replace("Heavy", "Nominal")) is None
    assert thermal_pressure("garbage") is None
    recorded = tmp_path / "pressure.txt"
    recorded.write_text(heavy)
    replay = f"import sys; sys.stdout.write(open({str(recorded)!r}).read())"
    tools = {"/usr/bin/pmset": [sys.executable, "-c", f"print({PMSET_COOL!r}, end='')"],
             "/usr/bin/powermetrics": [sys.executable, "-c", replay]}
    probe = MacProbe(tool=tools.get)
    assert probe.thermal() == "thermal pressure Heavy"
    recorded.write_text(heavy.replace("Heavy", "Nominal"))
    assert probe.thermal() is None
