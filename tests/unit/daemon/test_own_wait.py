"""A rank in a wait of its own holds the ranks that wait for it (issue 27): the detector
sees the wait and the bytes it moves, `hold_reason` holds the job, bounded.

Pure: records and process samples built here, monotonic times on an absurd origin."""

from __future__ import annotations

import dataclasses

import pytest

from watchdog.daemon.act.incidents import waited_for
from watchdog.daemon.holds import hold_reason
from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.judge.detector import NS, Detector, Verdict
from watchdog.daemon.judge.ownwait import MAX_IO_HOLD, OwnWait, size_text
from watchdog.daemon.lifecycle import Rank
from watchdog.daemon.probes import ProcessSample
from watchdog.daemon.probes.linux import io_bytes, read_io
from watchdog.daemon.probes.macos import DISKIO_OFFSET, RUSAGE_V2_SIZE, rusage_io
from watchdog.record import Collective, Record
from watchdog.states import Phase, State

ORIGIN = 7_000_000_000_000_000_000
PID = 4242
RULES = Rules(auto_floor=60.0, blocked_deadline=900.0, confirm=2)

SAVING = Record(  # rank 0 of an mlx-lm training job, saving after collective #40
    pid=PID, start_time=1.7e9, uid=501, rank=0, world_size=2, dump_signal=0, status=0,
    host="node-a", job="job-1", backend="ring", seq=2, collectives=40, waits_entered=90,
    waits_completed=89, steps=0, phase=Phase.WAIT, op="save_safetensors",
    phase_since_ns=ORIGIN, wait_since_ns=ORIGIN, last_progress_ns=ORIGIN - NS // 10,
    last_wait_ns=0, max_wait_ns=0, expect_seconds=0.0, expect_since_ns=0, expect_reason="",
    flight=(Collective(40, "all_sum", "float32", 4096, ORIGIN - NS),),
)


def sample(io: tuple[int, int] | None, cpu: float = 0.0) -> ProcessSample:
    return ProcessSample(PID, 1.7e9, 501, "sleeping", ((PID, cpu),), ((PID, 0.0),), PID, True,
                         io=io)


def watch(record: Record, ios: list[tuple[int, int] | None], every: float = 1.0) -> Verdict:
    """The verdict after one scan per entry of `ios` (the process's counters then)."""
    detector = Detector(Rules(deadline=None, auto_fallback=600.0))
    found = None
    for n, io in enumerate(ios):
        found = detector.observe(record, sample(io), ORIGIN + int(n * every * NS))
    assert found is not None
    return found


def test_a_save_is_a_wait_of_its_own_with_the_bytes_it_moved():
    v = watch(SAVING, [(100, 5000), (100, 7000), (100, 9048)])
    assert v.own is not None and v.collectives == 40
    assert (v.own.op, v.own.written, v.own.read) == ("save_safetensors", 4048, 0)
    assert v.own.quiet == 0.0 and v.own.seconds == 2.0
    assert v.own.moving(60.0)
    assert v.own.holds(60.0) == "writing a checkpoint (save_safetensors, 2 s, 4.0 kB written)"


def test_a_wait_with_its_own_collective_outstanding_is_not_its_own():
    """Rank 1 issued #41 and waits in the eval that runs it: that is the peers' wait."""
    waiting = dataclasses.replace(SAVING, op="eval", collectives=41, flight=(
        *SAVING.flight, Collective(41, "all_sum", "float32", 4096, ORIGIN + 1)))
    assert watch(waiting, [(0, 0), (0, 0)]).own is None


def test_silence_counts_from_when_the_bytes_last_moved():
    ios: list[tuple[int, int] | None] = [(0, 0), (0, 4096)] + [(0, 4096)] * 70
    v = watch(SAVING, ios)
    assert v.own is not None and v.own.quiet == pytest.approx(70.0)
    assert v.own.stuck(60.0) and v.own.holds(60.0) == ""


def test_on_a_mac_a_save_to_a_fifo_or_a_network_mount_moves_its_files_offset():
    """macOS's disk counters see no byte written to a FIFO or a network mount: the open
    files' offsets do, and a save whose offsets move is not silent; one whose offsets
    stand still is."""
    detector = Detector(Rules(deadline=None, auto_fallback=600.0))
    for n in range(70):
        found = detector.observe(SAVING, dataclasses.replace(sample((0, 0)), offsets=256 * n),
                                 ORIGIN + n * NS)
    assert found.own is not None and found.own.quiet == 0.0 and not found.own.stuck(60.0)
    detector = Detector(Rules(deadline=None, auto_fallback=600.0))
    for n in range(70):
        found = detector.observe(SAVING, dataclasses.replace(sample((0, 0)), offsets=256),
                                 ORIGIN + n * NS)
    assert found.own is not None and found.own.stuck(60.0)


