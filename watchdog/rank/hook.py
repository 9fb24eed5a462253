"""The rank side: instruments MLX and publishes the rank's record.

`install()` wraps the collectives and every blocking wait of `mlx.core` and
opens this process's record; `uninstall()` puts every original back. The hot
path (one wrapper call per collective or wait, `hotpath.py`) takes no lock
and writes a few words of its thread's slot in the mapped record. Nothing here ever raises into
the user's program: a failure is reported once on stderr and the rank goes on
uninstrumented. Imports only the standard library and psutil.
"""


from __future__ import annotations

import atexit
import functools
import os
import socket
import stat
import sys
import threading
from typing import Any

from watchdog import host, record
from watchdog.procstat import read_start_ticks
from watchdog.rank.dumps import close_dump, register_dump
from watchdog.rank.dumps import forget_after_fork as _forget_dump_after_fork
from watchdog.rank.env import (
    dump_signal_from_env,
    env_rank_size,
    guess_backend,
    job_id,
    record_dir,
    workload,
)
from watchdog.rank.env import warn as _warn
from watchdog.rank.heartbeat import Heartbeat, reset_open_lock
from watchdog.rank.patches import instrument, restore
from watchdog.record import RecordWriter

__all__ = ["Heartbeat", "current", "dump_signal_from_env", "install", "job_id", "record_dir",
           "uninstall"]

_current: Heartbeat | None = None
_install_lock = threading.RLock()  # reentrant: a late open inside install() re-wraps


def _open_record(path: str, job: str, dump_signal: int) -> RecordWriter:
    import psutil

    me = psutil.Process()
    rank, size = env_rank_size(os.environ)
    writer = functools.partial(
        RecordWriter, path, pid=me.pid, start_time=me.create_time(), uid=os.getuid(),
        host=socket.gethostname(), job=job, rank=rank, world_size=size,
        backend=guess_backend(os.environ), dump_signal=dump_signal,
        start_ticks=_start_ticks(), workload=workload())
    try:
        return writer()
    except FileExistsError:  # a staging file left by an earlier process with our pid
        os.unlink(record.staging_path(path))
        return writer()


def _start_ticks() -> int:
    """This process's start in clock ticks since boot (Linux), 0 when unknown:
    the daemon's identity check that a wall-clock step does not move."""
    try:
        return read_start_ticks("self")
    except (OSError, ValueError, IndexError):
        return 0


def _taken(path: str) -> bool:
    """Something there that this process may not replace: another user's file
    (in the sticky directory we cannot unlink or rename over it), or a
    non-file. Our own leftovers (an earlier process of ours with this pid) are
    replaced as usual."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode)


def _free_base(directory: str) -> str:
    """The path, without suffix, this process publishes under: `<pid>`, or,
    when another user left files under that name (pid reuse, or planted on
    purpose), `<pid>-<start ticks>`, then `<pid>-<random>`. The daemon reads
    every `*.rec` and finds the stack file beside the record's own name."""
    pid = os.getpid()
    for name in (str(pid), f"{pid}-{_start_ticks()}", f"{pid}-{os.urandom(6).hex()}"):
        base = os.path.join(directory, name)
        path = base + record.SUFFIX
        if not any(_taken(p) for p in (path, record.stacks_path(path), record.staging_path(path))):
            return base
    return base  # a random name taken already: the open reports what is wrong


