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
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from watchdog import record
from watchdog.rank import launchenv
from watchdog.record import (
    KIND_SHIFT,
    OP_CODE,
    RING,
    S_COLLECTIVES,
    S_COMPLETED,
    S_LAST_WAIT,
    S_MAX_WAIT,
    S_OP,
    S_PROGRESS,
    S_RING,
    S_SINCE,
    S_STEPS,
    RecordWriter,
)
from watchdog.states import Phase

# Every entry point of mlx.core (0.32.x) that can block on the scheduler or a peer,
# found by reading the bindings and timing each against a lazy graph (docs/coverage.md).
# "core" is mlx.core, "array" is mlx.core.array. print(a) and str(a) reach __repr__;
# f"{a}" and format() reach __format__; pickle reaches __getstate__. The buffer protocol
# (np.array(a), memoryview(a)) is a C slot that cannot be wrapped: see docs/limits.md.
WAITS = {
    "eval": "core",
    "async_eval": "core",  # blocks when the scheduler has too much work in flight
    "synchronize": "core",
    "save": "core",
    "savez": "core",
    "savez_compressed": "core",
    "save_safetensors": "core",
    "save_gguf": "core",
    "load": "core",  # evaluates at once when given a file object
    "clear_streams": "core",  # tears down stream threads, which finish their queue first
    "item": "array",
    "tolist": "array",
    "__bool__": "array",
    "__int__": "array",
    "__float__": "array",
    "__complex__": "array",
    "__index__": "array",
    "__format__": "array",
    "__repr__": "array",
    "__bytes__": "array",
    "__array__": "array",
    "__dlpack__": "array",
    "__getstate__": "array",
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


def job_id(env: Mapping[str, str] = os.environ) -> str:
    """A job id that every rank of one launch derives alike, with no configuration.

    MLX_WATCHDOG_JOB if set; else a hash of the hostfile's or the JACCL device
    file's contents and the coordinator (watchdog/launchenv.py), the same text
    on every node of a launch, wherever the launcher wrote it.
    """
    return launchenv.job_id(env, os.getpid())


def _env_rank_size(env: Mapping[str, str]) -> tuple[int, int]:
    return launchenv.rank(env), launchenv.world_size(env)


def _guess_backend(env: Mapping[str, str]) -> str:
    return launchenv.backend(env)


def dump_signal_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """MLX_WATCHDOG_DUMP_SIGNAL: a number or a name (SIGUSR2, USR2); 0 for none."""
    raw = env.get("MLX_WATCHDOG_DUMP_SIGNAL", "SIGUSR2").strip().upper()
    if raw.isdigit():
        return int(raw)
    name = raw if raw.startswith("SIG") else "SIG" + raw
    return int(getattr(signal, name, 0))


INIT_OP = OP_CODE["init"]


class _Slot:
    """One thread's part of the record: its words, and Python copies of its counters
    (reading a Python attribute is several times cheaper than reading the map)."""

    __slots__ = ("w", "depth", "since", "completed", "collectives", "steps", "max_wait")

    def __init__(self, words: memoryview) -> None:
        self.w = words
        self.depth = self.since = self.completed = self.collectives = self.steps = 0
        self.max_wait = 0


class _Release:
    """Kept in the thread's local storage: when the thread ends, its slot goes back."""

    __slots__ = ("slot", "free")

    def __init__(self, slot: _Slot, free: list[_Slot]) -> None:
        self.slot, self.free = slot, free

    def __del__(self) -> None:
        slot = self.slot
        if slot.depth:  # a thread cannot end inside a wait; never leave one open anyway
            slot.depth = 0
            with contextlib.suppress(Exception):
                slot.w[S_SINCE] = 0
        self.free.append(slot)  # list.append is atomic: no lock


class Heartbeat:
    """This process's counters and phase, kept in its mapped record.

    Each thread that calls MLX gets a slot of the record of its own and is its
    only writer, so the hot path (`enter_wait`, `exit_wait`, `collective`,
    `step`) takes no lock: a signal handler that calls into MLX, or an
    interrupt at any point, can never block it. A wait is open while the
    slot's `since` word is non-zero: one store opens it, one store closes it.
    On Python 3.11+ no signal can be delivered between a hot path's clock read
    and its last store (the interpreter only runs handlers on calls and
    backward jumps), and the wrapper closes a wait with no call before the
    store, so an interrupt can neither leave a wait open nor hide one.

    `idle()`, `expect()` and the group identity are rare and go to the
    record's cold words under a reentrant lock and the seqlock. A Heartbeat
    whose record could not be opened still works: every method is a no-op.

    With an `opener` and no writer, the record is opened late: on the first wait,
    collective or call of the user's API, i.e. when the process first acts like a
    rank. Zero-code activation installs this way so that a process that only
    imports mlx.core (`mlx.launch` itself, a tool) is never published as a rank.
    """

    enter_wait: Callable[[int], int]
    exit_wait: Callable[[int, int], None]
    collective: Callable[[int, Any], None]
    step: Callable[[], None]
    _enter: Callable[[int], _Slot | None]
    _count: Callable[[_Slot, int], None]

    def __init__(self, writer: RecordWriter | None = None,
                 clock: Callable[[], int] = time.monotonic_ns,
                 opener: Callable[[], RecordWriter] | None = None,
                 on_open: Callable[[Heartbeat], None] | None = None) -> None:
        self._writer = writer
        self._opener = opener if writer is None else None
        self._on_open = on_open  # after a late open: re-wrap MLX with the real hot path
        self._closed = False
        self._clock = clock
        self._cold = threading.RLock()  # reentrant: a signal handler may publish inside
        self._idle_depth = 0
        self._idle_since = self._idle_ended = 0
        self._expects: list[tuple[float, int, str]] = []
        self._stretch = [0]  # non-zero inside idle() or expect(): waits do not teach
        self._local = threading.local()
        self._scratch = memoryview(bytearray(record.SLOT_SIZE)).cast("Q")
        self._overflow = _Slot(self._scratch)
        self._overflowed = False
        self._take(writer)

    def _take(self, writer: RecordWriter | None) -> None:
        """Use `writer`'s slots, and build the hot path over them."""
        self._slots = [_Slot(writer.slot(k)) for k in range(record.THREAD_SLOTS)] \
            if writer is not None else []
        self._free = self._slots[::-1]  # claimed with list.pop(): atomic, slot 0 first
        self._build()

    def _open_late(self) -> bool:
        """Open the record now (the cold path, taken once); False if there is none."""
        opener = self._opener
        if opener is None:
            return self._writer is not None
        try:
            with _open_lock:  # two threads' first waits open one record
                if self._writer is not None or self._opener is None:
                    return self._writer is not None
                self._opener = None
                writer = opener()
                with self._cold:
                    if self._closed:  # uninstall() won the race: publish nothing
                        writer.close(record.STATUS_CLOSED, remove=True)
                        return False
                    self._writer = writer
                    self._take(writer)
            self._cold_update(lambda now: None)  # idle/expect entered before the open
        except Exception as err:  # noqa: BLE001 - never into the user's program
            _warn(f"not instrumenting this process: {err}")
            return False
        if self._on_open is not None:
            self._on_open(self)
        return True

    @property
    def active(self) -> bool:
        """Instrumented: the record is open, or opens at the first sign of a rank."""
        return self._writer is not None or self._opener is not None

    @property
    def published(self) -> bool:
        """The record exists (zero-code activation opens it late)."""
        return self._writer is not None

    @property
    def path(self) -> str | None:
        return self._writer.path if self._writer is not None else None

    collectives = property(lambda self: sum(s.collectives for s in self._slots))
    waits_entered = property(lambda self: sum(s.completed + bool(s.depth) for s in self._slots))
    waits_completed = property(lambda self: sum(s.completed for s in self._slots))
    steps = property(lambda self: sum(s.steps for s in self._slots))

    @property
    def phase(self) -> Phase:
        if self._idle_depth:
            return Phase.IDLE
        return Phase.WAIT if any(s.depth for s in self._slots) else Phase.RUNNING

    # -- the hot path --------------------------------------------------------

    def _claim(self) -> _Slot:
        """This thread's first call: take a free slot (cold, once per thread)."""
        try:
            slot = self._free.pop()
        except IndexError:
            slot = self._overflow  # scratch memory: this thread's calls go unrecorded
            if not self._overflowed:
                self._overflowed = True
                _warn(f"more than {record.THREAD_SLOTS} threads call MLX at once; the "
                      "waits of the others are not recorded")
        else:
            with contextlib.suppress(Exception):
                slot.w[record.S_OWNER] = threading.get_native_id()
            self._local.release = _Release(slot, self._free)
        self._local.slot = slot
        return slot

    def _build(self) -> None:
        """The hot-path functions: closures over locals, no attribute lookups on self.

        Order inside each one: everything that calls (the clock, `hash`) first,
        then only loads and stores; the store that commits comes after the data
        it commits (a reader derives everything from committed words).
        """
        if self._writer is None and self._opener is not None:
            self._build_opening()
            return
        if self._writer is None:
            def nothing(*args: Any) -> Any:
                return 0

            self.enter_wait = self.exit_wait = self.collective = self.step = nothing
            self._enter = self._count = nothing
            return
        local, claim, clock, fail = self._local, self._claim, self._clock, self._fail
        stretch, codes = self._stretch, _DTYPE_CODES

        def enter(op: int) -> _Slot | None:
            """A blocking call starts: open a wait on this thread's slot; returns it."""
            try:
                try:
                    st: _Slot = local.slot
                except AttributeError:
                    st = claim()
                now = clock()
                d = st.depth
                if not d:
                    st.since = now
                    w = st.w
                    w[S_OP] = op
                    w[S_SINCE] = now  # commits: this thread is in a wait since now
                st.depth = d + 1
            except Exception as err:  # noqa: BLE001 - never into the user's program
                fail(err)
                return None
            return st

        def count(st: _Slot, op: int) -> None:
            """A wait was closed (the wrapper closes it): count it, the progress, and time
            the thread's outermost wait."""
            try:
                since = st.since  # before the clock: a handler that runs there waits anew
                now = clock()
                w = st.w
                w[S_PROGRESS] = now
                c = st.completed + 1
                st.completed = c
                w[S_COMPLETED] = c
                if op != INIT_OP and not st.depth:
                    last = now - since
                    w[S_LAST_WAIT] = last
                    # Waits inside idle() or expect() are not the rank's normal pace:
                    # they must not stretch the learned deadline.
                    if last > st.max_wait and not stretch[0]:
                        st.max_wait = last
                        w[S_MAX_WAIT] = last
            except Exception as err:  # noqa: BLE001
                fail(err)

        # The public pair does what `enter` and the wrapper's close + `count` do, written
        # out again rather than calling them: a Python call costs as much as two stores.
        def enter_wait(op: int) -> int:
            """A blocking call starts; returns its start time for `exit_wait`."""
            try:
                try:
                    st: _Slot = local.slot
                except AttributeError:
                    st = claim()
                now = clock()
                d = st.depth
                if not d:
                    st.since = now
                    w = st.w
                    w[S_OP] = op
                    w[S_SINCE] = now
                st.depth = d + 1
            except Exception as err:  # noqa: BLE001
                fail(err)
                return 0
            return now

        def exit_wait(started: int, op: int) -> None:
            """The blocking call returned (or raised): close the wait, count it, and time it
            from `started`."""
            if not started:
                return
            try:
                st: _Slot = local.slot
                w = st.w
                d = st.depth - 1
                if d < 1:
                    w[S_SINCE] = 0  # commits: out of the wait
                    d = 0
                st.depth = d
                now = clock()
                w[S_PROGRESS] = now
                c = st.completed + 1
                st.completed = c
                w[S_COMPLETED] = c
                if op != INIT_OP and not d:
                    last = now - started
                    w[S_LAST_WAIT] = last
                    if last > st.max_wait and not stretch[0]:
                        st.max_wait = last
                        w[S_MAX_WAIT] = last
            except Exception as err:  # noqa: BLE001
                fail(err)

        def collective(op: int, out: Any) -> None:
            """A collective was issued: count it and add it to the thread's flight ring."""
            try:
                kind = out.nbytes << KIND_SHIFT | codes[hash(out.dtype) & 0xFF] << 8 | op
                try:
                    st = local.slot
                except AttributeError:
                    st = claim()
                now = clock()
                n = st.collectives + 1
                i = S_RING + n % RING * 2
                w = st.w
                w[i] = now
                w[i + 1] = kind
                st.collectives = n
                w[S_COLLECTIVES] = n  # commits the entry
            except Exception as err:  # noqa: BLE001
                fail(err)

        def step() -> None:
            """One unit of user progress (a training step, a generated token)."""
            try:
                try:
                    st = local.slot
                except AttributeError:
                    st = claim()
                s = st.steps + 1
                st.steps = s
                st.w[S_STEPS] = s
            except Exception as err:  # noqa: BLE001
                fail(err)

        self.enter_wait, self.exit_wait, self._enter, self._count = enter_wait, exit_wait, \
            enter, count
        self.collective, self.step = collective, step

    def _build_opening(self) -> None:
        """Before a late open: each hot-path function opens the record, then does its
        work through the real one. Wrappers are rebuilt over the real ones at the open
        (`on_open`), so only references taken before it keep this extra call."""
        def enter(op: int) -> _Slot | None:
            return self._enter(op) if self._open_late() else None

        def count(st: _Slot, op: int) -> None:
            self._count(st, op)

        def enter_wait(op: int) -> int:
            return self.enter_wait(op) if self._open_late() else 0

        def exit_wait(started: int, op: int) -> None:
            if started:
                self.exit_wait(started, op)

        def collective(op: int, out: Any) -> None:
            if self._open_late():
                self.collective(op, out)

        def step() -> None:
            if self._open_late():
                self.step()

        self.enter_wait, self.exit_wait, self._enter, self._count = enter_wait, exit_wait, \
            enter, count
        self.collective, self.step = collective, step

    # -- the user's API (cold) -------------------------------------------------

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """Declared idle (e.g. waiting for requests): never judged a stall."""
        self._set_idle(1)
        try:
            yield
        finally:
            self._set_idle(-1)

    @contextlib.contextmanager
    def expect(self, seconds: float, reason: str = "") -> Iterator[None]:
        """This stretch may take up to `seconds`: waits inside get that deadline."""
        seconds = float(seconds)
        if not 0 <= seconds < float("inf"):  # NaN and inf too: never `Infinity` in JSON
            raise ValueError(f"expect() needs finite seconds >= 0, got {seconds}")
        self._cold_update(lambda now: self._expects.append((seconds, now, reason)))
        try:
            yield
        finally:
            self._cold_update(lambda now: self._expects.pop() if self._expects else None)

    def _set_idle(self, delta: int) -> None:
        def change(now: int) -> None:
            was, self._idle_depth = self._idle_depth, max(0, self._idle_depth + delta)
            if not was and self._idle_depth:
                self._idle_since = now
            elif was and not self._idle_depth:
                self._idle_since, self._idle_ended = 0, now

        self._cold_update(change)

    def _cold_update(self, change: Callable[[int], object]) -> None:
        """Apply a change to the idle depth or the expect stack, and publish both."""
        try:
            with self._cold:
                now = self._clock()
                change(now)
                self._stretch[0] = self._idle_depth + len(self._expects)
                writer = self._writer
                if writer is None:
                    if self._opener is not None:
                        self._open_late()  # publishes the change once open
                    return
                seconds, since, reason = self._expects[-1] if self._expects else (0.0, 0, "")
                writer.begin()
                try:
                    writer.write_idle(self._idle_since, self._idle_ended)
                    writer.write_expect(seconds, since, reason)
                finally:
                    writer.end()
        except Exception as err:  # noqa: BLE001
            self._fail(err)

    # -- identity and lifetime -----------------------------------------------

    def set_group(self, rank: int, world_size: int, backend: str | None) -> None:
        if self._writer is None and self._opener is not None:
            self._open_late()
        try:
            with self._cold:
                writer = self._writer
                if writer is not None:
                    writer.set_identity(rank=rank, world_size=world_size, backend=backend)
        except Exception as err:  # noqa: BLE001
            self._fail(err)

    def _retire(self) -> None:
        """Point every slot at scratch memory: later hot-path stores go nowhere."""
        for slot in self._slots:
            slot.w = self._scratch

    def _fail(self, err: BaseException) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return  # closed already (uninstall, another thread's failure): nothing to say
        self._retire()
        _warn(f"record disabled after an error ({err!r}); the rank runs on uninstrumented")
        with contextlib.suppress(Exception):
            # Not STATUS_ERROR: the rank runs on; its frozen words must not
            # be judged, nor its later exit taken for a crash.
            writer.close(record.STATUS_ABANDONED, remove=False)

    def close(self, status: int = record.STATUS_CLOSED) -> None:
        """Mark the record closed; remove it unless the rank is ending on an error,
        whose record the daemon reports (and fences the job over)."""
        with self._cold:
            writer, self._writer = self._writer, None
            self._opener, self._closed = None, True
        self._retire()
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close(status, remove=status != record.STATUS_ERROR)

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's record is not ours to write or remove."""
        self._writer = self._opener = None
        self._retire()
        self._cold = threading.RLock()


# Record dtype code by hash(mx dtype) & 0xFF (MLX hashes a dtype to its own small number).
_DTYPE_CODES: list[int] = [0] * 256

_current: Heartbeat | None = None
_patches: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)
_dump_file: Any = None
_dump_signum = 0
_install_lock = threading.RLock()  # reentrant: a late open inside install() re-wraps
_open_lock = threading.Lock()


