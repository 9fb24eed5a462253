"""Evidence on request: faulthandler writes every Python thread's stack to a file
next to the record when the daemon sends the dump signal."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import stat
from typing import Any

from watchdog.rank.env import warn as _warn

_dump_file: Any = None
_dump_signum = 0


def _open_nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


def register_dump(signum: int, path: str) -> int:
    """faulthandler on `signum`, writing every thread's stack next to the record."""
    global _dump_file, _dump_signum
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
    # The directory is shared by every user's ranks: never follow a planted link.
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    file = open(path, "a", opener=_open_nofollow)  # noqa: SIM115 - lives with the handler
    try:
        faulthandler.register(signum, file=file, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError) as err:
        file.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        _warn(f"cannot dump stacks on signal {signum} ({err}); stack dumps are off")
        return 0
    _dump_file, _dump_signum = file, signum
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
            file.close()
            if os.path.getsize(file.name) == 0:
                os.unlink(file.name)
        except Exception as err:  # noqa: BLE001
            _warn(f"could not remove the empty stack file {file.name} ({err!r})")


def forget_after_fork() -> None:
    """In a forked child: the parent's handler file is not ours to close or remove."""
    global _dump_file, _dump_signum
    _dump_file, _dump_signum = None, 0
