"""One process as a probe sampled it: the plain data the OS seam (`probes/`) returns and
the judges (`judge/`) read. Data only, below both, so the judges never import the seam."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessSample:
    """A process at one sample: its identity, its threads' CPU time, its I/O."""

    pid: int
    start_time: float  # psutil create_time, epoch seconds: with pid, the identity
    uid: int  # real uid
    status: str  # psutil status: "running", "sleeping", "stopped", "tracing-stop", "zombie"...
    threads: tuple[tuple[int, float], ...]  # (thread id, user+system cpu seconds)
    # The same threads' system (kernel) cpu seconds: a thread polling sockets
    # spends its time in the kernel, one computing spends it in user space.
    system: tuple[tuple[int, float], ...] = ()
    main_tid: int | None = None  # which of `threads` is the main thread; None: unknown
    # True when thread ids are the OS ids Python's `threading.get_native_id()`
    # reports (Linux tids), so they can be matched against the record's table
    # of Python threads; False when they are list positions (psutil on macOS).
    native_ids: bool = False
    # Start in clock ticks since boot, as the kernel keeps it (Linux; 0 elsewhere).
    # Unlike start_time it does not move when the wall clock is stepped.
    start_ticks: int = 0
    # (thread id, seconds it wanted a core: on one, or waiting in the run queue for
    # one) per thread, where the OS keeps it (Linux schedstat); () elsewhere. A thread
    # that spins wants a core all the time however busy the machine is, while the
    # share of a core it gets falls with the load.
    demand: tuple[tuple[int, float], ...] = ()
    # Every uid of the process: real, effective, saved, and on Linux the
    # filesystem uid; () when unknown. A setuid process (`su`, `sudo`) keeps its
    # caller's real uid: by that alone it would pass for the caller's rank.
    uids: tuple[int, ...] = ()
    # False when the kernel marks it not dumpable (setuid, or PR_SET_DUMPABLE 0):
    # it must not be traced or signalled for its user; None when unknown.
    dumpable: bool | None = None
    # Bytes the process has read and written so far, every thread and every kind of
    # file (storage, a pipe, a network mount): /proc/<pid>/io's rchar and wchar on
    # Linux, proc_pid_rusage's disk bytes on macOS; None when unknown. A checkpoint
    # that writes moves them, one stuck on storage that never answers does not.
    io: tuple[int, int] | None = None
    # Major page faults so far (pages read back from storage: memory pressure), from
    # /proc/<pid>/stat on Linux; None when unknown.
    major_faults: int | None = None
    # Seconds the process's threads spent runnable, waiting for a core, so far: macOS's
    # ri_runnable_time (proc_pid_rusage v4), where no thread's own is kept (no `demand`);
    # None when unknown or where `demand` is.
    runnable: float | None = None
    # The sum of the offsets of the process's open files, where the disk counters miss
    # bytes (macOS: ri_diskio counts none to a FIFO or a network mount, while every read
    # and write through a descriptor advances its offset); None where not read.
    offsets: int | None = None
    # The process whose thread `pid` is, when it names a thread that does not lead its
    # group (Linux: /proc/<tid> answers as a process does); 0 for a process. A record
    # names a process: one naming a thread is no rank.
    thread_of: int = 0
    # Why its threads could not be read, when none were ("": read, or none to read):
    # every hang of such a rank waits for the blocked deadline, which is said.
    threads_error: str = ""
    # Who traces the process (Linux: /proc/<pid>/status TracerPid; macOS: pbi_flags'
    # PROC_FLAG_TRACED, the tracer then its parent, pbi_ppid): its pid, 0 for none, None
    # when unknown; its name; and whether it is the reading process's own descendant (the
    # daemon's stack sampler: gdb, `sample`), None when that could not be told.
    tracer: int | None = None
    tracer_name: str = ""
    tracer_own: bool | None = None


@dataclass(frozen=True)
class GpuPower:
    """The GPU at one sample (macOS `powermetrics --samplers gpu_power`: probes/
    powermetrics.py): the share of the interval it was active, and its power; the
    whole GPU's, not one process's (judge/gpuwork.py reads it)."""

    active_percent: float
    milliwatts: float
    frequency_mhz: float | None = None
