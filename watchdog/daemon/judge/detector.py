"""Pure judgement: from what a rank's record and process show, its state.

No file, clock or process is touched here: the caller passes the record, the
process sample and the monotonic time, and gets a `Verdict`. The per-rank
memory a verdict needs (the previous CPU sample, how busy the wait has been,
how many ticks in a row it has been due) lives in a `Track` the `Detector`
keeps by rank identity.

Only a wait that does not return is judged, with one exception, the
backstop: a rank outside any known wait whose progress has not moved for its
deadline while its Python threads are quiet and a thread that is not a Python
thread spins is stuck in a native call the hook could not wrap (the buffer
protocol, `np.array(a)`). A rank inside `hb.idle()` is never a hang.

Each verdict also says whether the rank looks like it is computing (a Python
thread busy, or a busy thread spending its time in user space where the
backend's peer wait would spend it in the kernel): holds.py uses that to
keep a job whose ranks wait on a computing peer from being torn down.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from watchdog.backends import spins_in_kernel
from watchdog.daemon.judge.deadlines import NS, AutoDeadline, Learned, RankWaits, Rules
from watchdog.daemon.judge.frames import GPU_ADVANCES, Reading
from watchdog.daemon.judge.ownwait import SAVE_OPS, OwnWait
from watchdog.daemon.judge.sighting import GPU_WORKS, NOTHING, Sighting
from watchdog.daemon.judge.threads import (
    KERNEL_SHARE,
    QUIET_RATIO,
    WORK_RATIO,
    ThreadTick,
    python_threads,
    thread_tick,
)
from watchdog.daemon.judge.wedge import Wedge
from watchdog.daemon.sample import ProcessSample
from watchdog.record import Record
from watchdog.states import STOPPED_STATUSES, FrameKind, Phase, State

__all__ = ["GPU_WORKS", "NS", "Detector", "Track", "Verdict", "describe_tracer",
           "foreign_tracer"]

BUSY_WINDOW = 32
# Seconds nothing must move (the process's bytes read and written, its sockets' queues)
# for a quiet wait to count as a hang: a checkpoint or a load moves bytes within this.
QUIET_HANG_FOR = 10.0


@dataclass
class Track:
    """What the detector remembers about one rank between ticks."""

    cpu: dict[int, float] = field(default_factory=dict)
    demand: dict[int, float] = field(default_factory=dict)  # run + run-queue s per thread
    cpu_at_ns: int | None = None
    wait_key: tuple[int, int] = (0, 0)  # (wait started, waits completed): one wait
    # Busiest-thread ratios, scaled by load, over the latest ticks of this wait (bounded: a wait
    # can last days under observe mode or a stopped peer).
    busy: deque[float] = field(default_factory=lambda: deque(maxlen=BUSY_WINDOW))
    due_ticks: int = 0
    busiest: float = 0.0
    system: dict[int, float] = field(default_factory=dict)
    # Progress as the daemon sees it move: (waits completed, collectives, steps)
    # and when that last changed (collectives and steps carry no time of their own).
    progress: tuple[int, int, int] | None = None
    moved_ns: int = 0
    first_ns: int = 0  # when the detector first saw this rank
    was_computing: bool = False  # the previous stretch's computing flag
    waits: RankWaits = field(default_factory=RankWaits)  # what the auto deadline learns from
    # Per tick of the current stretch (one wait, or one spell without progress
    # outside a wait): did it look like computing; the busiest Python and
    # non-Python threads' shares (load-scaled).
    computing: deque[bool] = field(default_factory=lambda: deque(maxlen=BUSY_WINDOW))
    python_busy: deque[float] = field(default_factory=lambda: deque(maxlen=BUSY_WINDOW))
    native_busy: deque[float] = field(default_factory=lambda: deque(maxlen=BUSY_WINDOW))
    # The process's I/O counters (read, written): as last sampled, at the start of the
    # current stretch, and when they last moved (ns; 0: not yet seen).
    io: tuple[int, int] | None = None
    offsets: int | None = None  # the open files' offsets (macOS): moving is bytes moving
    offset_bytes: int = 0  # how far they moved forward over the current stretch
    io_base: tuple[int, int] | None = None
    io_moved_ns: int = 0
    hot: tuple[int, ...] = ()  # the threads busy over the last interval


@dataclass(frozen=True)
class Verdict:
    """One rank's judgement at one scan: its state and why, its deadline and how long it
    has waited, whether it is due for a response (`act`), and what was seen of it."""

    state: State
    deadline: float  # seconds the current (or next) wait may last
    seconds_in_wait: float  # 0 outside a wait
    seconds_since_progress: float
    busiest_cpu: float  # busiest thread's share of a core over the last interval
    act: bool  # due long enough: escalate now
    reason: str
    computing: bool = False  # over this stretch the rank mostly looked like computing
    collectives: int = 0  # the rank's collectives issued (which one the others wait in)
    own: OwnWait | None = None  # its wait, when one of its own (ownwait.py)
    # Its wait's deadline were its collective found wedged (0: no such deadline: outside
    # a collective's wait, or in an hb.expect() window), and the job's wedge when found.
    wedge_deadline: float = 0.0
    wedge: Wedge | None = None
    seen: str = ""  # what its busy threads ran at the latest stack sample (frames.py)
    hot: tuple[int, ...] = ()  # its threads busy over the last interval (their ids)
    seen_kind: str = ""  # that sample's kind (FrameKind.WAITING, ...; "": none fresh)
    # Its wait past the deadline with nothing spinning and nothing moving, nothing to
    # explain it (a quiet hang, ended as `quiet_hang`): what was seen, in words; "": not.
    quiet: str = ""
    # Traced by a tracer not the daemon's own (state TRACED): its pid and name.
    tracer: int = 0
    tracer_name: str = ""
    # Seconds since a rank of its job was last seen traced, while its waits are judged
    # from that detach (`judged_from_ns`) and it is not yet past its deadline since; None
    # otherwise.
    since_traced: float | None = None
    # At bring-up (mx.distributed.init): the ranks of its job not seen yet, which it may
    # wait for (`None`: not at bring-up, or its world size unknown).
    awaiting: tuple[int, ...] | None = None
    # Its wait is the first of its kind: the auto deadline has learned nothing of that
    # kind yet (a cold prefill, a first step compiling, a load after a relaunch).
    cold: bool = False
    # Its latest stack sample (fresh) named compute frames (or GPU time advancing), not
    # a guess from frames the table does not name: its work shows.
    works: bool = False
    # Its GPU (macOS), at its latest fresh sample: GPU_WORKS, "unknown: <why>" (it may
    # work: it holds its job, up to the blocked deadline), or "" (flat, or no GPU here).
    gpu: str = ""
    # Its own GPU time flat while another process's advances on a GPU busy at working
    # power (macOS): what its work waits behind, in words; "" otherwise.
    behind: str = ""
    # Seconds since bytes last moved on a socket of its that was open at the read before
    # (byte counters: exact), read at a recent scan; None: not read so (no counters, or
    # not read lately): `Sighting.flowing`. A transfer under way (holds.py).
    flowing: float | None = None


def foreign_tracer(sample: ProcessSample) -> bool:
    """Is the process traced by someone other than the reader's own descendants (the
    daemon's stack sampler)? Its tracer unknown or not ours: yes."""
    return bool(sample.tracer) and sample.tracer_own is not True


