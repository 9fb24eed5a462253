"""The compiled hot path (watchdog/rank/_fastpath.c) against the pure-Python one.

The compiled path must write the same bytes as `hotpath.real()` for any sequence
of calls: both run here side by side over two records with the same test clock,
driven by hypothesis, and their thread slots are compared byte for byte. The
rest of the hook's tests run over both paths (the `hotpath` fixture).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import watchdog
from watchdog import record
from watchdog.rank import compiled, patches
from watchdog.rank.heartbeat import Heartbeat
from watchdog.record import RecordWriter, layout

EVAL, ITEM, INIT = record.OP_CODE["eval"], record.OP_CODE["item"], record.OP_CODE["init"]
SUM, GATHER = record.OP_CODE["all_sum"], record.OP_CODE["all_gather"]
patches.learn_dtypes(mx)
ARRAYS = [mx.zeros(n, dtype=d) for n in (1, 16, 1000)
          for d in (mx.float32, mx.float16, mx.int32, mx.bfloat16, mx.uint8)]


class Clock:
    """A test clock both paths read: the same sequence of values for each."""

    def __init__(self) -> None:
        self.now = 1_000_000_007

    def __call__(self) -> int:
        self.now += 997
        return self.now


def writer_at(path: Path) -> RecordWriter:
    return RecordWriter(str(path), pid=os.getpid(), start_time=1.0, uid=os.getuid(),
                        host="h", job="j", rank=0, world_size=1, backend="ring",
                        dump_signal=0)


def slots(writer: RecordWriter) -> bytes:
    """The thread slots' bytes, but for each slot's owner (the thread's native id, which
    differs between the two runs and is written by the same Python code in both)."""
    with open(writer.path, "rb") as f:
        data = bytearray(f.read())
    for k in range(layout.THREAD_SLOTS):
        at = 8 * (layout.slot_base(k) + layout.S_OWNER)
        data[at:at + 8] = bytes(8)
    return bytes(data[layout.SLOTS_OFFSET:
                      layout.SLOTS_OFFSET + layout.THREAD_SLOTS * layout.SLOT_SIZE])


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Heartbeat]]:
    """A Heartbeat on each path, each over its own record, each with its own Clock."""
    beats = []
    for which in ("python", "compiled"):
        monkeypatch.setenv(compiled.ENV, which)
        beats.append(Heartbeat(writer_at(tmp_path / f"{which}.rec"), clock=Clock()))
    monkeypatch.delenv(compiled.ENV)
    python, fast = beats
    assert not python.compiled and fast.compiled, fast.hotpath
    yield beats
    for beat in beats:
        beat.close()


# One step of a script: what a rank's threads do to the hook.
STEPS = st.one_of(
    st.tuples(st.just("enter"), st.sampled_from([EVAL, ITEM, INIT])),
    st.tuples(st.just("exit"), st.sampled_from([EVAL, ITEM, INIT])),
    st.tuples(st.just("collective"), st.sampled_from([SUM, GATHER]),
              st.integers(0, len(ARRAYS) - 1)),
    st.tuples(st.just("step")),
    st.tuples(st.just("idle")),
    st.tuples(st.just("wrapped"), st.sampled_from([EVAL, ITEM])),
    st.tuples(st.just("thread"), st.integers(1, 4)),
)


def waits(beat: Heartbeat, n: int) -> None:
    for _ in range(n):
        beat.exit_wait(beat.enter_wait(EVAL), EVAL)


def play(beat: Heartbeat, script: list[tuple[object, ...]]) -> None:
    """Run `script` on `beat`: enters stack up and exits pop them, as wrappers do."""
    started: list[tuple[int, int]] = []
    for step in script:
        kind = step[0]
        if kind == "enter":
            started.append((beat.enter_wait(int(step[1])), int(step[1])))  # type: ignore[arg-type]
        elif kind == "exit" and started:
            beat.exit_wait(*started.pop())
        elif kind == "collective":
            beat.collective(int(step[1]), ARRAYS[int(step[2])])  # type: ignore[arg-type]
        elif kind == "step":
            beat.step()
        elif kind == "idle":
            with beat.idle():
                beat.exit_wait(beat.enter_wait(EVAL), EVAL)
        elif kind == "wrapped":
            assert beat._wait(lambda x: x * 2, int(step[1]), (21,), {}) == 42  # type: ignore[arg-type]
        elif kind == "thread":
            # Another thread does a few calls in its own slot, then ends (its slot goes
            # back, and the next thread takes it).
            thread = threading.Thread(target=waits, args=(beat, int(step[1])))  # type: ignore[arg-type]
            thread.start()
            thread.join()
    while started:
        beat.exit_wait(*started.pop())


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.slow
@given(script=st.lists(STEPS, max_size=120))
def test_both_paths_write_the_same_bytes(pair: list[Heartbeat], script: list[tuple[object, ...]]
                                         ) -> None:
    python, fast = pair
    before = [slots(b._writer) for b in pair]  # type: ignore[arg-type]
    for beat in pair:
        play(beat, script)
    after = [slots(b._writer) for b in pair]  # type: ignore[arg-type]
    assert after[0] == after[1], "the compiled path wrote other bytes than the Python one"
    if script and before[0] != after[0]:
        assert before[1] != after[1]
    assert python._threads.totals() == fast._threads.totals()
    assert python._clock.now == fast._clock.now  # type: ignore[attr-defined]


def test_the_same_bytes_include_a_full_flight_ring_and_nested_waits(pair: list[Heartbeat]
                                                                   ) -> None:
    script: list[tuple[object, ...]] = [("enter", EVAL), ("enter", ITEM)]
    script += [("collective", SUM, i % len(ARRAYS)) for i in range(3 * layout.RING + 5)]
    script += [("exit", 0), ("step",), ("exit", 0), ("wrapped", ITEM), ("thread", 3)]
    for beat in pair:
        play(beat, script)
    python, fast = (slots(b._writer) for b in pair)  # type: ignore[arg-type]
    assert python == fast
    rec = record.read_path(pair[1].path)  # type: ignore[arg-type]
    assert rec.collectives == 3 * layout.RING + 5 and rec.waits_completed == 2 + 1 + 3
    assert [c.dtype for c in rec.flight[-2:]] == [
        record.DTYPES[record.DTYPE_CODE[str(a.dtype).split(".")[-1]]]
        for a in (ARRAYS[(3 * layout.RING + 3) % len(ARRAYS)],
                  ARRAYS[(3 * layout.RING + 4) % len(ARRAYS)])]


def test_the_compiled_bracket_passes_the_result_and_the_error_through(pair: list[Heartbeat]
                                                                      ) -> None:
    fast = pair[1]

    def boom(x: int, *, by: int) -> int:
        raise ValueError(f"boom {x} {by}")

    assert fast._wait(lambda x, *, by: x * by, EVAL, (6,), {"by": 7}) == 42
    with pytest.raises(ValueError, match="boom 1 2"):
        fast._wait(boom, EVAL, (1,), {"by": 2})
    rec = record.read_path(fast.path)  # type: ignore[arg-type]
    assert rec.waits_completed == 2 and rec.waiting_threads == 0


def test_an_interrupt_in_the_clock_passes_through_both_paths(pair: list[Heartbeat]) -> None:
    # KeyboardInterrupt is the user's (Ctrl-C), never swallowed as a hook error; the
    # record stays open and no wait is left open.
    def interrupted() -> int:
        raise KeyboardInterrupt

    for beat in pair:
        beat._clock = interrupted  # type: ignore[method-assign]
        beat._build()
        with pytest.raises(KeyboardInterrupt):
            beat.enter_wait(EVAL)
        with pytest.raises(KeyboardInterrupt):
            beat._wait(lambda: 1, EVAL, (), {})
        assert beat.active and record.read_path(beat.path).waiting_threads == 0  # type: ignore[arg-type]


def test_the_choice_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    fast, why = compiled.choice({})
    assert fast is not None and why.startswith("compiled"), why  # CI builds it
    assert compiled.choice({compiled.ENV: "python"}) == (
        None, "pure Python (MLX_WATCHDOG_HOTPATH=python)")
    fast, why = compiled.choice({compiled.ENV: "fastest"})
    assert fast is None and "'fastest' is not one of auto, compiled, python" in why
    monkeypatch.setattr(compiled, "_loaded", (None, "not built (no module)"))
    assert compiled.choice({compiled.ENV: "compiled"}) == (
        None, "pure Python (the compiled one is not built (no module))")


def test_a_rank_runs_the_compiled_path_by_default_and_python_on_request(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.ENV, raising=False)
    for env, expect in ((None, True), ("python", False)):
        if env:
            monkeypatch.setenv(compiled.ENV, env)
        beat = watchdog.install(str(record_dir))
        try:
            assert beat.compiled is expect, beat.hotpath
            mx.eval(mx.distributed.all_sum(mx.ones(4)))
            rec = record.read_path(beat.path)  # type: ignore[arg-type]
            assert (rec.collectives, rec.waits_completed) == (1, 1)
            assert rec.flight[-1].dtype == "float32" and rec.flight[-1].nbytes == 16
        finally:
            watchdog.uninstall()


def test_a_compiled_path_that_will_not_start_leaves_the_python_one(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    monkeypatch.delenv(compiled.ENV, raising=False)
    refused = {k: v for k, v in compiled.LAYOUT.items() if k != "init_op"}  # a name missing
    monkeypatch.setattr(compiled, "LAYOUT", refused)
    beat = watchdog.install(str(record_dir))
    try:
        assert not beat.compiled and "would not start" in beat.hotpath
        assert (mx.arange(3) * 2).tolist() == [0, 2, 4]
        assert record.read_path(beat.path).waits_completed == 1  # type: ignore[arg-type]
    finally:
        watchdog.uninstall()
    assert "the compiled hot path would not start" in capsys.readouterr().err


@pytest.mark.parametrize("change, error", [
    ({"init_op": None}, "layout: no init_op"),  # None: the name left out
    ({"spare": 1}, "layout: unknown name 'spare'"),
    ({"ring": "65"}, "integer"),
])
def test_the_compiled_path_takes_its_layout_by_name_and_refuses_any_other(
        change: dict[str, object], error: str) -> None:
    fast, _ = compiled.choice({})
    assert fast is not None, "the compiled hot path is built in place for the tests"
    given = {**compiled.LAYOUT, **change}
    given = {k: v for k, v in given.items() if v is not None}
    words = memoryview(bytearray(record.RECORD_SIZE)).cast("Q")
    with pytest.raises((ValueError, TypeError), match=error):
        fast.Path(words, (layout.slot_base(0),), given, lambda: 0, lambda err: None, [0],
                  [0] * 256)
    fast.Path(words, (layout.slot_base(0),), dict(reversed(compiled.LAYOUT.items())),
              lambda: 0, lambda err: None, [0], [0] * 256)  # any order: names, not places


def test_doctor_says_which_hot_path_ranks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from watchdog.cli.node.doctor_env import OK, WARN, check_instrumentation

    def hot_path_line() -> tuple[str, str]:
        return next(line for line in check_instrumentation() if "hot path" in line[1])

    monkeypatch.delenv(compiled.ENV, raising=False)
    assert hot_path_line() == (OK, "hook hot path: compiled (watchdog/rank/_fastpath.c)")
    monkeypatch.setenv(compiled.ENV, "python")
    assert hot_path_line() == (OK, "hook hot path: pure Python (MLX_WATCHDOG_HOTPATH=python)")
    monkeypatch.setenv(compiled.ENV, "fastest")
    level, text = hot_path_line()
    assert level == WARN and "unset MLX_WATCHDOG_HOTPATH" in text
    monkeypatch.delenv(compiled.ENV)
    monkeypatch.setattr(compiled, "_loaded", (None, "not built (no module)"))
    level, text = hot_path_line()
    assert level == WARN and "not built" in text and "xcode-select --install" in text


# -- the C file's edges: slots given back, interrupts, wrong calls, stale builds (both paths)


def slot_steps(beat: Heartbeat, k: int) -> int:
    assert beat._writer is not None
    return int(beat._writer.words[layout.slot_base(k) + layout.S_STEPS])


def in_thread(work: object) -> None:
    thread = threading.Thread(target=work)  # type: ignore[arg-type]
    thread.start()
    thread.join()


def test_a_thread_that_gave_its_slot_back_claims_anew(record_dir: Path, hotpath: str) -> None:
    # A foreign thread (a callback from a C++ pool) loses its Python thread state, and so
    # its slot, each time it leaves Python, but stays the same OS thread. Coming back it
    # must claim a slot anew, never write the one it gave back, which another thread
    # may hold by then.
    beat = watchdog.install(str(record_dir))
    try:
        assert beat.compiled == (hotpath == "compiled")
        came_back = threading.Event()
        gone, taken = threading.Event(), threading.Event()
        first: list[int] = []

        def foreign() -> None:
            beat.step()
            first.append(beat._threads.local.slot.k)
            beat._threads.local.__dict__.clear()  # what the end of its thread state does
            gone.set()
            assert taken.wait(10)
            beat.step()  # back in Python
            came_back.set()

        def other() -> None:
            assert gone.wait(10)
            beat.step()  # takes the slot given back
            assert beat._threads.local.slot.k == first[0]
            taken.set()
            assert came_back.wait(10)

        worker = threading.Thread(target=other)
        worker.start()
        in_thread(foreign)
        worker.join()
        k = first[0]
        assert slot_steps(beat, k) == 2  # one step of each thread that held it, no more
        assert beat.steps == 3
    finally:
        watchdog.uninstall()


def test_an_interrupt_inside_fail_reaches_the_user(pair: list[Heartbeat]) -> None:
    # fail() runs Python (it closes the record, it warns): a Ctrl-C handled inside it
    # is the user's, and must not be swallowed with the hook's own error.
    def broken_clock() -> int:
        raise OSError(5, "Input/output error")

    def interrupted_fail(err: BaseException) -> None:
        raise KeyboardInterrupt

    for beat in pair:
        beat._clock = broken_clock  # type: ignore[method-assign]
        beat._fail = interrupted_fail  # type: ignore[method-assign]
        beat._build()
        with pytest.raises(KeyboardInterrupt):
            beat.enter_wait(EVAL)


def test_a_wrong_call_raises_like_python_and_keeps_the_record(pair: list[Heartbeat]) -> None:
    class Op:  # an integer-like op, as numpy's integers are
        def __index__(self) -> int:
            return EVAL

    for beat in pair:
        with pytest.raises(TypeError):
            beat.step(1)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            beat.enter_wait()  # type: ignore[call-arg]
        beat.exit_wait(beat.enter_wait(Op()), Op())  # type: ignore[arg-type]
        assert beat.active and beat.waits_completed == 1


def test_a_retired_or_unbuilt_path_records_nothing_and_never_crashes(
        pair: list[Heartbeat]) -> None:
    from watchdog.rank import _fastpath  # type: ignore[attr-defined]

    fast = pair[1]
    path = fast._threads.cpath
    fast.close()  # retires the Path: it lets go of the map and of the Heartbeat
    assert path.wait(lambda x: x + 1, EVAL, (1,), {}) == 2
    assert path.enter_wait(EVAL) == 0
    path.exit_wait(5, EVAL)
    path.collective(SUM, ARRAYS[0])
    path.step()
    assert path.totals() == (0, 0, 0, 0)
    unbuilt = _fastpath.Path.__new__(_fastpath.Path)  # never initialized
    assert unbuilt.wait(lambda: 7, EVAL, (), {}) == 7
    assert unbuilt.enter_wait(EVAL) == 0
    unbuilt.step()
    unbuilt.collective(SUM, ARRAYS[0])
    unbuilt.retire()


def test_a_module_built_from_another_source_is_not_used(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    from watchdog.rank import _fastpath  # type: ignore[attr-defined]

    # The build (hatch_build.py) hashed the same sources in the same order as the check.
    sources = [Path(compiled.__file__).with_name(name) for name in compiled.SOURCES]
    assert _fastpath.SOURCE_SHA256 == hashlib.sha256(
        b"".join(source.read_bytes() for source in sources)).hexdigest()
    assert not compiled._stale(_fastpath)
    monkeypatch.setattr(_fastpath, "SOURCE_SHA256", "0" * 64)  # as if the file changed since
    monkeypatch.setattr(compiled, "_loaded", None)
    fast, why = compiled.choice({})
    assert fast is None and "stale" in why and "pip install -e ." in why