def test_a_save_past_its_own_deadline_still_moving_bytes_is_not_due():
    """However long a checkpoint that writes takes, the saving rank is never due."""
    detector = Detector(Rules(deadline=30.0, blocked_deadline=60.0, confirm=1))
    written = 0
    for t in range(100):
        written += 1000
        v = detector.observe(SAVING, sample((0, written)), ORIGIN + t * NS)
    assert v.state == State.SUSPECT and not v.act, v
    assert "bytes moving" in v.reason
    quiet = None
    for t in range(100, 200):  # the storage stops answering
        quiet = detector.observe(SAVING, sample((0, written)), ORIGIN + t * NS)
    assert quiet is not None and quiet.act and quiet.state == State.BLOCKED


@pytest.mark.parametrize(("own", "held"), [
    (OwnWait("save_safetensors", 95.0, 600.0, 0, 40_000_000, 1.0), True),
    (OwnWait("save_safetensors", 30.0, 600.0, 0, 0, 30.0), True),  # not yet silent 60 s
    (OwnWait("save_safetensors", 61.0, 600.0, 0, 0, 61.0), False),  # never answered
    (OwnWait("save_safetensors", 200.0, 600.0, 0, 40_000, 61.0), False),  # stopped moving
    (OwnWait("save_safetensors", 700.0, 600.0, 0, 9_000_000, 0.5), True),  # past its deadline
    (OwnWait("save_safetensors", MAX_IO_HOLD, 600.0, 0, 9_000_000, 0.5), False),  # the cap
    (OwnWait("load", 90.0, 600.0, 5_000_000, 0, 2.0), True),
    (OwnWait("eval", 90.0, 600.0, 0, 0, 90.0), True),  # quiet, but within its own deadline
    (OwnWait("eval", 90.0, 60.0, 0, 0, 0.5), False),  # past its own deadline
    (OwnWait("save_safetensors", 90.0, 600.0, None, None, None), True),  # no counters
    (OwnWait("save_safetensors", 601.0, 600.0, None, None, None), False),
])
def test_what_an_own_wait_holds(own: OwnWait, held: bool) -> None:
    assert bool(own.holds(60.0)) is held


def due(in_wait: float = 62.0, collectives: int = 41) -> Verdict:
    return Verdict(State.STALLED, 60.0, in_wait, in_wait, 1.0, True, "in eval", False,
                   collectives)


def mate(own: OwnWait | None, collectives: int = 40, state: State = State.RUNNING) -> Verdict:
    return Verdict(state, 600.0, own.seconds if own else 0.0, 70.0, 0.0, False, "in a save",
                   False, collectives, own)


WRITING = OwnWait("save_safetensors", 95.0, 600.0, 0, 40_000_000, 1.0)


@pytest.mark.parametrize(("job", "in_wait", "expect"), [
    pytest.param([(0, mate(WRITING)), (1, due())], 62.0,
                 "held: rank 0 is writing a checkpoint (save_safetensors, 95 s, 40 MB written)",
                 id="the issue's example"),
    pytest.param([(0, mate(WRITING, collectives=42)), (1, due())], 62.0, "",
                 id="a rank ahead is not waited for"),
    pytest.param([(0, mate(dataclasses.replace(WRITING, written=0, quiet=20.0),
                           collectives=41)), (1, due())], 62.0,
                 "held: rank 0 is writing a checkpoint (save_safetensors, 95 s, 0 B written)",
                 id="counts tie (a compiled step's collectives count once): not ahead"),
    pytest.param([(0, mate(OwnWait("eval", 95.0, 600.0, 0, 0, 95.0, spinning=True))),
                  (1, due())], 62.0, "", id="a rank spinning in its wait waits on a peer"),
    pytest.param([(0, mate(WRITING, state=State.STOPPED)), (1, due())], 62.0, "",
                 id="a stopped rank holds nothing"),
    pytest.param([(0, mate(OwnWait("save_safetensors", 70.0, 600.0, 0, 0, 70.0))), (1, due())],
                 72.0, "", id="storage that never answers holds nothing"),
    pytest.param([(0, mate(WRITING)), (1, due())], 1000.0,
                 "held: rank 0 is writing a checkpoint (save_safetensors, 95 s, 40 MB written)",
                 id="bytes moving hold past the blocked deadline"),
    pytest.param([(0, mate(OwnWait("eval", 95.0, 600.0, 0, 0, 95.0))), (1, due())], 62.0,
                 "held: rank 0 is in a wait of its own (eval, 95 s, within its 600 s deadline)",
                 id="a quiet wait of its own within its deadline"),
    pytest.param([(0, mate(OwnWait("eval", 95.0, 600.0, 0, 0, 95.0))), (1, due())], 900.0, "",
                 id="a quiet hold ends at the blocked deadline"),
])
def test_hold_reason_for_a_rank_in_a_wait_of_its_own(job, in_wait, expect):
    assert hold_reason(due(in_wait), job, RULES, rank=1) == expect