def describe_tracer(sample: ProcessSample) -> str:
    """The tracer in words: "pid 1234 (gdb)", "pid 1234", "an unknown tracer"."""
    if not sample.tracer:
        return "an unknown tracer"
    return f"pid {sample.tracer}" + (f" ({sample.tracer_name})" if sample.tracer_name else "")


def _majority(flags: deque[bool]) -> bool:
    return len(flags) >= 2 and sum(flags) * 2 >= len(flags)


def _median(values: deque[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


class Detector:
    """Judges each live rank at each scan (`observe`, pure but for its per-rank
    `Track` memory); its `auto` deadline learns each job's pace of waits, kind by kind."""

    def __init__(self, rules: Rules | Callable[[], Rules],
                 learned: dict[str, dict[str, Learned]] | None = None) -> None:
        """`rules`: the rules, or where to read them at each use (the daemon's settings
        holder: a reload reaches the next judgement); `learned`: what the auto deadline
        learned before (the daemon keeps it across restarts, state dir)."""
        self._rules = rules
        self.tracks: dict[tuple[int, float], Track] = {}
        self.auto = AutoDeadline(lambda: self.rules, learned)

    @property
    def rules(self) -> Rules:
        """The rules now (read afresh at each use when given as a callable)."""
        return self._rules if isinstance(self._rules, Rules) else self._rules()

    def forget(self, key: tuple[int, float]) -> None:
        """Drop what was remembered of a rank (`key`: its pid and start time)."""
        self.tracks.pop(key, None)

    def observe(self, record: Record, sample: ProcessSample, now_ns: int,
                sighting: Sighting = NOTHING, wedge: Wedge | None = None,
                learn: bool = True) -> Verdict:
        """One tick for one live rank whose identity the caller has checked, with what
        the scan saw of it (judge/sighting.py: its `load` scales what a thread got).

        `learn` False: the rank is under a response (its hang acted on, or a peer's
        fence). A wait it ends now (its frozen peer resumed by the response's
        SIGCONT) lasted as long as the hang, which is not the job's pace: it counts,
        and never stretches the deadline of the job or of its relaunch.

        Its `seen` (busy threads at a fresh stack sample, judge/frames.py): spinning in a
        wait frame it is not computing, in compute frames it is, on every backend;
        unknown (or no sample) leaves the per-backend rule. `wedge` is its job's wedge
        (judge/wedge.py): its wait is then judged at the wedge deadline. `traced`: what
        its threads used while our sampler held it says nothing, and is not counted.
        Its `asleep` frames with its sockets' stillness: a wait past its deadline that
        nothing explains is a quiet hang (`_quiet`), ended only from a fresh sample.
        `judged_from_ns`: its wait and its time without progress count from a person's
        tracer's detach, as if they began there (0: never traced). `present`: a rank at
        bring-up waits for the ranks not seen. `behind`: its wait is explained (slow,
        not hung), never a quiet hang, and it holds its job as a rank computing does,
        to the bound.
        """
        traced, judged_from_ns = sighting.traced, sighting.judged_from_ns
        seen, gpu_behind = sighting.seen, sighting.behind
        track = self.tracks.setdefault((record.pid, record.start_time), Track())
        measured = track.cpu_at_ns is not None  # the first sample has no interval to measure
        tick = self._measure(record, sample, track, now_ns, sighting.load, traced)
        _note_progress(record, track, now_ns)
        waiting = record.phase in (Phase.WAIT, Phase.INIT) and record.wait_since_ns > 0
        traced_now = foreign_tracer(sample)
        # A wait at least this long began before a person's tracer let go of a rank of
        # the job: it lasted as long as the trace, which says nothing of the job's pace.
        spanned = (now_ns - judged_from_ns) / NS if judged_from_ns else float("inf")
        stopped = sample.status in STOPPED_STATUSES or traced_now
        in_wait = (max(0.0, (now_ns - max(record.wait_since_ns, judged_from_ns)) / NS)
                   if waiting else 0.0)
        self.auto.learn(record, track.waits, waiting, stopped, learn, in_wait, spanned)
        due = self.auto.deadline(record, waiting, wedge is not None and wedge.exact)
        deadline, wedge_at, cold = due.deadline, due.wedge, due.cold
        if wedge is not None and wedge_at:
            deadline = wedge_at
        since_progress = max(0.0, (now_ns - max(record.last_progress_ns, track.moved_ns,
                                                judged_from_ns)) / NS)
        since_moved = max(0.0, (now_ns - max(record.last_progress_ns, track.moved_ns,
                                             track.first_ns, judged_from_ns)) / NS)
        since_traced = ((now_ns - judged_from_ns) / NS
                        if judged_from_ns and not traced_now else None)
        _stretch(record, sample, track, waiting, now_ns)
        computing = _computing_now(record, track, tick,
                                   measured and bool(sample.threads) and not traced, seen)
        gpu = sighting.gpu if waiting else ""
        computing = computing or gpu == GPU_WORKS or (waiting and bool(gpu_behind))
        in_collective = waiting and record.phase == Phase.WAIT and not stopped
        own = self._own(record, sample, track, in_wait, deadline, now_ns) \
            if in_collective else None
        quiet = self._quiet(record, sample, track, sighting, in_wait, now_ns) \
            if in_collective and not gpu_behind else ""

        def verdict(state: State, reason: str, act: bool = False,
                    seconds: float = in_wait, busy: bool = computing) -> Verdict:
            if sample.threads_error:  # every hang of it waits for the blocked deadline
                reason = f"{reason}; {sample.threads_error}"
            return Verdict(
                state=state, deadline=deadline, seconds_in_wait=seconds,
                seconds_since_progress=since_progress, busiest_cpu=track.busiest, act=act,
                reason=reason, computing=busy, collectives=record.collectives, own=own,
                wedge_deadline=wedge_at, wedge=wedge if wedge_at else None,
                seen=seen.what if seen else "", hot=track.hot,
                seen_kind=seen.kind if seen else "",
                quiet=quiet if state == State.STALLED else "", gpu=gpu,
                tracer=(sample.tracer or 0) if state == State.TRACED else 0,
                tracer_name=sample.tracer_name if state == State.TRACED else "",
                since_traced=since_traced if since_traced is not None
                and since_traced < deadline else None,
                awaiting=awaiting, cold=cold, behind=gpu_behind if waiting else "",
                flowing=sighting.flowing if waiting else None,
                works=(seen is not None and seen.kind == FrameKind.COMPUTING
                       and not seen.guessed) or gpu == GPU_WORKS)

        awaiting = None
        if waiting and record.phase == Phase.INIT and sighting.present is not None \
                and record.world_size > 1:
            awaiting = tuple(r for r in range(record.world_size)
                             if r not in sighting.present)

        if traced_now:
            # A person at work (a debugger, a profiler): its job is held while it lasts
            # (holds.py), and judged afresh from the detach.
            track.due_ticks = 0
            return verdict(State.TRACED, f"traced by {describe_tracer(sample)}")
        if sample.status in STOPPED_STATUSES:
            track.due_ticks = 0
            return verdict(State.STOPPED, f"process is {sample.status}")
        if record.phase == Phase.IDLE:
            return verdict(State.IDLE, "inside hb.idle()")
        if not waiting:
            return self._outside(record, track, deadline, since_moved, verdict)
        if record.phase == Phase.INIT:
            return self._bringup(record, track, deadline, in_wait, awaiting, sighting.where,
                                 verdict)
        return self._in_wait(record, track, deadline, in_wait, own, quiet,
                             wedge is not None and bool(wedge_at), verdict,
                             quiet_fresh=sighting.fresh, gpu=gpu, behind=gpu_behind)

    def _measure(self, record: Record, sample: ProcessSample, track: Track, now_ns: int,
                 load: float, traced: bool) -> ThreadTick:
        """This interval's use of each thread (thread_tick), the track moved on to now."""
        cpu, system, demand = dict(sample.threads), dict(sample.system), dict(sample.demand)
        tick = ThreadTick(0.0, None, None, None)
        if track.cpu_at_ns is not None:
            tick = thread_tick(track.cpu, cpu, track.system, system,
                               (now_ns - track.cpu_at_ns) / NS, python_threads(record, sample),
                               max(1.0, load), track.demand, demand)
            if not traced:
                track.busiest, track.hot = tick.busiest, tick.hot
        track.cpu, track.system, track.demand, track.cpu_at_ns = cpu, system, demand, now_ns
        return tick

    def _in_wait(self, record: Record, track: Track, deadline: float, in_wait: float,
                 own: OwnWait | None, quiet: str, wedged: bool,
                 verdict: Callable[..., Verdict], quiet_fresh: bool = True,
                 gpu: str = "", behind: str = "") -> Verdict:
        """A rank in a wait: running, suspect past half its deadline, and past it stalled
        (a thread spinning, or a quiet hang: acted on from a fresh sample only) or
        blocked (nothing spinning)."""
        rules = self.rules
        if in_wait < deadline / 2:
            return verdict(State.RUNNING, "waits return within the deadline")
        what = f"in {record.op or 'a wait'} for {in_wait:.1f}s"
        if in_wait < deadline:
            return verdict(State.SUSPECT, f"{what}, past half the {deadline:g}s deadline"
                           + (f"; quiet: {quiet}" if quiet else "")
                           + (f"; its GPU work waits behind {behind}" if behind else ""))
        if own is not None and own.moving(rules.auto_floor):
            # A save or load still moving bytes is not stuck, however long it takes.
            track.due_ticks = 0
            return verdict(State.SUSPECT, f"{what}, past the {deadline:g}s deadline but "
                                          f"{own.describe()}, bytes moving")

        # Past the deadline. A spinning thread over most of the wait means the
        # hang this tool is for (a survivor polling a dead or frozen peer); a quiet one may
        # be a wedged GPU or broken group, given a longer deadline of its own.
        spinning = len(track.busy) >= 2 and _median(track.busy) >= rules.spin_ratio
        if spinning:
            state, due = State.STALLED, True
            reason = f"{what}, past the {deadline:g}s deadline, one thread spinning"
            if wedged:
                reason = (f"{what}, past the {deadline:g}s deadline of a wedged collective, "
                          "one thread spinning")
        elif gpu == GPU_WORKS:
            # Every CPU thread asleep in the eval while the GPU works (macOS): computing,
            # on every backend; held as a busy wait is, up to the blocked deadline.
            bound = in_wait >= max(deadline, rules.blocked_deadline)
            state, due = (State.BLOCKED if bound else State.SUSPECT), bound
            reason = (f"{what}, past the {deadline:g}s deadline, nothing spinning but "
                      f"{GPU_ADVANCES}")
        elif quiet:
            # Nothing spins, nothing moves, its threads sleep in the wait: a quiet hang
            # (mlx-lm #1834, exo #2173), ended at the deadline as a spinning one is.
            state, due = State.STALLED, quiet_fresh
            reason = f"{what}, past the {deadline:g}s deadline, quiet: {quiet}"
        else:
            state = State.BLOCKED
            due = in_wait >= max(deadline, rules.blocked_deadline)
            reason = f"{what}, past the {deadline:g}s deadline, nothing spinning"
            if gpu:  # unknown is not flat: no quiet hang, the blocked deadline stands
                reason += f"; GPU time {gpu} (no quiet hang without it)"
            if behind:  # the GPU is another job's: slow, not hung
                reason += f"; its GPU work waits behind {behind}"
        track.due_ticks = track.due_ticks + 1 if due else 0
        return verdict(state, reason, act=track.due_ticks >= rules.confirm)

    def _bringup(self, record: Record, track: Track, deadline: float, in_wait: float,
                 awaiting: tuple[int, ...] | None, where: str,
                 verdict: Callable[..., Verdict]) -> Verdict:
        """A rank in mx.distributed.init: it waits for its peers to start and connect (a
        late relaunch on a busy cluster), held up to the bring-up bound (`init_deadline`),
        and ended there, spinning or not: a peer that never comes never will."""
        if awaiting:
            names = ", ".join(str(r) for r in awaiting)
            whom = (f"rank{'s' if len(awaiting) > 1 else ''} {names} (not seen "
                    f"{where or 'on this node'})")
        elif awaiting is not None:
            whom = "its peers to connect (every rank seen)"
        else:
            peers = record.world_size - 1
            whom = f"its {peers} peer{'s' if peers != 1 else ''}" if peers > 0 else "its peers"
        what = f"at bring-up (mx.distributed.init) for {in_wait:.1f}s, waiting for {whom}"
        if in_wait < deadline / 2:
            return verdict(State.RUNNING, f"{what}; bring-up bound {deadline:g}s")
        if in_wait < deadline:
            return verdict(State.SUSPECT, f"{what}, past half its {deadline:g}s bring-up bound")
        spinning = len(track.busy) >= 2 and _median(track.busy) >= self.rules.spin_ratio
        track.due_ticks += 1
        return verdict(State.STALLED if spinning else State.BLOCKED,
                       f"{what}, past its {deadline:g}s bring-up bound",
                       act=track.due_ticks >= self.rules.confirm)

    def _quiet(self, record: Record, sample: ProcessSample, track: Track,
               sighting: Sighting, in_wait: float, now_ns: int) -> str:
        """A quiet hang, in words ("" when anything explains the wait or it cannot be
        told): no thread busy, its threads asleep in a wait the tables name and none in
        a file read or write (frames.asleep), no byte read or written by the process and
        none moving on its sockets for QUIET_HANG_FOR seconds (a process of one rank has
        no sockets to read), outside an `hb.expect()` window. A sample no longer fresh
        still speaks for the rank while nothing moved since it was taken."""
        asleep = sighting.asleep
        sockets_quiet = sighting.sockets.still if sighting.sockets is not None else None
        if asleep is None or asleep.kind != FrameKind.WAITING or record.expect_seconds > 0:
            return ""
        if track.hot or (len(track.busy) >= 1 and _median(track.busy) >= self.rules.spin_ratio):
            return ""
        if sample.io is None or track.io_moved_ns <= 0:
            return ""
        io_quiet = (now_ns - track.io_moved_ns) / NS
        if sockets_quiet is None and record.world_size > 1:
            return ""  # its sockets were not read (the peers' bytes may be moving)
        still = min(io_quiet, sockets_quiet if sockets_quiet is not None else io_quiet,
                    in_wait)
        if still < QUIET_HANG_FOR or (not sighting.fresh and still < (sighting.age or 0.0)):
            return ""
        return (f"{asleep.what}; no thread busy; nothing read, written or sent for "
                f"{still:.0f}s")

    def _own(self, record: Record, sample: ProcessSample, track: Track, in_wait: float,
             deadline: float, now_ns: int) -> OwnWait | None:
        """The current wait, when it is one of the rank's own: no collective it issued is
        outstanding (the last one was issued before its last completed wait ended), so
        it waits on nothing of its peers'; with the bytes moved since it began."""
        if record.flight and record.flight[-1].issued_ns > record.last_progress_ns:
            return None
        read = written = quiet = None
        if sample.io is not None and track.io_base is not None:
            read = max(0, sample.io[0] - track.io_base[0])
            written = max(0, sample.io[1] - track.io_base[1])
        if sample.offsets is not None:  # macOS: offsets moved are the save's bytes too
            if record.op in SAVE_OPS:
                written = max(written or 0, track.offset_bytes)
            else:
                read = max(read or 0, track.offset_bytes)
        if read is not None or written is not None:
            # In an `hb.expect()` window the user's deadline is the wait's, silent or not.
            quiet = None if record.expect_seconds > 0 else max(
                0.0, (now_ns - track.io_moved_ns) / NS)
        spinning = len(track.busy) >= 2 and _median(track.busy) >= self.rules.spin_ratio
        return OwnWait(record.op, in_wait, deadline, read, written, quiet, spinning,
                       self.rules.auto_floor)

    def _outside(self, record: Record, track: Track, deadline: float, since: float,
                 verdict: Callable[..., Verdict]) -> Verdict:
        """Outside a known wait: running, unless the backstop finds it stuck."""
        rules = self.rules
        if len(track.native_busy) < 2 or since < deadline / 2:
            return verdict(State.RUNNING, "outside a wait")
        quiet = _median(track.python_busy) < QUIET_RATIO
        spinning = _median(track.native_busy) >= rules.spin_ratio
        computing = sum(track.computing) * 2 >= len(track.computing)
        if not (quiet and spinning) or computing:
            track.due_ticks = 0
            return verdict(State.RUNNING, "outside a wait")
        what = (f"stuck in a native call outside a known wait for {since:.1f}s "
                "(no progress, Python threads quiet, a native thread spinning)")
        if since < deadline:
            return verdict(State.SUSPECT, f"{what}, past half the {deadline:g}s deadline",
                           seconds=since, busy=False)
        track.due_ticks += 1
        return verdict(State.STALLED, f"{what}, past the {deadline:g}s deadline",
                       act=track.due_ticks >= rules.confirm, seconds=since, busy=False)


def _note_progress(record: Record, track: Track, now_ns: int) -> None:
    """When the rank's progress (waits completed, collectives, steps) last moved."""
    progress = (record.waits_completed, record.collectives, record.steps)
    if progress != track.progress:
        # At first sight it is unknown when they last moved: 0 for the
        # report (the record's own time stands), now for the backstop
        # (which may then wait one deadline longer, never less).
        track.moved_ns = now_ns if track.progress is not None else 0
        track.first_ns = track.first_ns or now_ns
        track.progress = progress



def _stretch(record: Record, sample: ProcessSample, track: Track, waiting: bool,
             now_ns: int) -> None:
    """One stretch: a wait, or (outside one) a spell without progress. A new one
    starts its windows afresh, and counts its bytes from here."""
    progress = (record.waits_completed, record.collectives, record.steps)
    wait_key = ((record.wait_since_ns, record.waits_completed) if waiting
                else (-1, hash((progress, int(record.phase)))))
    if wait_key != track.wait_key:  # a new stretch: nothing carried over...
        # ...but whether it was computing, until this stretch can tell: a
        # rank going from one eval to the next must not look idle between
        # (a stretch of a single sample says what it saw, or nothing).
        if len(track.computing) >= 2:
            track.was_computing = _majority(track.computing)
        elif track.computing:
            track.was_computing = track.was_computing or track.computing[0]
        track.wait_key, track.due_ticks = wait_key, 0
        for window in (track.busy, track.computing, track.python_busy, track.native_busy):
            window.clear()
        # Bytes are counted from here; a wait first seen already under way counts as
        # quiet since it began until the next sample shows its counters move.
        track.io_base = sample.io
        track.offset_bytes = 0
        track.io_moved_ns = record.wait_since_ns if waiting else now_ns
    if sample.io is not None and track.io is not None and sample.io != track.io:
        track.io_moved_ns = now_ns
    if sample.offsets is not None and track.offsets is not None \
            and sample.offsets != track.offsets:
        track.io_moved_ns = now_ns
        # Bytes read or written through the files (a FIFO's, a network mount's too, where
        # a Mac's disk counters see none); a file closed takes its offset out of the sum.
        track.offset_bytes += max(0, sample.offsets - track.offsets)
    if track.io_base is None:
        track.io_base = sample.io
    track.io, track.offsets = sample.io, sample.offsets



def _computing_now(record: Record, track: Track, tick: ThreadTick, counts: bool,
                   seen: Reading | None) -> bool:
    """Over this stretch, does the rank look like it computes? `counts`: this
    interval's use counts (measured, threads seen, not stopped by our sampler)."""
    waiting = record.phase in (Phase.WAIT, Phase.INIT) and record.wait_since_ns > 0
    if counts:
        # How much a thread wanted a core, not what it got: on a loaded machine a
        # spinning thread gets a fraction of one (thread_tick).
        if waiting:
            track.busy.append(tick.busy)
        track.computing.append(_computing(record, tick))
        if tick.python is not None and tick.native is not None:
            track.python_busy.append(tick.python)
            track.native_busy.append(tick.native)
    computing = (_majority(track.computing) if len(track.computing) >= 2
                 else track.was_computing)
    if seen is not None and seen.gpu and seen.kind == FrameKind.COMPUTING:
        return True  # its GPU time advances: computing, on every backend, ring included
    if seen is not None and seen.kind == FrameKind.WAITING:
        return False  # what it runs, over where its time goes: it spins on nothing
    if seen is not None and seen.kind == FrameKind.COMPUTING and not seen.guessed \
            and not spins_in_kernel(record.backend):
        # Where a wait spins in user space (JACCL, MPI) its time cannot tell computing
        # from polling: the frames do. Elsewhere (ring) where the time goes stands: a
        # thread blocked in a syscall under Python's eval (a save stuck opening its
        # file) computes nothing; frames the table does not name keep the old rule.
        return True
    return computing



def _computing(record: Record, tick: ThreadTick) -> bool:
    """Does this interval look like the rank computing, rather than waiting?"""
    if tick.busy < WORK_RATIO:
        return False
    if tick.python is not None and tick.python >= WORK_RATIO:
        return True  # a Python thread runs: the user's own work
    if tick.kernel_share is None or tick.kernel_share >= KERNEL_SHARE:
        return False  # a thread polling in the kernel (or unknown): waiting on a peer
    # Busy in user space. On a backend whose peer wait spins in the kernel,
    # or with no peer at all, that is computation; elsewhere (JACCL polls
    # its completion queue in user space, MPI its progress engine; measured:
    # ~100% user, 0% system with a peer frozen) it may be the wait itself.
    return spins_in_kernel(record.backend) or 0 < record.world_size <= 1
