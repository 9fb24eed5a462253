"""Which hot path a rank runs: the compiled one (`_fastpath.c`) or the pure-Python one.

The compiled path writes the same words in the same order as `hotpath.real()`
(tests/unit/rank/test_compiled.py runs both side by side and compares the bytes), at a
fraction of the cost. It is used when it was built at install time, its clock
agrees with `time.monotonic_ns` (the clock the daemon compares against) and
`MLX_WATCHDOG_HOTPATH` does not say `python`; `mlx-watchdog doctor` reports
the choice. Every other case runs the pure-Python path, which is always there.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from watchdog.rank.hotpath import DTYPE_CODES, INIT_OP, HotPath
from watchdog.record import layout

ENV = "MLX_WATCHDOG_HOTPATH"
CHOICES = ("auto", "compiled", "python")
# The words of a slot, by the names of the compiled Path's `Layout` fields: it takes
# exactly these names (a missing or unknown one is an error), so no order is matched
# by hand on either side.
LAYOUT = {"slot_words": layout.SLOT_WORDS, "since": layout.S_SINCE, "op": layout.S_OP,
          "completed": layout.S_COMPLETED, "progress": layout.S_PROGRESS,
          "last_wait": layout.S_LAST_WAIT, "max_wait": layout.S_MAX_WAIT,
          "steps": layout.S_STEPS, "collectives": layout.S_COLLECTIVES,
          "ring_at": layout.S_RING, "ring": layout.RING, "kind_shift": layout.KIND_SHIFT,
          "pace": layout.S_PACE, "pace_ops": layout.PACE_OPS, "init_op": INIT_OP}

# The compiled module's sources, in the order their bytes are hashed: hatch_build.py
# builds the sha256 of them into the module, and `_stale` compares it with theirs.
SOURCES = ("_fastpath.h", "_fastpath.c", "_fastpath_type.c")

_loaded: tuple[Any, str] | None = None


def _load() -> tuple[Any, str]:
    """The compiled module and "", or None and why not (checked once per process)."""
    global _loaded
    if _loaded is None:
        if not getattr(sys, "_is_gil_enabled", lambda: True)():
            # The compiled path relies on the GIL: a retire() never runs while another
            # thread is between its checks and its stores.
            _loaded = (None, "not used by a Python without the GIL")
            return _loaded
        try:
            from watchdog.rank import _fastpath as fast  # type: ignore[attr-defined]

            before, now, after = time.monotonic_ns(), fast.now(), time.monotonic_ns()
        except ImportError as err:
            _loaded = (None, f"not built ({err})")
        except Exception as err:  # noqa: BLE001 - a broken build never stops a rank
            _loaded = (None, f"broken ({err!r})")
        else:
            if not before <= now <= after:
                _loaded = (None, "its clock disagrees with time.monotonic_ns")
            elif _stale(fast):
                _loaded = (None, "stale: built from other versions of its C sources; "
                                 "rebuild it (pip install -e . in a checkout)")
            else:
                _loaded = (fast, "")
    return _loaded


def _stale(fast: Any) -> bool:
    """Was the module built from another version of its sources (when they are there
    to compare: a checkout, or a wheel, which ships them)?"""
    try:
        digest = source_digest(Path(__file__).parent)
    except OSError:
        return False
    return bool(getattr(fast, "SOURCE_SHA256", "")) and fast.SOURCE_SHA256 != digest


def source_digest(directory: Path) -> str:
    """The sha256 of the compiled module's SOURCES in `directory`, one after the other."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((directory / name).read_bytes())
    return digest.hexdigest()


def choice(env: Mapping[str, str] = os.environ) -> tuple[Any, str]:
    """(the compiled module, or None for pure Python; a line saying which and why)."""
    wanted = env.get(ENV, "auto").strip().lower() or "auto"
    if wanted not in CHOICES:
        return None, f"pure Python ({ENV}={wanted!r} is not one of {', '.join(CHOICES)})"
    if wanted == "python":
        return None, f"pure Python ({ENV}=python)"
    fast, why = _load()
    if fast is None:
        return None, f"pure Python (the compiled one is {why})"
    return fast, "compiled (watchdog/rank/_fastpath.c)"


def real(fast: Any, words: memoryview, claim: Callable[[], int],
         fail: Callable[[BaseException], None], stretch: list[int],
         clock: Callable[[], int]) -> tuple[HotPath, Any]:
    """The compiled hot path over a record's words; returns it and its Path (for
    `release`, `retire` and `totals`). A test clock is called from C; the real one is
    read in C."""
    path = fast.Path(words, tuple(layout.slot_base(k) for k in range(layout.THREAD_SLOTS)),
                     LAYOUT, claim, fail, stretch, DTYPE_CODES,
                     None if clock is time.monotonic_ns else clock)
    return HotPath(path.enter_wait, path.exit_wait, path.collective, path.step,
                   path.wait), path