def test_the_incident_names_the_rank_the_others_wait_for():
    stuck = OwnWait("save_safetensors", 63.0, 600.0, 0, 0, 63.0)
    saving = Rank("0.rec", SAVING, verdict=mate(stuck))
    behind = dataclasses.replace(SAVING, pid=PID + 1, rank=1, collectives=41, op="eval")
    waiting = Rank("1.rec", behind, verdict=due())
    found = waited_for([waiting], [saving, waiting])
    assert found is not None and found[0] is saving
    assert found[1] == ("in save_safetensors of its own for 63s, no byte moved, while its "
                        "peers wait on it")
    assert waited_for([waiting], [waiting]) is None


def test_io_counters_are_parsed_on_each_platform(tmp_path):
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "io").write_text("rchar: 6976\nwchar: 1234\nsyscr: 10\nsyscw: 2\n"
                                        "read_bytes: 0\nwrite_bytes: 4096\n")
    assert read_io(77, str(tmp_path)) == (6976, 1234)
    assert read_io(78, str(tmp_path)) is None  # gone, or not ours to read
    assert io_bytes("rchar: 1\nwchar: 2\n") == (1, 2)
    buffer = bytearray(RUSAGE_V2_SIZE)
    buffer[DISKIO_OFFSET:DISKIO_OFFSET + 16] = (5000).to_bytes(8, "little") + \
        (40_000_000).to_bytes(8, "little")
    assert rusage_io(bytes(buffer)) == (5000, 40_000_000)
    with pytest.raises(ValueError):
        rusage_io(b"short")


def test_sizes_read_as_people_write_them():
    assert [size_text(n) for n in (0, 812, 4048, 40_000_000, 1_100_000, 140_000_000_000)] == \
        ["0 B", "812 B", "4.0 kB", "40 MB", "1.1 MB", "140 GB"]


def test_a_checkpoint_hold_is_logged_once_per_hold_not_at_every_scan(caplog):
    """Issue 37, item 9: the hold's note carries seconds and bytes, which change at
    every scan; 15 held jobs logged 15 lines a second. One line per hold, or per change
    of what holds it."""
    import dataclasses
    import logging

    from watchdog.daemon.holds import hold
    from watchdog.daemon.judge.deadlines import Rules
    from watchdog.daemon.lifecycle import Edge, Rank, transition
    from watchdog.record import Record

    def rec(n: int) -> Record:
        return Record(pid=10 + n, start_time=1.7e9, uid=501, rank=n, world_size=2,
                      dump_signal=0, status=0, host="h", job="j", backend="ring", seq=0,
                      collectives=40 + n, waits_entered=0, waits_completed=0, steps=0,
                      phase=Phase.WAIT, op="eval", phase_since_ns=0, wait_since_ns=0,
                      last_progress_ns=0, last_wait_ns=0, max_wait_ns=0, expect_seconds=0.0,
                      expect_since_ns=0, expect_reason="", flight=())

    writer, waiter = Rank("/d/10.rec", rec(0)), Rank("/d/11.rec", rec(1))
    caplog.set_level(logging.INFO, logger="watchdog.daemon.holds")
    for scan in range(10):  # every scan: more seconds, more bytes
        own = dataclasses.replace(WRITING, seconds=95.0 + scan, written=(40 + scan) << 20)
        transition(writer, Edge.JUDGED, float(scan), verdict=mate(own))
        transition(waiter, Edge.JUDGED, float(scan), verdict=due(62.0 + scan))
        assert hold({(501, "j"): [waiter]}, [writer, waiter], Rules(), float(scan)) == {}
    lines = [r.getMessage() for r in caplog.records if "held: rank 0" in r.getMessage()]
    assert len(lines) == 1 and "writing a checkpoint" in lines[0], lines
    # What holds it changes (a load now): logged again, once.
    for scan in range(10, 13):
        own = OwnWait("load", 5.0 + scan, 600.0, scan << 20, 0, 1.0)
        transition(writer, Edge.JUDGED, float(scan), verdict=mate(own))
        transition(waiter, Edge.JUDGED, float(scan), verdict=due(62.0 + scan))
        hold({(501, "j"): [waiter]}, [writer, waiter], Rules(), float(scan))
    lines = [r.getMessage() for r in caplog.records if "held: rank 0" in r.getMessage()]
    assert len(lines) == 2 and "loading" in lines[1], lines
