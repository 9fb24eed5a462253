"""The daemon's two directories, created safely and refused when unsafe.

The record directory is shared by every user's ranks, like /tmp: owned by
root (or by the daemon's user), world-writable only with the sticky bit, so a
rank can publish its record but not replace another user's. The state
directory holds the journal and the reboot flag: nobody else may write there,
nor in any directory above it (else the state directory could be swapped for
one of theirs, with a FIFO for its journal). The daemon sets its umask (022) at
start, so what it creates is never writable by others whatever it inherited.
"""

from __future__ import annotations

import os
import stat

from watchdog.daemon.config import SetupRefused


def stop_hint(pid: object) -> str:
    """How to stop the daemon `pid`: its service, or the process itself."""
    from watchdog import host

    service = ("sudo launchctl bootout system/com.github.mlx-watchdog"
               if host.os_name() == host.DARWIN else "sudo systemctl stop mlx-watchdog")
    return f"stop it first ({service} if it is the service, else kill {pid})"


class UnsafeDirectory(SetupRefused):
    """A directory whose ownership or mode would let others tamper with it."""


def _checked_dir(path: str, what: str) -> os.stat_result:
    """A real directory (not a link) owned by root or the daemon's user."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{what} {path} is not a directory (or is a symlink)")
    if st.st_uid not in (0, os.geteuid()):
        raise UnsafeDirectory(f"{what} {path} is owned by uid {st.st_uid}, "
                              f"not root or the daemon's user (uid {os.geteuid()}): run: "
                              f"sudo chown {os.geteuid()} {path}, or pass a directory of "
                              "this user's")
    return st


def check_record_dir(path: str) -> None:
    """Raise `UnsafeDirectory` unless the record directory is safe (sticky if others write)."""
    st = _checked_dir(path, "record directory")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirectory(f"record directory {path} is writable by others without the "
                              f"sticky bit (mode {stat.S_IMODE(st.st_mode):o}); "
                              f"run: chmod 1777 {path}")


def check_state_dir(path: str) -> None:
    """Raise `UnsafeDirectory` unless only its owner writes the state directory, parents safe."""
    st = _checked_dir(path, "state directory")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectory(f"state directory {path} is writable by others "
                              f"(mode {stat.S_IMODE(st.st_mode):o}); run: chmod 755 {path}")
    check_ancestors(path)


def check_ancestors(path: str) -> None:
    """Every directory above `path` (links resolved: /var is one on macOS) is owned
    by root or the daemon's user, and writable by others only with the sticky bit
    (/tmp): else another user could rename `path` away and put theirs there."""
    current = os.path.dirname(os.path.realpath(path))
    while True:
        st = os.stat(current)
        if st.st_uid not in (0, os.geteuid()):
            raise UnsafeDirectory(f"{current}, above the state directory {path}, is owned by "
                                  f"uid {st.st_uid}, not root or the daemon's user (another "
                                  "user could swap the state directory): run: sudo chown "
                                  f"root {current}, or pass --state-dir elsewhere")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise UnsafeDirectory(f"{current}, above the state directory {path}, is writable "
                                  f"by others (mode {stat.S_IMODE(st.st_mode):o}); run: "
                                  f"chmod go-w {current}")
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent


def _missing(path: str) -> list[str]:
    """`path` and those of its parents that do not exist yet."""
    missing, current = [], os.path.abspath(path)
    while not os.path.lexists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return missing


def prepare(record_dir: str, state_dir: str) -> list[str]:
    """Create what is missing (record dir 1777, state dir 755), then check both.
    Returns the directories it created (parents too), for `undo` if the start is
    refused."""
    created: list[str] = []
    for path, mode, check in ((record_dir, 0o1777, check_record_dir),
                              (state_dir, 0o755, check_state_dir)):
        try:
            if not os.path.lexists(path):
                missing = _missing(path)
                os.makedirs(path, mode=0o755, exist_ok=True)  # parents: 0777 & ~umask
                created += missing
                os.chmod(path, mode)  # explicit: makedirs is subject to the umask
            check(path)
        except OSError as err:
            # The record directory made before a state directory refused: not left
            # behind, an empty 1777 directory nobody asked for.
            undo(created, state_dir)
            hint = (" (run as root, or pass a directory you own)"
                    if isinstance(err, PermissionError) else "")
            raise SetupRefused(f"cannot create or use {path}: {err.strerror}{hint}") from None
        except SetupRefused:
            undo(created, state_dir)
            raise
    return created


def undo(created: list[str], state_dir: str) -> None:
    """A refused start leaves nothing behind: the lock file in a state directory it
    created, then the directories `prepare` created, deepest first, each only while
    empty (anything another process put there since stays, with its directory)."""
    if os.path.abspath(state_dir) in created:
        try:
            os.unlink(os.path.join(state_dir, LOCK))
        except OSError:
            pass  # never written, or gone: the directory then goes if empty
    for path in sorted(created, key=len, reverse=True):
        try:
            os.rmdir(path)
        except OSError:
            pass  # not empty (or not ours to remove): left as it is


LOCK = "daemon.lock"  # in the state directory: held (flock) by the one daemon using it


def _holder(fd: int) -> str:
    """The pid a lock file names (written by its holder), for the one-line refusal."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


def lock_state_dir(state_dir: str) -> int:
    """One daemon per state directory: take `<state_dir>/daemon.lock` (flock, released by
    the kernel when this process ends, however it ends) and write our pid in it.

    Returns the descriptor, to keep open for the daemon's life. Refuses (SetupRefused)
    when another daemon holds it, or when this user cannot write there: a daemon
    that cannot keep its journal must not start and log the failure every scan.
    """
    import fcntl

    path = os.path.join(state_dir, LOCK)
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise SetupRefused(f"cannot write in state directory {state_dir} (uid {os.geteuid()}): "
                         "run as root, or pass --state-dir a directory this user owns")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise SetupRefused(f"cannot write {path}: {err.strerror} (run as root, or pass "
                         "--state-dir a directory this user owns)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        raise SetupRefused(f"another daemon (pid {pid}) already uses state directory "
                           f"{state_dir}: {stop_hint(pid)}, or give this one another "
                           "--state-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def held_by(state_dir: str) -> str | None:
    """The pid of the daemon holding `state_dir`'s lock now, or None if none does."""
    import fcntl

    try:
        fd = os.open(os.path.join(state_dir, LOCK),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops a lock taken just now
    return None
