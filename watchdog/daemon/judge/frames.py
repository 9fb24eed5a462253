"""Pure: what a rank's busy threads run, from a sample of their native frames.

A thread spinning in its backend's wait on a peer (ring's socket worker in `recv`,
JACCL's `tbt_poll_cq`, MPI's progress engine, `Event::wait`) waits on nothing of its
own: it holds nobody as a slow peer. A thread in BLAS, a kernel, Metal encoding or
Python's eval computes. The tables are data, in watchdog/backends.py; a thread whose
frames match neither computes (never end a rank on a guess), and a rank none of whose
threads could be read is "unknown": the per-backend rule (judge/threads.py) stands.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from watchdog.backends import COMPUTING_FRAMES, PARKED_FRAMES, POLLING_FRAMES, waiting_frames
from watchdog.states import FrameKind

_PREFIXES = ("__libc_", "__GI___", "__GI_", "__")


@dataclass(frozen=True)
class Reading:
    """What a rank's busy threads ran at one sample: `kind` (waiting, computing or
    unknown), and in words which thread ran what."""

    kind: FrameKind
    what: str
    # Computing only because no frame of the busy thread is in the table ("never kill
    # on a guess"): the verdict then keeps today's per-backend rule (where the time
    # goes) rather than calling a rank computing that that rule does not.
    guessed: bool = False
    # Computing because the process's GPU time advances (macOS): on every backend, ring
    # included, such a rank computes (detector._computing_now), whatever its CPU threads do.
    gpu: bool = False
    # Why its GPU time could not be read, where a platform computes on a GPU (macOS): a
    # rank whose GPU may work is never read as waiting on nothing (unknown is not flat).
    gpu_unknown: str = ""


# Memoized by name: a C++ name's parameter list is walked once per name, not at every
# table entry it is matched against (a name is at most stacksampler.MAX_FRAME_CHARS).
@functools.lru_cache(maxsize=1 << 14)
def _bare(name: str) -> frozenset[str]:
    """A frame's own name in the spellings a bare C name is matched against."""
    if name.endswith(")"):  # a C++ name's parameter list: "worker()", "f(int)"
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += name[i] == ")"
            depth -= name[i] == "("
            if depth == 0:
                name = name[:i]
                break
    last = name.rsplit("::", 1)[-1]
    names = {name, last}
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            names.add(name[len(prefix):])
    return frozenset(names)


def matches(frame: str, pattern: str) -> bool:
    """Does this frame name match a table entry (backends.py says how)?"""
    if "::" in pattern or pattern.endswith("_") or not pattern.isidentifier():
        return pattern in frame
    return pattern in _bare(frame)


# Memoized by (frame, table): a sample's frames are each matched against a table once,
# whatever their number (issue 57, item 6: the memo by (frame, entry) thrashed under
# 64 threads of 62 distinct names, 6.6-9.4 s a classification here). A sample is
# classified once (daemon/sightings.py), its frames bounded (stacksampler.bounded).
@functools.lru_cache(maxsize=1 << 15)  # names of 256 characters: ~10 MiB at most
def in_table(frame: str, table: tuple[str, ...]) -> bool:
    """Does any entry of `table` name this frame?"""
    return any(matches(frame, p) for p in table)


def first_known(frames: Sequence[str], *tables: tuple[str, ...]) -> tuple[int, str] | None:
    """(which table, the frame) of the first frame from the leaf any table names."""
    for frame in frames:
        for which, table in enumerate(tables):
            if in_table(frame, table):
                return which, frame
    return None


def short(frame: str) -> str:
    """A frame as people read it: its last two name parts, no parameters or templates."""
    name = frame.replace("(anonymous namespace)", "")
    for opener in ("(", "<"):
        cut = name.find(opener)
        if cut > 0:
            name = name[:cut]
    parts = [p for p in name.split("::") if p]
    return "::".join(parts[-2:]) or frame


UNNAMED = "runs "  # how thread_kind words a thread whose frames the table does not name


