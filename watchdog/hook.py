"""The rank side: instruments MLX and publishes the rank's record.

`install()` wraps the collectives and every blocking wait of `mlx.core` and
opens this process's record; `uninstall()` puts every original back. The hot
path (one wrapper call per collective or wait) takes a lock, updates a few
integers and writes them into the mapped record. Nothing here ever raises into
the user's program: a failure is reported once on stderr and the rank goes on
uninstrumented. Imports only the standard library and psutil.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import functools
import hashlib
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import record
from .record import (
    ENTRY_WORDS,
    FLIGHT_SLOTS,
    OP_CODE,
    W_COLLECTIVES,
    W_COMPLETED,
    W_ENTERED,
    W_FLIGHT,
    W_LAST_PROGRESS,
    W_LAST_WAIT,
    W_MAX_WAIT,
    W_OP,
    W_PHASE,
    W_PHASE_SINCE,
    W_SEQ,
    W_WAIT_SINCE,
    RecordWriter,
)
from .states import Phase

WAITS = {  # where each blocking call lives: "core" is mlx.core, "array" is mlx.core.array
    "eval": "core",
    "synchronize": "core",
    "item": "array",
    "tolist": "array",
    "__bool__": "array",
    "__int__": "array",
    "__float__": "array",
}
COLLECTIVES = ("all_sum", "all_gather", "all_max", "all_min", "sum_scatter", "send", "recv",
               "recv_like")


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"mlx-watchdog: {message}\n")
    except Exception:  # noqa: BLE001, S110 - stderr itself is gone; nothing left to tell
        pass


def record_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    return env.get("MLX_WATCHDOG_DIR") or record.DEFAULT_DIR


def job_id(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """A job id that every rank of one launch derives alike, with no configuration.

    The hostfile (ring, jaccl) or the coordinator address is the same text on
    every node of a launch, wherever the launcher wrote it.
    """
    if env.get("MLX_WATCHDOG_JOB"):
        return env["MLX_WATCHDOG_JOB"]
    material = ""
    hostfile = env.get("MLX_HOSTFILE")
    if hostfile:
        try:
            with open(hostfile, "rb") as f:
                material = f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            material = hostfile
    for key in ("MLX_JACCL_COORDINATOR", "MLX_IBV_DEVICES", "MLX_WORLD_SIZE"):
        material += f"|{env.get(key, '')}"
    if not material.strip("|"):
        return f"pid{os.getpid()}"  # not a distributed launch: a job of one
    return "j" + hashlib.sha256(material.encode()).hexdigest()[:11]


def _env_rank_size(env: dict[str, str] | os._Environ[str]) -> tuple[int, int]:
    rank = int(env["MLX_RANK"]) if env.get("MLX_RANK", "").isdigit() else -1
    size = 0
    hostfile = env.get("MLX_HOSTFILE")
    if hostfile:
        try:
            with open(hostfile) as f:
                hosts = json.load(f)
            size = len(hosts) if isinstance(hosts, list) else 0
        except (OSError, ValueError):
            size = 0
    return rank, size


def _guess_backend(env: dict[str, str] | os._Environ[str]) -> str:
    if env.get("MLX_IBV_DEVICES") or env.get("MLX_JACCL_COORDINATOR"):
        return "jaccl"
    if env.get("MLX_HOSTFILE"):
        return "ring"
    return ""


def dump_signal_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """MLX_WATCHDOG_DUMP_SIGNAL: a number or a name (SIGUSR2, USR2); 0 for none."""
    raw = env.get("MLX_WATCHDOG_DUMP_SIGNAL", "SIGUSR2").strip().upper()
    if raw.isdigit():
        return int(raw)
    name = raw if raw.startswith("SIG") else "SIG" + raw
    return int(getattr(signal, name, 0))


INIT_OP = OP_CODE["init"]
_RUNNING, _WAIT, _IDLE, _INIT = (int(p) for p in (Phase.RUNNING, Phase.WAIT, Phase.IDLE,
                                                  Phase.INIT))


class Heartbeat:
    """This process's counters and phase, kept in its mapped record.

    The record's hot words are the only copy of the counters: the hot path
    updates them in place under a lock, with the sequence word odd meanwhile.
    A Heartbeat whose record could not be opened still works: every method is
    a no-op, so user code that calls `hb.step()` or `hb.idle()` runs the same.
    """

    def __init__(self, writer: RecordWriter | None = None,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._writer = writer
        self._words: memoryview | None = writer.words if writer is not None else None
        self._clock = clock
        self._lock = threading.Lock()
        self._wait_depth = 0
        self._init_depth = 0
        self._idle_depth = 0
        self._expects: list[tuple[float, int, str]] = []
        if writer is not None:
            now = clock()
            self._update(lambda w: _set_words(w, {record.W_PHASE: _RUNNING,
                                                  record.W_PHASE_SINCE: now,
                                                  record.W_LAST_PROGRESS: now}))

    @property
    def active(self) -> bool:
        return self._words is not None

    @property
    def path(self) -> str | None:
        return self._writer.path if self._writer is not None else None

    def _word(self, index: int) -> int:
        words = self._words
        return int(words[index]) if words is not None else 0

    collectives = property(lambda self: self._word(record.W_COLLECTIVES))
    waits_entered = property(lambda self: self._word(record.W_ENTERED))
    waits_completed = property(lambda self: self._word(record.W_COMPLETED))
    steps = property(lambda self: self._word(record.W_STEPS))

    @property
    def phase(self) -> Phase:
        return Phase(self._word(record.W_PHASE) or _RUNNING)

    # -- the hot path: a few word stores under the lock ------------------------

    def _phase_now(self) -> int:
        if self._idle_depth:
            return _IDLE
        if self._init_depth:
            return _INIT
        return _WAIT if self._wait_depth else _RUNNING

    # Each method takes the lock with acquire/release (cheaper than `with`),
    # makes `seq` odd, writes, and makes it even again in a `finally`, so an
    # error can never leave the record mid-write. No allocation, no call
    # besides the clock and the lock.

    def enter_wait(self, op: int) -> int:
        """A blocking call starts; returns its start time for `exit_wait`."""
        if self._words is None:
            return 0
        lock = self._lock
        try:
            now = self._clock()
            lock.acquire()
            try:
                w = self._words
                if w is None:
                    return 0
                depth = self._wait_depth + 1
                init_depth = self._init_depth + (op == INIT_OP)
                phase = _IDLE if self._idle_depth else _INIT if init_depth else _WAIT
                seq = w[W_SEQ] + 1
                w[W_SEQ] = seq
                try:
                    w[W_ENTERED] += 1
                    if depth == 1:
                        w[W_WAIT_SINCE] = now
                        w[W_OP] = op
                    if w[W_PHASE] != phase:
                        w[W_PHASE] = phase
                        w[W_PHASE_SINCE] = now
                finally:
                    w[W_SEQ] = seq + 1
                # Last: an exception escaping above leaves no wait open without its exit.
                self._wait_depth, self._init_depth = depth, init_depth
            finally:
                lock.release()
            return now
        except Exception as err:  # noqa: BLE001 - never into the user's program
            self._fail(err)
            return 0

    def exit_wait(self, started: int, op: int) -> None:
        """The blocking call returned (or raised): that is progress."""
        if not started or self._words is None:
            return
        lock = self._lock
        try:
            now = self._clock()
            lock.acquire()
            try:
                w = self._words
                if w is None:
                    return
                depth = self._wait_depth - 1 if self._wait_depth else 0
                init_depth = self._init_depth
                if op == INIT_OP and init_depth:
                    init_depth -= 1
                idle = self._idle_depth
                phase = (_IDLE if idle else _INIT if init_depth else
                         _WAIT if depth else _RUNNING)
                seq = w[W_SEQ] + 1
                w[W_SEQ] = seq
                try:
                    w[W_COMPLETED] += 1
                    w[W_LAST_PROGRESS] = now
                    if op != INIT_OP:
                        last = w[W_LAST_WAIT] = now - started
                        # Waits inside idle() or expect() are not the rank's normal
                        # pace: they must not stretch the learned deadline.
                        if last > w[W_MAX_WAIT] and not (idle or self._expects):
                            w[W_MAX_WAIT] = last
                    if depth:
                        # Another thread still waits: progress restarts its clock,
                        # which can only delay a verdict, never hasten one.
                        w[W_WAIT_SINCE] = now
                    else:
                        w[W_WAIT_SINCE] = 0
                        w[W_OP] = 0
                    if w[W_PHASE] != phase:
                        w[W_PHASE] = phase
                        w[W_PHASE_SINCE] = now
                finally:
                    w[W_SEQ] = seq + 1
                self._wait_depth, self._init_depth = depth, init_depth
            finally:
                lock.release()
        except Exception as err:  # noqa: BLE001
            self._fail(err)

    def collective(self, op: int, out: Any) -> None:
        """A collective was issued: count it and add it to the flight recorder."""
        if self._words is None:
            return
        lock = self._lock
        try:
            nbytes = out.nbytes
            kind = op | _DTYPE_CODES.get(out.dtype, 0) << 16
            now = self._clock()
            lock.acquire()
            try:
                w = self._words
                if w is None:
                    return
                seq = w[W_SEQ] + 1
                w[W_SEQ] = seq
                try:
                    number = w[W_COLLECTIVES] + 1
                    base = W_FLIGHT + (number % FLIGHT_SLOTS) * ENTRY_WORDS
                    w[base] = number
                    w[base + 1] = now
                    w[base + 2] = nbytes
                    w[base + 3] = kind
                    w[W_COLLECTIVES] = number
                finally:
                    w[W_SEQ] = seq + 1
            finally:
                lock.release()
        except Exception as err:  # noqa: BLE001
            self._fail(err)

    def publish_threads(self) -> None:
        """Publish the native ids of this process's Python threads (main excluded).

        The daemon's backstop (docs/architecture.md) needs to know which of the
        process's threads run Python: one of them computing at 100% is the
        user's work, while a spinning thread that is not one of them is MLX's.
        Called at install and after each `threading.Thread.start`, never on the
        hot path. A thread that ended stays listed until the next start: a
        recycled id then reads as Python, which can only withhold a verdict.
        """
        main = threading.main_thread()
        tids = [t.native_id for t in threading.enumerate()
                if t is not main and t.native_id is not None]
        head = record.THREADS_PUBLISHED | min(len(tids), record.THREAD_SLOTS)
        if len(tids) > record.THREAD_SLOTS:
            head |= record.THREADS_OVERFLOW
        slots = (tids + [0] * record.THREAD_SLOTS)[: record.THREAD_SLOTS]

        def write(w: memoryview) -> None:
            for i, value in enumerate([head, *slots]):
                w[record.W_THREADS + i] = value

        self._update(write)

    # -- the user's API ------------------------------------------------------

    def step(self) -> None:
        """One unit of user progress (a training step, a generated token)."""
        self._update(lambda w: _set_words(w, {record.W_STEPS: w[record.W_STEPS] + 1}))

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """Declared idle (e.g. waiting for requests): never judged a stall."""
        self._change(lambda: setattr(self, "_idle_depth", self._idle_depth + 1))
        try:
            yield
        finally:
            self._change(lambda: setattr(self, "_idle_depth", max(0, self._idle_depth - 1)))

    @contextlib.contextmanager
    def expect(self, seconds: float, reason: str = "") -> Iterator[None]:
        """This stretch may take up to `seconds`: waits inside get that deadline."""
        seconds = float(seconds)
        if not seconds >= 0:
            raise ValueError(f"expect() needs seconds >= 0, got {seconds}")
        self._change(lambda: self._expects.append((seconds, self._clock(), reason)))
        try:
            yield
        finally:
            self._change(self._pop_expect)

    def _pop_expect(self) -> None:
        if self._expects:
            self._expects.pop()

    def _change(self, change: Callable[[], None]) -> None:
        """Apply a change to the idle depth or expect stack, and publish it."""
        def publish(w: memoryview) -> None:
            change()
            now = self._clock()
            phase = self._phase_now()
            if w[record.W_PHASE] != phase:
                _set_words(w, {record.W_PHASE: phase, record.W_PHASE_SINCE: now})
            seconds, since, reason = self._expects[-1] if self._expects else (0.0, 0, "")
            assert self._writer is not None
            self._writer.write_expect(seconds, since, reason)

        self._update(publish)

    def _update(self, apply: Callable[[memoryview], None]) -> None:
        """Run `apply` on the words under the lock and the seqlock; never raise."""
        w = self._words
        if w is None:
            return
        try:
            with self._lock:
                w[W_SEQ] += 1
                try:
                    apply(w)
                finally:
                    w[W_SEQ] += 1
        except Exception as err:  # noqa: BLE001
            self._fail(err)

    # -- identity and lifetime -----------------------------------------------

    def set_group(self, rank: int, world_size: int, backend: str | None) -> None:
        writer = self._writer
        if self._words is None or writer is None:
            return
        try:
            with self._lock:
                writer.set_identity(rank=rank, world_size=world_size, backend=backend)
        except Exception as err:  # noqa: BLE001
            self._fail(err)

    def _fail(self, err: BaseException) -> None:
        writer, self._writer, self._words = self._writer, None, None
        _warn(f"record disabled after an error ({err!r}); the rank runs on uninstrumented")
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close(record.STATUS_ERROR, remove=False)

    def close(self, status: int = record.STATUS_CLOSED) -> None:
        """Mark the record closed; remove it unless the rank is ending on an error,
        whose record the daemon reports (and fences the job over)."""
        with self._lock:
            writer, self._writer, self._words = self._writer, None, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close(status, remove=status != record.STATUS_ERROR)

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's record is not ours to write or remove."""
        self._writer = self._words = None
        self._lock = threading.Lock()


