"""The record: one file per rank process, its bytes owned by this package alone.

`layout.py` fixes every offset and struct (and documents them byte by byte,
as docs/record-format.md does), `reader.py` reads either version, `writer.py`
writes version 3. What users of a record need is importable from
`watchdog.record`: the reader and the writer, what they return and raise, the
statuses, the file names and the vocabulary of ops and dtypes. The offsets and
structs are the business of the hot path and of the tests of the bytes: they
import them from `watchdog.record.layout`.
"""

from watchdog.record.layout import (
    DEFAULT_DIR,
    DTYPE_CODE,
    DTYPES,
    MAX_WORLD_SIZE,
    OP_CODE,
    OPS,
    RECORD_SIZE,
    RECORD_VERSION,
    STACKS_SUFFIX,
    STATUS_ABANDONED,
    STATUS_CLOSED,
    STATUS_ERROR,
    STATUS_OPEN,
    SUFFIX,
    Collective,
    Pace,
    Record,
    RecordBusy,
    RecordError,
    stacks_path,
    staging_path,
)
from watchdog.record.reader import decode, read_fd, read_path
from watchdog.record.writer import RecordWriter

__all__ = [
    "DEFAULT_DIR",
    "DTYPES",
    "DTYPE_CODE",
    "MAX_WORLD_SIZE",
    "OPS",
    "OP_CODE",
    "RECORD_SIZE",
    "RECORD_VERSION",
    "STACKS_SUFFIX",
    "STATUS_ABANDONED",
    "STATUS_CLOSED",
    "STATUS_ERROR",
    "STATUS_OPEN",
    "SUFFIX",
    "Collective",
    "Pace",
    "Record",
    "RecordBusy",
    "RecordError",
    "RecordWriter",
    "decode",
    "read_fd",
    "read_path",
    "stacks_path",
    "staging_path",
]
