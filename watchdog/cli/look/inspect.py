"""`mlx-watchdog inspect PID`: one rank's record and threads, in depth."""

from __future__ import annotations

import time
from dataclasses import dataclass

from watchdog.daemon.judge.detector import NS
from watchdog.daemon.judge.threads import busiest_ratio
from watchdog.daemon.observation import observe
from watchdog.daemon.probes import ProbeError, probe
from watchdog.daemon.view import current_op
from watchdog.record import Record
from watchdog.status import Encodable
from watchdog.text import printable


@dataclass(frozen=True, kw_only=True)
class ThreadCpu(Encodable):
    """A thread's share of a core over the look's pause."""

    id: int
    cpu_seconds: float
    cpu_ratio: float


@dataclass(frozen=True, kw_only=True)
class WaitCounts(Encodable):
    """A record's progress counters, as `inspect` shows them."""
    collectives: int
    waits_entered: int
    waits_completed: int
    steps: int


@dataclass(frozen=True, kw_only=True)
class ExpectLeft(Encodable):
    """The rank's `hb.expect` window, and what is left of it."""

    seconds: float
    reason: str
    seconds_left: float


@dataclass(frozen=True, kw_only=True)
class OpPace(Encodable):
    """An op's completed waits, which the auto deadline learns from."""

    waits: int
    longest_seconds: float


@dataclass(frozen=True, kw_only=True)
class FlightRow(Encodable):
    """One collective of a record's flight recorder, as `inspect` shows it."""
    number: int
    op: str
    dtype: str
    bytes: int
    seconds_ago: float


@dataclass(frozen=True, kw_only=True)
class Inspection(Encodable):
    """One rank in depth: `inspect --json` (its JSON, through the contract's codec)."""

    pid: int
    host: str
    job: str
    rank: int
    world_size: int
    backend: str
    uid: int
    phase: str
    seconds_in_phase: float
    current_op: str
    seconds_in_wait: float | None
    seconds_since_progress: float
    counters: WaitCounts
    last_wait_seconds: float
    longest_wait_seconds: float
    expect: ExpectLeft | None
    # Per op, the completed waits the auto deadline learns from (None: an older hook).
    pace: dict[str, OpPace] | None
    dump_signal: int
    threads: tuple[ThreadCpu, ...]
    flight_recorder: tuple[FlightRow, ...]


def _thread_cpu(rec: Record, pause: float = 0.5) -> list[ThreadCpu]:
    """Each thread's share of a core over `pause` seconds, busiest first."""
    p = probe()
    first = observe(rec, p).sample  # None: not the record's process (or not readable)
    if first is None:
        return []
    time.sleep(pause)
    try:
        second = p.sample(rec.pid)
    except ProbeError:
        return []
    if second is None:
        return []
    before = dict(first.threads)
    rows = [ThreadCpu(id=tid, cpu_seconds=round(cpu, 3),
                      cpu_ratio=round(busiest_ratio(before, {tid: cpu}, pause), 3))
            for tid, cpu in second.threads]
    return sorted(rows, key=lambda r: -r.cpu_ratio)


def describe(rec: Record) -> Inspection:
    now = time.monotonic_ns()
    return Inspection(
        pid=rec.pid, host=rec.host, job=rec.job, rank=rec.rank,
        world_size=rec.world_size, backend=rec.backend, uid=rec.uid,
        phase=rec.phase.label, seconds_in_phase=round((now - rec.phase_since_ns) / NS, 3),
        current_op=current_op(rec),
        seconds_in_wait=round((now - rec.wait_since_ns) / NS, 3) if rec.wait_since_ns else None,
        seconds_since_progress=round((now - rec.last_progress_ns) / NS, 3),
        counters=WaitCounts(collectives=rec.collectives, waits_entered=rec.waits_entered,
                            waits_completed=rec.waits_completed, steps=rec.steps),
        last_wait_seconds=rec.last_wait_ns / NS, longest_wait_seconds=rec.max_wait_ns / NS,
        expect=(ExpectLeft(seconds=rec.expect_seconds, reason=rec.expect_reason,
                           seconds_left=round(rec.expect_seconds
                                              - (now - rec.expect_since_ns) / NS, 3))
                if rec.expect_seconds > 0 else None),
        pace=({p.op: OpPace(waits=p.waits, longest_seconds=p.longest_ns / NS)
               for p in rec.pace} if rec.pace is not None else None),
        dump_signal=rec.dump_signal,
        threads=tuple(_thread_cpu(rec)),
        flight_recorder=tuple(FlightRow(number=c.number, op=c.op, dtype=c.dtype,
                                        bytes=c.nbytes,
                                        seconds_ago=round((now - c.issued_ns) / NS, 3))
                              for c in rec.flight))


def render_text(info: Inspection) -> str:
    c = info.counters
    lines = [
        f"pid {info.pid} on {info.host}: job {info.job} rank "
        f"{info.rank}/{info.world_size} ({info.backend or 'no backend yet'})",
        f"phase {info.phase} for {info.seconds_in_phase:.1f}s"
        + (f", waiting in {info.current_op} for {info.seconds_in_wait:.1f}s"
           if info.seconds_in_wait is not None else ""),
        f"progress {c.waits_completed} waits ({c.waits_entered} entered), "
        f"{c.collectives} collectives, {c.steps} steps; last progress "
        f"{info.seconds_since_progress:.1f}s ago; longest wait "
        f"{info.longest_wait_seconds:.3f}s",
    ]
    if info.expect:
        e = info.expect
        lines.append(f"expect window: {e.seconds:g}s ({e.reason}), "
                     f"{e.seconds_left:.1f}s left")
    if info.pace:
        lines.append("completed waits (the pace the auto deadline learns): " + ", ".join(
            f"{op} {p.waits} (longest {p.longest_seconds:.3f}s)"
            for op, p in sorted(info.pace.items())))
    lines.append("threads (busiest first):")
    for t in info.threads[:8]:
        lines.append(f"  {t.id:>8}  {t.cpu_ratio * 100:5.1f}% of a core  "
                     f"{t.cpu_seconds:.2f}s total")
    lines.append(f"flight recorder (last {min(16, len(info.flight_recorder))} of "
                 f"{len(info.flight_recorder)}):")
    for f in info.flight_recorder[-16:]:
        lines.append(f"  #{f.number:<8} {f.op:<12} {f.dtype:<9} {f.bytes:>10} B  "
                     f"{f.seconds_ago:.2f}s ago")
    return "\n".join(printable(line) for line in lines)  # record strings are untrusted