def thread_kind(frames: Sequence[str], backend: str | None) -> tuple[FrameKind, str]:
    """(waiting or computing, what in words) of one busy thread's frames, leaf first."""
    waits = waiting_frames(backend)
    found = first_known(frames, waits, COMPUTING_FRAMES)
    if found is None:
        leaf = short(frames[0]) if frames else "no frame"
        return FrameKind.COMPUTING, (f"{UNNAMED}{leaf} (frames the table does not name: "
                                     "counted as computing)")
    which, frame = found
    if which == 1:
        return FrameKind.COMPUTING, f"computes in {short(frame)}"
    # The wait's outermost frame the table names, then the leaf of it: "worker -> recv".
    outer = next((f for f in reversed(frames) if in_table(f, waits)), frame)
    inner = short(frames[0]) if frames else short(frame)
    path = short(outer) if short(outer) == inner else f"{short(outer)} -> {inner}"
    return FrameKind.WAITING, f"spins in {path}"


def parked(frames: Sequence[str]) -> bool:
    """A thread asleep in the kernel (a condition variable, a futex): not busy. Its leaf
    says so, or the caller of a raw `syscall` leaf (libstdc++'s futex wait); unless it
    polls under a progress engine that never sleeps (its select() returns at once)."""
    top = list(frames[:2]) if frames and frames[0] in ("syscall", "??") else list(frames[:1])
    if not any(in_table(f, PARKED_FRAMES) for f in top):
        return False
    return not any(in_table(f, POLLING_FRAMES) for f in frames)


# A thread that sits in one of these (its leaf) moves bytes of its own: a file read or
# write, a flush (a checkpoint or a load on slow storage), which explains a quiet wait.
FILE_IO_FRAMES: tuple[str, ...] = (
    "read", "write", "pread64", "pwrite64", "pread", "pwrite", "readv", "writev",
    "fsync", "fdatasync", "sync_file_range", "openat", "open64", "copy_file_range",
    "sendfile", "msync",
)
# Where a quiet rank's main thread waits for MLX (mlx-lm #1834: eval_impl ->
# condition_variable::wait; exo #2173: Fence::wait), besides each backend's wait frames.
QUIET_WAIT_FRAMES: tuple[str, ...] = ("eval_impl", "condition_variable::wait", "wait_for_one")


GPU_FLAT = "GPU time flat"
GPU_ADVANCES = "its GPU time advances (computing on the GPU)"


def gpu_unknown(why: str) -> Reading:
    """A rank on a GPU platform whose GPU time could not be read: it may compute."""
    return Reading(FrameKind.UNKNOWN, f"GPU time unknown: {why}", gpu_unknown=why)


def asleep(stacks: Mapping[int, Sequence[str]] | None, backend: str | None,
           gpu_moved: bool | None = None, main: int | None = None,
           flat: str = GPU_FLAT, unknown: str = "") -> Reading:
    """What a rank with no thread busy waits in, read from every thread's frames.

    Waiting when one of its threads sleeps in a wait the tables name (MLX's eval, an
    event, a fence, its backend's socket or queue) and none sits in a file read or write
    (a checkpoint, a load: the wait explained); computing when one does, or when its GPU
    time advances (macOS); unknown when nothing was read or no thread is in a named wait.
    `flat`: the words for a GPU whose time does not count as work (`gpu_moved` False).
    `unknown`: where the rank computes on a GPU (macOS), why its GPU time is not known
    (`gpu_moved` None): it is then unknown whatever its threads wait in, never a quiet
    hang (the GPU may be at work while every CPU thread sleeps in the eval).
    """
    if gpu_moved:
        return Reading(FrameKind.COMPUTING, GPU_ADVANCES, gpu=True)
    if gpu_moved is None and unknown:
        return gpu_unknown(unknown)
    if not stacks:
        return Reading(FrameKind.UNKNOWN, "no native stack could be read")
    waits = waiting_frames(backend) + QUIET_WAIT_FRAMES
    named: tuple[int, str] | None = None
    for tid, frames in sorted(stacks.items(), key=lambda item: item[0] != main):
        if not frames:
            continue
        leaf = next((f for f in frames[:3] if f not in ("syscall", "??")), frames[0])
        if in_table(leaf, FILE_IO_FRAMES):
            return Reading(FrameKind.COMPUTING, f"thread {tid} sits in {short(leaf)} (a file "
                                                "read or write: its bytes are its own)")
        if named is None:
            outer = next((f for f in reversed(frames) if in_table(f, waits)), None)
            if outer is not None:
                inner = short(frames[0])
                path = short(outer) if short(outer) == inner else f"{short(outer)} -> {inner}"
                named = (tid, path)
    if named is None:
        return Reading(FrameKind.UNKNOWN, "every thread asleep, none in a wait the table names")
    gpu = f"; {flat}" if gpu_moved is False else ""
    who = "main thread" if named[0] == main else f"thread {named[0]}"
    return Reading(FrameKind.WAITING, f"{who} waits in {named[1]}{gpu}")


