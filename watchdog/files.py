"""Opening a file in a directory other users may write (the record directory, a
state directory an operator got wrong): regular files only, never through a link,
and never an open or a read that a planted FIFO can block. Used by the daemon's
files and the fence's nonce cache alike."""

from __future__ import annotations

import errno
import os
import stat


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A descriptor on `path`, only if it is a regular file: no link followed, and
    nothing planted there (a FIFO) can block the open or the reads and writes
    after it. Raises OSError otherwise."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
