"""Linux: wired memory is /proc/meminfo's Unevictable; stacks from py-spy or gdb."""

from __future__ import annotations

from . import Probe, ProbeError, _which


def unevictable_bytes(meminfo: str) -> int:
    """Memory the kernel cannot reclaim: mlocked pages, SHM_LOCK'd segments, ramfs."""
    for line in meminfo.splitlines():
        if line.startswith("Unevictable:"):
            parts = line.split()
            return int(parts[1]) * 1024 if parts[2:3] == ["kB"] else int(parts[1])
    raise ProbeError("no Unevictable line in /proc/meminfo")


class LinuxProbe(Probe):
    name = "linux"

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc

    def wired_bytes(self) -> int | None:
        try:
            with open(f"{self.proc}/meminfo") as f:
                return unevictable_bytes(f.read())
        except (OSError, ValueError) as err:
            raise ProbeError(f"reading {self.proc}/meminfo: {err}") from err

    def stack_command(self, pid: int) -> list[str] | None:
        pyspy = _which("py-spy")
        if pyspy:
            return [pyspy, "dump", "--native", "--pid", str(pid)]
        gdb = _which("gdb")
        if gdb:
            return [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"]
        return None