def classify(stacks: Mapping[int, Sequence[str]] | None, busy: Sequence[int],
             backend: str | None, gpu_moved: bool | None = None,
             flat: str = GPU_FLAT, unknown: str = "") -> Reading:
    """What the rank's busy threads (`busy`: their ids, as the stacks name them) ran.

    Waiting only when every busy thread read spins in a wait frame; computing when
    any of them computes or runs frames the table does not name; unknown when no
    stack was read (no sampler, no symbols, a sample that failed). With no busy id
    known (a sampler whose ids are not the OS's), every thread not parked in the
    kernel is taken as busy.

    `gpu_moved`: whether the process's GPU time advanced since its sample before
    (macOS; None: unknown). Advancing, it computes on the GPU whatever its CPU threads
    spin in (a long prefill under MLX_METAL_FAST_SYNCH spins the CPU in
    `waitUntilSignaledValue`); flat, its waiting threads spin on nothing (said as
    `flat`). `unknown`: where the rank computes on a GPU (macOS), why its GPU time is
    not known: a thread spinning in a wait frame then says nothing (MLX_METAL_FAST_SYNCH
    spins in `waitUntilSignaledValue` while the GPU works): unknown, not waiting.
    """
    if gpu_moved:
        return Reading(FrameKind.COMPUTING, GPU_ADVANCES, gpu=True)
    seen = _classify(stacks, busy, backend)
    if gpu_moved is False and seen.kind == FrameKind.WAITING:
        return Reading(FrameKind.WAITING, f"{seen.what}; {flat}")
    if gpu_moved is None and unknown and seen.kind == FrameKind.WAITING:
        return Reading(FrameKind.UNKNOWN, f"{seen.what}; GPU time unknown: {unknown}",
                       gpu_unknown=unknown)
    return seen


def _classify(stacks: Mapping[int, Sequence[str]] | None, busy: Sequence[int],
              backend: str | None) -> Reading:
    if not stacks:
        return Reading(FrameKind.UNKNOWN, "no native stack could be read")
    threads = [(tid, stacks[tid]) for tid in busy if stacks.get(tid)]
    if not busy:
        threads = [(tid, f) for tid, f in stacks.items() if f and not parked(f)]
    if not threads:
        return Reading(FrameKind.UNKNOWN, "its busy threads were not in the sample")
    seen = [(tid, *thread_kind(frames, backend)) for tid, frames in threads]
    computing = [s for s in seen if s[1] == FrameKind.COMPUTING]
    named = [s for s in computing if not s[2].startswith(UNNAMED)]
    if not computing and not busy:  # every thread read waits: name the one deepest in
        # its wait (MPI's stream thread in ompi_request_default_wait -> opal_progress ->
        # the event loop, not Open MPI's own event thread in the loop alone)
        waits = waiting_frames(backend)
        depth = {tid: sum(in_table(f, waits) for f in frames) for tid, frames in threads}
        seen.sort(key=lambda s: -depth[s[0]])
    tid, kind, what = (named or computing or seen)[0]
    return Reading(kind, f"busy thread {tid} {what}",
                   guessed=kind == FrameKind.COMPUTING and not named)