def _wrap_wait(hb: Heartbeat, original: Any, op: int, name: str = "") -> Any:
    enter, count = hb._enter, hb._count

    @functools.wraps(original)
    def wait(*args: Any, **kwargs: Any) -> Any:
        st = enter(op)
        try:
            return original(*args, **kwargs)
        finally:
            if st is not None:
                # The close, inlined: it comes before any call, so no signal can be
                # delivered between the end of the wait and its close.
                d = st.depth - 1
                if d < 1:
                    try:
                        st.w[S_SINCE] = 0
                    except Exception:  # noqa: BLE001, S110 - a closed record: nothing to close
                        pass
                    d = 0
                st.depth = d
                count(st, op)

    if name:
        # Stack dumps (faulthandler, py-spy) name a frame by its code object: with the
        # entry point's own name there, the evidence of a hang reads "in async_eval",
        # not "in wait". Costs nothing per call.
        func: Any = wait
        with contextlib.suppress(Exception):
            code = func.__code__.replace(co_name=name)
            if hasattr(code, "co_qualname"):
                code = code.replace(co_qualname=name)
            func.__code__ = code
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
    wait = _wrap_wait(hb, original, INIT_OP)

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        group = wait(*args, **kwargs)
        try:
            backend = kwargs.get("backend", args[1] if len(args) > 1 else "any")
            if backend == "any":
                backend = _guess_backend(os.environ) if group.size() > 1 else "single"
            hb.set_group(group.rank(), group.size(), str(backend))
        except Exception as err:  # noqa: BLE001
            _warn(f"could not read the group ({err!r})")
        return group

    return init


