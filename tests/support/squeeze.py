"""A rank squeezed for memory: a memory cgroup whose limit is below the dataset it
reads, so its file pages are evicted and read back from storage (major faults), as on
a node whose memory is short. cgroup v2 (`memory.max`) or v1 (`memory.limit_in_bytes`);
root only. `dataset` writes each rank's file of tests/support/rank_prog.py `work`."""

from __future__ import annotations

import os
from pathlib import Path

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


def where() -> tuple[Path, str] | None:
    """(the hierarchy to make a group in, its limit file), or None when none can be."""
    if os.geteuid() != 0:
        return None
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return V2, "memory.max"
    if (V1 / "memory.limit_in_bytes").exists():
        return V1, "memory.limit_in_bytes"
    return None


def dataset(folder: Path, sizes: list[int]) -> None:
    """Each rank's dataset file, `sizes[rank]` MiB, written out to storage."""
    block = os.urandom(1 << 20)
    for rank, mib in enumerate(sizes):
        with open(folder / f"data-{rank}.bin", "wb") as f:
            for _ in range(mib):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())


class Squeeze:
    """Moves `pid` into a memory cgroup of `limit` bytes after evicting its dataset
    `path` from the page cache (its pages then fault in, charged to the group); back
    out of it and the group removed on exit."""

    def __init__(self, pid: int, limit: int, path: Path, name: str) -> None:
        found = where()
        if found is None:
            raise RuntimeError("no memory cgroup to squeeze a rank in (root and cgroup "
                               "v1 or v2's memory controller needed)")
        self.root, self.limit_file = found
        self.pid, self.limit, self.path = pid, limit, path
        self.group = self.root / name

    def __enter__(self) -> Squeeze:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        self.group.mkdir(exist_ok=True)
        (self.group / self.limit_file).write_text(str(self.limit))
        (self.group / "cgroup.procs").write_text(str(self.pid))
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            (self.root / "cgroup.procs").write_text(str(self.pid))
        except (ProcessLookupError, OSError):
            pass  # gone already
        try:
            self.group.rmdir()
        except OSError:
            pass  # a thread still leaving: the kernel removes it once empty
