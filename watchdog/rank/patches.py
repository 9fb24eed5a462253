"""The wrappers around MLX: every blocking entry point a wait, every collective counted.

`instrument()` patches them in over a Heartbeat's hot path, `restore()` puts
every original back. The list of waits is the audit of mlx.core's bindings
(docs/coverage.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from typing import Any

from watchdog import backends, record
from watchdog.rank.env import env_rank_size, guess_backend, job_id
from watchdog.rank.env import warn as _warn
from watchdog.rank.heartbeat import Heartbeat
from watchdog.rank.hotpath import DTYPE_CODES, INIT_OP
from watchdog.record import OP_CODE

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
# Every backend's collectives; one backend's own are its `entry_points` in
# watchdog/backends.py, wrapped alike.
COLLECTIVES = ("all_sum", "all_gather", "all_max", "all_min", "sum_scatter", "send", "recv",
               "recv_like")

applied: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)


def wrap_wait(hb: Heartbeat, original: Any, op: int, name: str = "") -> Any:
    """One call of the hot path's `wait` brackets the whole call: it opens the wait,
    calls the original and closes the wait with no call in between (one C call on the
    compiled path), so no signal handler can run between the end and the close. This
    frame stays to carry the entry point's name into stack dumps."""
    bracket = hb._wait

    @functools.wraps(original)
    def wait(*args: Any, **kwargs: Any) -> Any:
        return bracket(original, op, args, kwargs)

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


def wrap_collective(hb: Heartbeat, original: Any, op: int) -> Any:
    """`original` wrapped to count each call as a collective issued (not a wait)."""
    issued = hb.collective

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        issued(op, out)
        return out

    return collective


INIT_YIELD = 0.02  # seconds the other threads get before MLX's init, once a process


def _let_queued_writes_out() -> None:
    """Give the process's other threads the GIL before MLX's init, which may keep it while
    it blocks connecting (ring's rank 0 in `accept()`): a thread with writes queued must
    get them out first. exo's runner reports `RunnerConnecting` through a
    multiprocessing.Queue, whose feeder thread writes the pipe, just before init; stuck
    in the process, the report never reaches exo and its peers wait for it for ever
    (docs/exo.md, "A ring that never connects")."""
    if threading.active_count() > 1:
        time.sleep(INIT_YIELD)


def _wrap_init(hb: Heartbeat, original: Any) -> Any:
    """The group forms here: the job, rank and size the launcher set (exo sets them in
    os.environ just before this call, in a file it deletes just after) are published
    before connecting, which can hang; the group's own rank and size correct them after."""
    wait = wrap_wait(hb, original, INIT_OP)

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        asked = kwargs.get("backend", args[1] if len(args) > 1 else "any")
        try:
            env = os.environ
            rank, size = env_rank_size(env)
            backend = guess_backend(env) if asked == "any" else str(asked)
            hb.set_group(rank, size, backend or None, job=hb.pinned_job or job_id(env))
        except Exception as err:  # noqa: BLE001
            _warn(f"could not read the launch's environment ({err!r})")
        _let_queued_writes_out()
        group = wait(*args, **kwargs)
        try:
            backend = asked
            if backend == "any":
                backend = guess_backend(os.environ) if group.size() > 1 else "single"
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
    applied.append((owner, name, original, wrapper))


def learn_dtypes(mx: Any) -> None:
    """Fill the hot path's table of record dtype codes from MLX's dtypes."""
    for name in record.DTYPES[1:]:
        dtype = getattr(mx, name, None) or getattr(mx, name + "_", None)
        if dtype is not None:
            # MLX hashes a dtype to its own number: one int lookup on the hot path
            # instead of hashing and comparing dtype objects (several times slower).
            DTYPE_CODES[hash(dtype) & 0xFF] = record.DTYPE_CODE[name]


def instrument(hb: Heartbeat, mx: Any) -> None:
    """Wrap every wait and collective of `mx` over `hb`'s hot path (hook.install)."""
    learn_dtypes(mx)
    for name, where in WAITS.items():
        owner = mx if where == "core" else mx.array
        original = getattr(owner, name, None)
        if original is None:  # an older or newer mlx without this entry point
            continue
        _patch(owner, name, wrap_wait(hb, original, OP_CODE[name.strip("_")], name))
    dist = mx.distributed
    for name in dict.fromkeys((*COLLECTIVES, *backends.entry_points())):
        if hasattr(dist, name):
            _patch(dist, name, wrap_collective(hb, getattr(dist, name), OP_CODE[name]))
    _patch(dist, "init", _wrap_init(hb, dist.init))
    _patch(threading.Thread, "start", _wrap_thread_start(hb, threading.Thread.start))
    hb.publish_threads()


def restore() -> None:
    """Put every original back, except one someone else re-patched since."""
    while applied:
        owner, name, original, wrapper = applied.pop()
        if getattr(owner, name, None) is wrapper:
            setattr(owner, name, original)
        else:
            _warn(f"{name} was re-patched by someone else; leaving it in place")