def _set_words(words: memoryview, values: dict[int, int]) -> None:
    for index, value in values.items():
        words[index] = value


_DTYPE_CODES: dict[Any, int] = {}

_current: Heartbeat | None = None
_patches: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)
_dump_file: Any = None
_dump_signum = 0
_install_lock = threading.Lock()


def _wrap_wait(hb: Heartbeat, original: Any, op: int) -> Any:
    enter, leave = hb.enter_wait, hb.exit_wait  # bound once: the hot path is short

    @functools.wraps(original)
    def wait(*args: Any, **kwargs: Any) -> Any:
        started = enter(op)
        try:
            return original(*args, **kwargs)
        finally:
            leave(started, op)

    return wait


def _wrap_collective(hb: Heartbeat, original: Any, op: int) -> Any:
    issued = hb.collective

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        issued(op, out)
        return out

    return collective


def _wrap_init(hb: Heartbeat, original: Any) -> Any:
    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        started = hb.enter_wait(INIT_OP)
        try:
            group = original(*args, **kwargs)
        finally:
            hb.exit_wait(started, INIT_OP)
        try:
            backend = kwargs.get("backend", args[1] if len(args) > 1 else "any")
            if backend == "any":
                backend = _guess_backend(os.environ) if group.size() > 1 else "single"
            hb.set_group(group.rank(), group.size(), str(backend))
        except Exception as err:  # noqa: BLE001
            _warn(f"could not read the group ({err!r})")
        return group

    return init