def _patch(owner: Any, name: str, wrapper: Any) -> None:
    original = getattr(owner, name)
    setattr(owner, name, wrapper)
    _patches.append((owner, name, original, wrapper))


def _instrument(hb: Heartbeat, mx: Any) -> None:
    for name in record.DTYPES[1:]:
        dtype = getattr(mx, name, None) or getattr(mx, name + "_", None)
        if dtype is not None:
            # MLX hashes a dtype to its own number: one int lookup on the hot path
            # instead of hashing and comparing dtype objects (several times slower).
            _DTYPE_CODES[hash(dtype) & 0xFF] = record.DTYPE_CODE[name]
    for name, where in WAITS.items():
        owner = mx if where == "core" else mx.array
        original = getattr(owner, name, None)
        if original is None:  # an older or newer mlx without this entry point
            continue
        _patch(owner, name, _wrap_wait(hb, original, OP_CODE[name.strip("_")], name))
    dist = mx.distributed
    for name in COLLECTIVES:
        if hasattr(dist, name):
            _patch(dist, name, _wrap_collective(hb, getattr(dist, name), OP_CODE[name]))
    _patch(dist, "init", _wrap_init(hb, dist.init))


def _open_record(path: str, job: str, dump_signal: int) -> RecordWriter:
    import psutil

    me = psutil.Process()
    rank, size = _env_rank_size(os.environ)
    fields: dict[str, Any] = dict(
        pid=me.pid, start_time=me.create_time(), uid=os.getuid(), host=socket.gethostname(),
        job=job, rank=rank, world_size=size, backend=_guess_backend(os.environ),
        dump_signal=dump_signal, start_ticks=_start_ticks())
    try:
        return RecordWriter(path, **fields)
    except FileExistsError:  # a staging file left by an earlier process with our pid
        os.unlink(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.new"))
        return RecordWriter(path, **fields)


def _start_ticks() -> int:
    """This process's start in clock ticks since boot (Linux), 0 when unknown:
    the daemon's identity check that a wall-clock step does not move."""
    try:
        with open("/proc/self/stat") as f:
            stat_line = f.read()
        return int(stat_line[stat_line.rindex(")") + 2:].split()[19])
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
        if not any(_taken(p) for p in (base + record.SUFFIX, base + ".stacks",
                                       os.path.join(directory, f".{name}{record.SUFFIX}.new"))):
            return base
    return base  # a random name taken already: the open reports what is wrong


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


def install(directory: str | None = None, job: str | None = None, *,
            lazy: bool = False) -> Heartbeat:
    """Instrument mlx and open this process's record. Idempotent; never raises.

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
                raise OSError(f"record directory {directory} does not exist")
            job = job or job_id()
            try:
                if lazy:
                    hb = Heartbeat(None, opener=functools.partial(_open_now, directory, job),
                                   on_open=functools.partial(_rewrap, mx))
                else:
                    hb = Heartbeat(_open_now(directory, job))
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


def _open_now(directory: str, job: str) -> RecordWriter:
    """The stack-dump handler and the record of this process, or neither."""
    if not os.path.isdir(directory):
        raise OSError(f"record directory {directory} does not exist")
    base = _free_base(directory)
    signum = _register_dump(dump_signal_from_env(), base + ".stacks")
    try:
        return _open_record(base + record.SUFFIX, job, signum)
    except BaseException:
        _close_dump()
        raise


def _rewrap(mx: Any, hb: Heartbeat) -> None:
    """After a late open: wrap MLX again over the real hot path (the opening
    functions' extra call is then gone for every caller that looks MLX up anew)."""
    with _install_lock:
        if _current is not hb:
            return
        try:
            _restore()
            _instrument(hb, mx)
        except Exception as err:  # noqa: BLE001 - never into the user's program
            _warn(f"could not re-wrap MLX after opening the record ({err!r})")


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
