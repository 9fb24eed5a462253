"""`mlx-watchdog inspect PID`: one rank's record and threads, in depth.

Which record is the process's is checked, not taken from its name: any user may
publish `<pid>-x.rec` naming another user's pid (issue 57, item 13). Only a record
whose identity is the live process's (pid, start time, every uid of the process equal
to the record's and its file's owner: the daemon's rule, `probes.same_process`) is
shown, and the view says which file it is and whose.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from watchdog.daemon.judge.detector import NS
from watchdog.daemon.judge.threads import busiest_ratio
from watchdog.daemon.observation import Presence, observe
from watchdog.daemon.probes import ProbeError, probe
from watchdog.daemon.recdir import read_record
from watchdog.daemon.view import current_op
from watchdog.record import SUFFIX, Record
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
    # The file shown, owned by `uid`, its identity checked against the live process.
    record_path: str
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


class NotThisProcess(Exception):
    """No record names the live process: why, in one line."""


def record_of(directory: str, pid: int) -> tuple[Record, str] | None:
    """The record of the live process `pid` and its path: `<pid>.rec`, or
    `<pid>-<suffix>.rec` where the hook published when another user's file held the
    plain name; only one whose identity is that process's (`observe`: its own, live or
    closed). None when no file names the pid; NotThisProcess when files name it but
    none is that process's (a stale or forged one), or the process cannot be read."""
    plain = os.path.join(directory, f"{pid}{SUFFIX}")
    try:
        names = sorted(n for n in os.listdir(directory)
                       if n.startswith(f"{pid}-") and n.endswith(SUFFIX))
    except OSError:
        names = []
    p = probe()
    found: list[tuple[Record, str]] = []
    claims: list[str] = []
    unusable = ""
    for path in [plain] + [os.path.join(directory, n) for n in names]:
        rec, why, _ = read_record(path)
        if rec is None or rec.pid != pid:
            if path == plain and why:
                unusable = f"{path}: {why}"
            continue
        seen = observe(rec, p).seen
        if seen in (Presence.LIVE, Presence.CLOSED):
            found.append((rec, path))
        elif seen is Presence.GONE:
            continue  # the pid runs no more: the caller says so
        elif seen is Presence.UNKNOWN:
            raise NotThisProcess(f"pid {pid} cannot be read to check that {path} is its "
                                 "record")
        else:
            claims.append(f"{path} (uid {rec.uid})")
    if found:
        return max(found, key=lambda f: (f[0].start_ticks, f[0].start_time))
    if claims:
        raise NotThisProcess(f"no record of pid {pid}'s process: {', '.join(claims[:3])} "
                             f"{'names' if len(claims) == 1 else 'name'} pid {pid} but "
                             "not this process (its start or owner differs: a stale or "
                             "forged record)")
    if unusable:
        raise NotThisProcess(f"no usable record for pid {pid}: {unusable}")
    return None


def describe(rec: Record, path: str = "") -> Inspection:
    """The record read as `inspect` shows it, its ages counted from now."""
    now = time.monotonic_ns()
    return Inspection(
        pid=rec.pid, host=rec.host, job=rec.job, rank=rec.rank,
        world_size=rec.world_size, backend=rec.backend, uid=rec.uid, record_path=path,
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


def _user(uid: int) -> str:
    """" (name)" of a uid, when it has one."""
    import pwd

    try:
        return f" ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, OverflowError):
        return ""


def render_text(info: Inspection) -> str:
    """`inspect`'s text: the rank's identity, phase, wait, counters and recent collectives."""
    c = info.counters
    lines = [
        f"pid {info.pid} on {info.host}: job {info.job} rank "
        f"{info.rank}/{info.world_size} ({info.backend or 'no backend yet'})",
        f"record {info.record_path or '?'} of uid {info.uid}{_user(info.uid)}: this "
        "process's (its pid, start and owner checked)",
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