def install(directory: str | None = None, job: str | None = None, *,
            lazy: bool = False) -> Heartbeat:
    """Instrument mlx and open this process's record. Idempotent; never raises.

    `job` names the job for good; without it the job is derived from the launch's
    environment (watchdog/rank/launchenv.py) when the record opens, and again when
    the group forms at `mx.distributed.init`, where launchers such as exo set it.

    With the directory missing or unwritable, warns once on stderr and returns
    a Heartbeat that does nothing, leaving mlx unpatched. With `lazy` (zero-code
    activation), mlx is instrumented at once but the record (and the stack-dump
    handler) only at the first wait, collective or call of the user's API: a
    process that only imports mlx.core, like `mlx.launch`, is never a rank, and
    never warns about the directory either (a rank does, at its first wait, and
    runs on with do-nothing wrappers).
    """
    global _current
    with _install_lock:
        if _current is not None:
            if not lazy:  # asked for by name: a lazy record (zero-code) opens now
                _current._open_late()
            return _current
        hb: Heartbeat | None = None
        try:
            import mlx.core as mx

            directory = directory or record_dir()
            if not lazy and not os.path.isdir(directory):
                raise OSError(missing_dir(directory))
            try:
                if lazy:
                    hb = Heartbeat(None, opener=functools.partial(_open_now, directory, job),
                                   on_open=functools.partial(_rewrap, mx))
                else:
                    hb = Heartbeat(_open_now(directory, job))
                hb.pinned_job = job
                instrument(hb, mx)
                if host.simulated():  # MLX's compute thread stands for the Mac's GPU
                    host.check_simulation()
                    from watchdog.macsim import gpu

                    gpu.label(mx)
            except BaseException:
                restore()
                if hb is not None:
                    hb.close()
                close_dump()
                raise
        except Exception as err:  # noqa: BLE001 - fail soft: the rank runs uninstrumented
            _warn(f"not instrumenting this process: {err}")
            _current = Heartbeat(None)
            return _current
        _current = hb
        atexit.register(_close_at_exit)
        return hb


def missing_dir(directory: str) -> str:
    """The rank's warning for a record directory that is not there, with the fix."""
    return (f"record directory {directory} does not exist (this rank runs unwatched): "
            "the daemon creates it when it starts (sudo mlx-watchdog service install, "
            "or mlx-watchdog run), or point MLX_WATCHDOG_DIR at the daemon's "
            "(`mlx-watchdog doctor` says which)")


def _open_now(directory: str, job: str | None) -> RecordWriter:
    """The stack-dump handler and the record of this process, or neither. The job, when
    the caller named none, is the launch's as its environment says now (a lazy record
    opens at the first wait, after the launcher's variables are set)."""
    job = job or job_id()
    if not os.path.isdir(directory):
        raise OSError(missing_dir(directory))
    base = _free_base(directory)
    signum = register_dump(dump_signal_from_env(), record.stacks_path(base + record.SUFFIX))
    try:
        return _open_record(base + record.SUFFIX, job, signum)
    except BaseException:
        close_dump()
        raise


def _rewrap(mx: Any, hb: Heartbeat) -> None:
    """After a late open: wrap MLX again over the real hot path (the opening
    functions' extra call is then gone for every caller that looks MLX up anew)."""
    with _install_lock:
        if _current is not hb:
            return
        try:
            restore()
            instrument(hb, mx)
        except Exception as err:  # noqa: BLE001 - never into the user's program
            _warn(f"could not re-wrap MLX after opening the record ({err!r})")


def uninstall() -> None:
    """Restore every patched function and close and remove the record."""
    global _current
    with _install_lock:
        hb, _current = _current, None
        restore()
        close_dump()
        if hb is not None:
            hb.close()


def current() -> Heartbeat | None:
    """The installed hook's `Heartbeat`, None when not installed."""
    return _current


def _close_at_exit() -> None:
    hb = _current
    if hb is not None:
        hb.close(record.STATUS_ERROR if hasattr(sys, "last_value") else record.STATUS_CLOSED)
    close_dump()


def _after_fork_in_child() -> None:
    global _install_lock
    # A lock another thread held at the fork stays held in the child for ever
    # (that thread is not there to let go): the child starts with fresh ones.
    _install_lock = threading.RLock()
    reset_open_lock()
    if _current is not None:
        _current._forget_after_fork()
    _forget_dump_after_fork()


# Registered once, at import: the locks need it whether or not install() ran.
os.register_at_fork(after_in_child=_after_fork_in_child)
