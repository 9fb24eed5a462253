"""Evidence on request: faulthandler writes every Python thread's stack to a file
next to the record when the daemon sends the dump signal.

The directory is shared by every user's ranks, so the file is opened so nothing
planted at its path can block or redirect the rank: never following a link,
never waiting on a FIFO (`O_NONBLOCK`: a FIFO with no reader fails at once, one
with a reader is seen by `fstat`), and only ever a regular file of our own;
anything else is removed and the file created anew, exclusively, or the dumps
are off (the rank is still instrumented).
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import os
import signal
import stat
from typing import Any

from watchdog.rank.env import warn as _warn

_dump_file: Any = None
_dump_path = ""
_dump_signum = 0


class NotOurs(OSError):
    """Something other than a regular file of ours keeps appearing at the dump path."""


def _open_dump(path: str) -> int:
    """The dump file's descriptor, for appending: a regular file of ours, opened
    without blocking or following anything; raises OSError when it cannot be."""
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
             | os.O_CLOEXEC)
    for _ in range(2):
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as err:  # ENXIO: a FIFO with no reader; ELOOP: a link
            if err.errno not in (errno.ENXIO, errno.ELOOP, errno.EEXIST):
                raise
        else:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                os.set_blocking(fd, True)
                return fd
            os.close(fd)
        # Not a regular file of ours (raced in after any check): away with it, then
        # ours anew, exclusively (a second plant fails the create, not the rank).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        flags |= os.O_EXCL
    raise NotOurs(f"{path} keeps being replaced by something not a regular file of ours")


def register_dump(signum: int, path: str) -> int:
    """faulthandler on `signum`, writing every thread's stack next to the record."""
    global _dump_file, _dump_path, _dump_signum
    if not signum:
        return 0
    try:
        taken = signal.getsignal(signum) not in (signal.SIG_DFL, None)
    except ValueError:
        _warn(f"no signal {signum}; stack dumps are off")
        return 0
    if taken:
        _warn(f"signal {signum} already has a handler; stack dumps are off "
              "(set MLX_WATCHDOG_DUMP_SIGNAL to a free signal, or 0)")
        return 0
    try:
        file = os.fdopen(_open_dump(path), "a")
    except NotOurs as err:  # a plant: the dumps are off, the rank still watched
        _warn(f"{err}; stack dumps are off")
        return 0
    try:
        faulthandler.register(signum, file=file, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError) as err:
        file.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        _warn(f"cannot dump stacks on signal {signum} ({err}); stack dumps are off")
        return 0
    _dump_file, _dump_path, _dump_signum = file, path, signum
    return signum


def close_dump() -> None:
    """Unregister the dump handler; remove its file unless it holds a dump."""
    global _dump_file, _dump_signum
    file, _dump_file = _dump_file, None
    signum, _dump_signum = _dump_signum, 0
    if signum:
        try:
            faulthandler.unregister(signum)
        except Exception as err:  # noqa: BLE001 - never into the user's program
            _warn(f"could not unregister the stack dump on signal {signum} ({err!r})")
    if file is not None:
        try:
            empty = os.fstat(file.fileno()).st_size == 0
            file.close()
            if empty:
                os.unlink(_dump_path)
        except Exception as err:  # noqa: BLE001
            _warn(f"could not remove the empty stack file {_dump_path} ({err!r})")


def forget_after_fork() -> None:
    """In a forked child: the parent's handler file is not ours to close or remove."""
    global _dump_file, _dump_signum
    _dump_file, _dump_signum = None, 0
