"""A bounded sampler of ranks' native stacks, and of their sockets' queues.

Asked by the loop only for the ranks of a job one of whose ranks has waited past its
wedge deadline (judge/wedge.py), or once a wait for a job whose sockets' byte counters
stood exactly still (daemon/early.py): a healthy job is never sampled. At
most one sample per rank every SAMPLE_EVERY seconds, one under way per rank and
MAX_RUNNING in all, on the daemon's workers, shared out between the ranks' owners
(`share`: another user's ranks cannot starve a job's wedge of its samples); each
time-boxed (SAMPLE_TIMEOUT), after the rank's identity (pid, start, every uid, dumpable) and
its state (not stopped: a stopped rank is a pause, and tracing it would wake nobody) are
checked again. The probe never leaves a stop of its own behind (a rank with a thread in
uninterruptible sleep is not sampled: probes/linux.py). What it read is kept
raw (thread id -> frames, leaf first): the judge classifies it.

The sockets' queues (bytes queued to send, received and not read) are read at every
scan for the same ranks: unchanged for a while, no byte moves on the job's links.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from watchdog.backends import bytes_on_sockets
from watchdog.daemon.probes import Probe, ProbeError, same_process
from watchdog.daemon.sample import GpuPower
from watchdog.states import STOPPED_STATUSES

log = logging.getLogger(__name__)

SAMPLE_EVERY = 3.0  # seconds between two samples of one rank
# A rank asleep and unchanged (no thread busy, the same frames as its sample before, its
# sockets' queues still since then: a quiet hang waiting toward its deadline, whose
# verdict only needs confirming) is sampled less often: the gap doubles, up to this. A
# sample speaks for judge/sighting.FRESH (10 s): this, a scan and a sample's time box stay
# within it, so a fresh one is there when the deadline comes.
MAX_EVERY = 6.0
# Past that, a rank of a job with no thread busy anywhere (a quiet hang, or a long quiet
# wait) is left alone until its deadline is this near: its verdict needs a fresh sample
# only then (a fresh one at the deadline, the next MAX_EVERY after it), and its facts
# meanwhile are its last sample's while nothing moves (detector._quiet). A quiet hang of
# two ranks took 18 samples before (gdb: ~9% of a core per rank), 8 now.
HOLD_LEAD = MAX_EVERY
# Such a rank's sockets' queues are read every QUIET_QUEUES_EVERY seconds, not every
# scan: its stillness matters over tens of seconds (detector.QUIET_HANG_FOR, 10 s).
QUIET_QUEUES_EVERY = 3.0
SAMPLE_TIMEOUT = 3.0  # seconds one sample may take (gdb reads a rank in ~0.5 s)
# What one sample keeps, whatever a rank's threads and names (a rank's own code names
# its frames: issue 57, item 6): frames of at most MAX_FRAME_CHARS (a real C++ frame,
# its parameters cut by the parser, is under 200), at most MAX_THREAD_FRAMES a thread
# from its leaf, MAX_SAMPLE_FRAMES in all (the busy threads' first, then the main
# thread's): at most 1 MiB of names, each classified once (judge/frames.py).
MAX_FRAME_CHARS = 256
MAX_THREAD_FRAMES = 64
MAX_SAMPLE_FRAMES = 4096
# Two GPU time readings further apart than this are not compared (the next one starts
# afresh). Any shorter span is safe both ways: flat over it, no GPU work ran in it (a
# quiet rank is still asleep now: its verdict needs the wait quiet since); advancing,
# it is held as computing for one more sample. A quiet job's samples are held back to
# its deadline (HOLD_LEAD): its readings may be a deadline apart.
GPU_SPAN = 600.0
MAX_RUNNING = 4  # samples under way at once, every rank together
WANTING_FOR = 2 * SAMPLE_EVERY  # seconds an owner's last ask keeps its share of the slots

Key = tuple[int, float]  # a rank's pid and start time


def bounded(stacks: dict[int, tuple[str, ...]], first: tuple[int, ...] = ()
            ) -> dict[int, tuple[str, ...]]:
    """A sample's stacks within the bounds above: the threads of `first` (busy, main)
    first, then by id; each frame cut to MAX_FRAME_CHARS, equal names shared."""
    kept: dict[int, tuple[str, ...]] = {}
    names: dict[str, str] = {}
    left = MAX_SAMPLE_FRAMES
    order = [t for t in first if t in stacks] + sorted(t for t in stacks if t not in first)
    for tid in order:
        if left <= 0 or tid in kept:
            continue
        frames = stacks[tid][:min(MAX_THREAD_FRAMES, left)]
        kept[tid] = tuple(names.setdefault(f[:MAX_FRAME_CHARS], f[:MAX_FRAME_CHARS])
                          for f in frames)
        left -= len(frames)
    return kept


@dataclass(frozen=True)
class Identity:
    """A process's identity as the sample was asked for it: a sample of another process
    (the pid reused) is thrown away."""
    pid: int
    start_time: float
    uid: int
    start_ticks: int = 0


@dataclass(frozen=True)
class Stacks:
    """One sample of a rank: when (monotonic), its threads' frames (None: no sampler
    here, {}: nothing read), the ids of the threads busy when it was asked, and what
    failed, if anything."""

    at: float
    stacks: dict[int, tuple[str, ...]] | None
    busy: tuple[int, ...]
    took: float = 0.0
    error: str = ""
    gpu_ns: int | None = None  # its accumulated GPU time then (macOS); None: unknown
    gpu_moved: bool | None = None  # did it advance since the sample before; None: unknown
    gpu_power: GpuPower | None = None  # the whole GPU's residency and power then
    # The share of the time since the sample before that its own GPU time covers
    # (None: unknown): the whole GPU's readings speak for this rank only as far as its
    # own time accounts for them (judge/gpuwork.py).
    gpu_share: float | None = None
    gpu_why: str = ""  # why `gpu_moved` is None, in words (judge/frames.py: unknown)
    # The other processes' GPU time and name by pid, read with its own (macOS); and,
    # its own GPU time flat, those whose GPU time advanced since the sample before
    # (most first: (pid, name)): the GPU shared with another job (its work queued
    # behind theirs).
    gpu_others: dict[int, tuple[int, str]] | None = None
    gpu_behind: tuple[tuple[int, str], ...] = ()


@dataclass
class Queues:
    """A rank's sockets' queues as last read, since when they have not changed, and the
    bytes received and not read in them."""

    queues: tuple[tuple[int, int, int], ...] | None
    since: float
    unread: int = 0
    read_at: float = 0.0  # when they were last read
    # Each socket's byte counters (probes/tcpdiag.py), when the platform gives them for
    # every socket: then "still since" is exact (a slow link moves them at any rate);
    # None: the queues alone say it, and a slow transfer's may read the same twice.
    counters: tuple[tuple[int, int, int], ...] | None = None
    # When bytes last moved on a socket seen at two reads in a row (its counters grew):
    # a transfer under way. A socket first seen (a client's new connection) is not one.
    flowed: float | None = None

    @property
    def exact(self) -> bool:
        """Whether the stillness was read from byte counters, not queues alone."""
        return self.counters is not None


class StackSampler:
    """Native stacks and sockets' queues of the ranks of a job past its wedge deadline,
    sampled on the daemon's workers, bounded per owner and per rank, and kept until read."""
    def __init__(self, probe: Probe, submit: Callable[..., object],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.probe, self.submit, self.clock = probe, submit, clock
        self.asked: dict[Key, float] = {}
        self.found: dict[Key, Stacks] = {}
        self.running: set[Key] = set()
        self.owners: dict[Key, int] = {}  # the owner uid of each sample under way
        self.wanting: dict[int, float] = {}  # owner uid -> when a rank of it last asked
        self.queues: dict[Key, Queues] = {}
        self.ended: dict[Key, float] = {}  # when each rank's last sample ended
        self.every: dict[Key, float] = {}  # each rank's gap between samples (MAX_EVERY)
        # Each rank's GPU time read ahead of its first sample (prime): (when, ns).
        self.primed: dict[Key, tuple[float, int]] = {}
        self.priming: set[Key] = set()
        self.taken = 0  # samples taken since start (status, benchmarks)
        self.seconds = 0.0  # their time in all

    def ask(self, who: Identity, busy: tuple[int, ...], now: float,
            hold_until: float = 0.0, every: float | None = None) -> bool:
        """Sample this rank's stacks on a worker, unless one was taken or asked lately
        (within its gap, or `every` seconds when given: an early sample's second look),
        or its owner holds its share of the slots already. `hold_until`: a rank asleep
        and unchanged (at its longest gap) is not sampled again before then. True when
        a sample was set going."""
        key = (who.pid, who.start_time)
        gap = self.every.get(key, SAMPLE_EVERY) if every is None else every
        if now - self.asked.get(key, -MAX_EVERY) < gap or (gap >= MAX_EVERY
                                                           and now < hold_until):
            return False
        self.wanting[who.uid] = now
        if key in self.running or len(self.running) >= MAX_RUNNING:
            return False
        if sum(uid == who.uid for uid in self.owners.values()) >= self.share(now):
            return False
        self.asked[key] = now
        self.running.add(key)
        self.owners[key] = who.uid
        try:
            self.submit(lambda: self._run(key, who, busy))
        except RuntimeError:  # the executor is shut down: the daemon is stopping
            self.running.discard(key)
            self.owners.pop(key, None)
            return False
        return True

    def share(self, now: float) -> int:
        """The slots one owner may hold at once: MAX_RUNNING shared out between the
        owners whose ranks asked for a sample lately (at least one each). One user's
        ranks, however many and however slow to sample (a rank can make gdb wait out
        its whole time box), never take every slot from another's."""
        for uid in [u for u, t in self.wanting.items() if now - t > WANTING_FOR]:
            del self.wanting[uid]
        return max(1, MAX_RUNNING // max(1, len(self.wanting)))

    def _run(self, key: Key, who: Identity, busy: tuple[int, ...]) -> None:
        try:
            found = self.sample(who, busy)
            before = self.found.get(key)
            primed = self.primed.pop(key, None)
            if (before is None or before.gpu_ns is None) and primed is not None:
                before = Stacks(primed[0], None, (), gpu_ns=primed[1])  # its first reading
            if found.gpu_ns is not None and before is not None and before.gpu_ns is not None \
                    and found.at - before.at <= GPU_SPAN:
                moved = found.gpu_ns > before.gpu_ns
                span = found.at - before.at
                behind = () if moved else _advanced(before.gpu_others, found.gpu_others)
                # Advancing: is it work, or a kernel spinning on nothing (mlx #3830)?
                # Flat: was the GPU busy with another's work meanwhile (whose, `behind`)?
                # The whole GPU's reading, with the share of it this rank's time covers.
                found = dataclasses.replace(
                    found, gpu_moved=moved, gpu_behind=behind,
                    gpu_power=self.probe.gpu_power(SAMPLE_TIMEOUT),
                    gpu_share=(found.gpu_ns - before.gpu_ns) / (span * 1e9) if span > 0
                    else None)
            elif found.gpu_ns is not None:  # one reading: flat or not needs two
                found = dataclasses.replace(found, gpu_why="one reading so far (flat or "
                                            "advancing needs two)")
            self.every[key] = (min(MAX_EVERY, 2 * self.every.get(key, SAMPLE_EVERY))
                               if self.unchanged(key, self.found.get(key), found)
                               else SAMPLE_EVERY)
            self.found[key] = found
            if found.stacks is not None and not found.error.startswith("not sampled"):
                self.ended[key] = self.clock()  # a sampler attached: the rank was held
            log.debug("stacks of pid %s: %d threads in %.2fs (busy %s) %s", who.pid,
                      len(found.stacks or {}), found.took, list(busy), found.error)
        except Exception as err:  # noqa: BLE001 - a failed sample is a result
            self.found[key] = Stacks(self.clock(), {}, busy, error=str(err))
        finally:
            self.owners.pop(key, None)
            self.running.discard(key)

    def prime(self, who: Identity, now: float) -> None:
        """A rank past half its wedge deadline, where MLX computes on a GPU (macOS): its
        GPU time read once ahead (ioreg only, on a worker), so that its first stack
        sample already tells flat from advancing (two readings), not one sample later."""
        key = (who.pid, who.start_time)
        fresh = key in self.primed and now - self.primed[key][0] < GPU_SPAN
        if not self.probe.gpu_clock or fresh or key in self.priming \
                or key in self.found or key in self.running:
            return
        self.priming.add(key)

        def read() -> None:
            try:
                ns, _ = self.probe.gpu_reading(who.pid, SAMPLE_TIMEOUT)
                if ns is not None:
                    self.primed[key] = (self.clock(), ns)
            finally:
                self.priming.discard(key)
        try:
            self.submit(read)
        except RuntimeError:  # the executor is shut down: the daemon is stopping
            self.priming.discard(key)

    def unchanged(self, key: Key, before: Stacks | None, found: Stacks) -> bool:
        """Whether a rank's new sample shows it as its sample before did, asleep: no thread
        busy then or now, the same threads in the same frames, no GPU time gone by, its
        sockets' queues still since the sample before."""
        if before is None or found.error or before.error or found.busy or before.busy:
            return False
        if not found.stacks or found.stacks != before.stacks or found.gpu_moved:
            return False
        queues = self.queues.get(key)
        return queues is None or queues.since <= before.at

    def settle(self, keys: Iterable[Key], timeout: float | None = None) -> None:
        """Wait (at most `timeout`) until no sample of these ranks is under way: a response
        about to take them needs them out of our trace (its evidence asks a rank in
        tracing-stop for nothing, and its own sampler cannot attach beside ours)."""
        keys = set(keys)
        box = self.probe.stack_timeout if timeout is None else timeout
        until = time.monotonic() + box  # real time: a sample takes real time
        while keys & self.running and time.monotonic() < until:
            time.sleep(0.02)

    def tracing(self, key: Key, since: float) -> bool:
        """Was this rank stopped by our own sampler (gdb's ptrace stop) at any time since
        `since` (monotonic)? Its "tracing-stop" is then ours, not a pause of the rank,
        and what its threads used meanwhile says nothing."""
        return key in self.running or self.ended.get(key, -1e18) > since

    def sample(self, who: Identity, busy: tuple[int, ...]) -> Stacks:
        """One sample, now, on this thread: identity and state checked first."""
        began = self.clock()
        try:
            now = self.probe.sample(who.pid)
        except ProbeError as err:
            return Stacks(began, {}, busy, error=f"not sampled: {err}")
        if now is None or not same_process(now, who.start_time, who.uid, who.start_ticks):
            return Stacks(began, {}, busy, error="not sampled: not the rank's process")
        if now.status in STOPPED_STATUSES:
            return Stacks(began, {}, busy, error="not sampled: the process is stopped")
        gpu, why = self.probe.gpu_reading(who.pid, SAMPLE_TIMEOUT)
        others = self.probe.gpu_others(who.pid) if gpu is not None else None
        try:
            stacks = self.probe.native_stacks(who.pid, self.probe.stack_timeout)
        except ProbeError as err:  # e.g. a thread in uninterruptible sleep: not attached
            return Stacks(began, {}, busy, error=f"not sampled: {err}", gpu_ns=gpu,
                          gpu_why=why, gpu_others=others)
        took = self.clock() - began
        self.taken += 1
        self.seconds += took
        if stacks is None:
            return Stacks(began, None, busy, took, "no native stack sampler installed", gpu,
                          gpu_why=why, gpu_others=others)
        stacks = bounded(stacks, (*busy, who.pid))
        return Stacks(began, stacks, busy, took, "" if stacks else "the sample read nothing",
                      gpu, gpu_why=why, gpu_others=others)

    def track_queues(self, key: Key, pid: int, now: float, backend: str | None = None,
                     every: float = 0.0) -> Queues:
        """Read the rank's sockets' queues (unless read less than `every` seconds ago);
        since when they have stood still. A backend whose bytes never cross its sockets
        (JACCL's RDMA) gets none: unknown."""
        last = self.queues.get(key)
        if last is not None and now - last.read_at < every:
            return last
        try:
            queues = (self.probe.socket_queues(pid) if bytes_on_sockets(backend)
                      else None)
            counters = self.probe.socket_counters(pid) if queues is not None else None
        except (OSError, ProbeError):
            queues = counters = None
        moved = last is None or queues is None or last.queues != queues or (
            counters is not None and last.counters is not None and last.counters != counters)
        flowed = last.flowed if last is not None else None
        if counters is not None and last is not None and last.counters is not None:
            before = {inode: (acked, got) for inode, acked, got in last.counters}
            if any(inode in before and (acked, got) != before[inode]
                   for inode, acked, got in counters):
                flowed = now
        if moved or last is None:
            last = self.queues[key] = Queues(queues, now, counters=counters, flowed=flowed)
        else:
            last.counters = counters  # known from now on, or no longer (the queues say)
        last.unread = sum(rx for _, _, rx in queues or ())
        last.read_at = now
        return last

    def forget(self, keep: Iterable[Key]) -> None:
        """Drop what is known of every rank but `keep` (those still sampled)."""
        keep = set(keep)
        for table in (self.asked, self.found, self.queues, self.ended, self.every,
                      self.primed):
            # A copy first: a worker's sample ending now writes `found` and `ended` (seen
            # under load: "dictionary changed size during iteration" failed the scan).
            for key in [k for k in list(table) if k not in keep]:
                table.pop(key, None)


def _advanced(before: dict[int, tuple[int, str]] | None,
              now: dict[int, tuple[int, str]] | None) -> tuple[tuple[int, str], ...]:
    """The processes whose GPU time advanced between two readings, most first."""
    if not before or not now:
        return ()
    grew = sorted(((ns - before[p][0], p, name) for p, (ns, name) in now.items()
                   if p in before and ns > before[p][0]), reverse=True)
    return tuple((p, name) for _, p, name in grew)
