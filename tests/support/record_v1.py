"""A writer of version-1 records, for tests only: the rank writes version 2 now, and the
reader must keep reading the records of ranks started before an upgrade.

The layout is version 1's (docs/record-format.md, "Version 1"): 4096 bytes, one seqlock
(`seq` at 200) over the hot words at 208, the expect window at 296 and 64 flight entries
of 32 bytes at 512. This is the writer the hook used, kept byte for byte.
"""

from __future__ import annotations

import mmap
import os
import struct

from watchdog.record import STATUS_OPEN
from watchdog.record.layout import IDENTITY, MAGIC, encode_text
from watchdog.states import Phase

SIZE = 4096
SEQ_OFFSET = 200
HOT_OFFSET = 208
EXPECT_OFFSET = 296
FLIGHT_OFFSET = 512
HOT = struct.Struct("<11Q")
EXPECT = struct.Struct("<dQ48s")
ENTRY = struct.Struct("<QQQHHI")
W_SEQ = SEQ_OFFSET // 8
W_PHASE = HOT_OFFSET // 8 + 4
W_OP = HOT_OFFSET // 8 + 5


class V1Writer:
    """begin/write_*/end as the version-1 hook did (seq odd while writing)."""

    def __init__(self, path: str, *, pid: int, start_time: float, uid: int, host: str,
                 job: str, rank: int, world_size: int, backend: str, dump_signal: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.pwrite(fd, bytes(SIZE), 0)
            self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.path = path
        self.words = memoryview(self._map).cast("Q")
        self._identity = dict(pid=pid, start_time=start_time, uid=uid, host=host, job=job,
                              backend=backend, dump_signal=dump_signal)
        self.set_identity(rank=rank, world_size=world_size)
        self.begin()
        self.words[W_PHASE] = int(Phase.RUNNING)
        self.end()

    def set_identity(self, *, rank: int, world_size: int) -> None:
        i = self._identity
        self.begin()
        IDENTITY.pack_into(self._map, 0, MAGIC, 1, 0, SIZE, i["pid"], i["start_time"], i["uid"],
                           rank, world_size, i["dump_signal"], STATUS_OPEN, 0,
                           encode_text(str(i["host"]), 64), encode_text(str(i["job"]), 64),
                           encode_text(str(i["backend"]), 16))
        self.end()

    def begin(self) -> None:
        self.words[W_SEQ] += 1

    def end(self) -> None:
        self.words[W_SEQ] += 1

    def write_hot(self, *values: int) -> None:
        HOT.pack_into(self._map, HOT_OFFSET, *values)

    def write_entry(self, number: int, issued_ns: int, nbytes: int, op: int, dtype: int) -> None:
        ENTRY.pack_into(self._map, FLIGHT_OFFSET + (number % 64) * ENTRY.size, number,
                        issued_ns, nbytes, op, dtype, 0)

    def write_expect(self, seconds: float, since_ns: int, reason: str) -> None:
        EXPECT.pack_into(self._map, EXPECT_OFFSET, seconds, since_ns, encode_text(reason, 48))

    def close(self, status: int, *, remove: bool = True) -> None:
        self.begin()
        struct.pack_into("<I", self._map, 48, status)
        self.end()
        self.words.release()
        self._map.close()
        if remove:
            os.unlink(self.path)