def _wrap_thread_start(hb: Heartbeat, original: Any) -> Any:
    @functools.wraps(original)
    def start(self: threading.Thread) -> None:
        original(self)  # returns once the thread runs and knows its native id
        try:
            hb.publish_threads()
        except Exception as err:  # noqa: BLE001 - never into the user's program
            hb._fail(err)

    return start


def _patch(owner: Any, name: str, wrapper: Any) -> None:
    original = getattr(owner, name)
    setattr(owner, name, wrapper)
    _patches.append((owner, name, original, wrapper))


def _instrument(hb: Heartbeat, mx: Any) -> None:
    for name in record.DTYPES[1:]:
        dtype = getattr(mx, name, None)
        if dtype is not None:
            _DTYPE_CODES[dtype] = record.DTYPE_CODE[name]
    for name, where in WAITS.items():
        owner = mx if where == "core" else mx.array
        op = OP_CODE[name.strip("_")]
        _patch(owner, name, _wrap_wait(hb, getattr(owner, name), op))
    dist = mx.distributed
    for name in COLLECTIVES:
        if hasattr(dist, name):
            _patch(dist, name, _wrap_collective(hb, getattr(dist, name), OP_CODE[name]))
    _patch(dist, "init", _wrap_init(hb, dist.init))
    _patch(threading.Thread, "start", _wrap_thread_start(hb, threading.Thread.start))
    hb.publish_threads()


def _open_record(path: str, job: str, dump_signal: int) -> RecordWriter:
    import psutil

    me = psutil.Process()
    rank, size = _env_rank_size(os.environ)
    fields: dict[str, Any] = dict(
        pid=me.pid, start_time=me.create_time(), uid=os.getuid(), host=socket.gethostname(),
        job=job, rank=rank, world_size=size, backend=_guess_backend(os.environ),
        dump_signal=dump_signal)
    try:
        return RecordWriter(path, **fields)
    except FileExistsError:  # a staging file left by an earlier process with our pid
        os.unlink(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.new"))
        return RecordWriter(path, **fields)


def _open_nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


def _register_dump(signum: int, path: str) -> int:
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


def _close_dump() -> None:
    """Unregister the dump handler; remove its file unless it holds a dump."""
    global _dump_file, _dump_signum
    file, _dump_file = _dump_file, None
    signum, _dump_signum = _dump_signum, 0
    if signum:
        with contextlib.suppress(Exception):
            faulthandler.unregister(signum)
    if file is not None:
        with contextlib.suppress(Exception):
            file.close()
            if os.path.getsize(file.name) == 0:
                os.unlink(file.name)


def install(directory: str | None = None, job: str | None = None) -> Heartbeat:
    """Instrument mlx and open this process's record. Idempotent; never raises.

    With the directory missing or unwritable, warns once on stderr and returns
    a Heartbeat that does nothing, leaving mlx unpatched.
    """
    global _current
    with _install_lock:
        if _current is not None:
            return _current
        hb: Heartbeat | None = None
        try:
            import mlx.core as mx

            directory = directory or record_dir()
            if not os.path.isdir(directory):
                raise OSError(f"record directory {directory} does not exist")
            base = os.path.join(directory, str(os.getpid()))
            try:
                signum = _register_dump(dump_signal_from_env(), base + ".stacks")
                hb = Heartbeat(_open_record(base + record.SUFFIX, job or job_id(), signum))
                _instrument(hb, mx)
            except BaseException:
                _restore()
                if hb is not None:
                    hb.close()
                _close_dump()
                raise
        except Exception as err:  # noqa: BLE001 - fail soft: the rank runs uninstrumented
            _warn(f"not instrumenting this process: {err}")
            _current = Heartbeat(None)
            return _current
        _current = hb
        atexit.register(_close_at_exit)
        os.register_at_fork(after_in_child=_after_fork_in_child)
        return hb


def _restore() -> None:
    while _patches:
        owner, name, original, wrapper = _patches.pop()
        if getattr(owner, name, None) is wrapper:
            setattr(owner, name, original)
        else:
            _warn(f"{name} was re-patched by someone else; leaving it in place")


def uninstall() -> None:
    """Restore every patched function and close and remove the record."""
    global _current
    with _install_lock:
        hb, _current = _current, None
        _restore()
        _close_dump()
        if hb is not None:
            hb.close()


def current() -> Heartbeat | None:
    return _current


def _close_at_exit() -> None:
    hb = _current
    if hb is not None:
        hb.close(record.STATUS_ERROR if hasattr(sys, "last_value") else record.STATUS_CLOSED)
    _close_dump()


def _after_fork_in_child() -> None:
    global _dump_file, _dump_signum
    if _current is not None:
        _current._forget_after_fork()
    _dump_file, _dump_signum = None, 0
