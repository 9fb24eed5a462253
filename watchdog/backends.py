"""Every distributed backend the watchdog knows, in one table.

An entry says how a rank of that backend is recognised from its launch
environment, where its rank and world size come from, what every rank of one
launch shares (the parts of the job id), how its wait on a peer behaves, and
whether the daemon may probe its links. The hook reads it through
watchdog/rank/launchenv.py (which adds what is not a backend's: MLX_WATCHDOG_JOB
and exo's instance); the judge (daemon/judge) and the data-link probe read the
wait and the links by the name a rank's record gives.

Contract level: stdlib only, never raises on any environment (the rank side
imports it). What each launcher sets (mlx.launch, mpirun, exo) is told in
watchdog/rank/launchenv.py's docstring.

To add a backend: one `Backend(...)` in BACKENDS, with at most a function of its
own for what its environment gives only through a file (its size, its job's
parts). Table order is the order the job id hashes the parts in: append, never
reorder (a reordered table gives every launch another job id).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Env = Mapping[str, str]

READ_LIMIT = 1 << 20
WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", "*", ""})


class Spin(enum.Enum):
    """Where a rank's thread burns its CPU while it waits on a peer."""

    KERNEL = "kernel"  # it polls sockets: mostly system time, unlike computation
    USER = "user"  # it polls in user space (a completion queue, a progress engine):
    # measured ~100% user, 0% system with a peer frozen, as computation looks


@dataclass(frozen=True)
class Backend:
    """One distributed backend, as every part needs to know it: how its ranks are
    launched and recognised, what names their job, how a wait on a peer burns CPU, and
    its native wait frames."""
    name: str  # the record's backend field, as mx.distributed.init(backend=...) names it
    launched_by: str  # who starts its ranks and what they are given (documentation)
    recognised: Callable[[Env], bool]  # does this environment launch a rank of it?
    rank_from: tuple[str, ...]  # the variables holding the rank, the first set one wins
    size: Callable[[Env], int]  # ranks in the launch; 0 when unknown
    # What every rank of one launch shares, from whatever of it is set (called for every
    # backend, recognised or not: a launch's variables all count); the second argument
    # is the parent's pid, for a launch that shares nothing else.
    job_parts: Callable[[Env, int | None], list[str]]
    job_parts_alone: bool = False  # its parts count only when no other backend's do
    outranks: tuple[str, ...] = ()  # backends it names a rank over when both are recognised
    wait_spins: Spin = Spin.USER  # how its wait on a peer burns CPU (the judge reads it)
    links_probed: bool = False  # its data links are TCP sockets the daemon may connect to
    # Its collectives' bytes cross the rank's TCP sockets, so sockets whose queues stand
    # still show that nothing moves (the wedge's rule). False: they move elsewhere (RDMA,
    # NVLink), and quiet sockets are no evidence (docs/limits.md).
    bytes_on_sockets: bool = True
    # mx.distributed functions of this backend alone, wrapped as collectives (each
    # needs an op code in watchdog/record's OP_CODE); the shared ones are in rank/patches.py.
    entry_points: tuple[str, ...] = ()
    # Native frames of its wait on a peer: a busy thread running one of these spins on
    # nothing of its own (judge/frames.py); with WAITING_FRAMES, what every backend shares.
    waiting_frames: tuple[str, ...] = ()


# -- what a busy thread runs: its native frames, waiting or computing -------------------
#
# Data, read by judge/frames.py. A thread's frames are read from its leaf up; the first
# frame named in either table decides. A name with "::" (or another mark) matches where
# it appears in a frame; a bare C name matches the frame's own name, its libc or
# glibc-internal spelling (`__libc_recv`, `__GI___poll`), or the last part of a
# qualified name. A thread whose frames match neither table computes: never end a
# rank on a guess.

WAITING_FRAMES: tuple[str, ...] = (
    # MLX's events and fences: a CPU thread waiting on a stream or on the GPU
    # (`waitUntilSignaledValue` spins under MLX_METAL_FAST_SYNCH: mlx #3830).
    "Event::wait", "waitUntilSignaledValue", "Fence::wait", "AtomicEvent::wait",
    "array::wait",
)
COMPUTING_FRAMES: tuple[str, ...] = (
    # BLAS and LAPACK (OpenBLAS, Accelerate, MKL) and MLX's CPU kernels.
    "sgemm_", "dgemm_", "sgemv_", "cblas_", "gemm_", "mkl_", "vDSP_", "BNNS",
    "mlx::core::matmul", "Matmul::eval", "::eval_cpu", "mlx::core::cpu::", "simd::",
    # Metal and CUDA encoding: the CPU building GPU work.
    "::eval_gpu", "mlx::core::metal::", "CommandEncoder", "MTLCompute", "MTLCommandBuffer",
    "cublas", "cudnn", "cuLaunchKernel",
    # Python running the user's own code.
    "_PyEval_EvalFrameDefault", "PyEval_EvalFrame",
)
# Frames of a thread parked in the kernel (not spinning): such a thread is not busy,
# whatever its caller; skipped when a sampler cannot tell busy threads apart (macOS).
PARKED_FRAMES: tuple[str, ...] = (
    "futex_wait", "__futex_abstimed_wait_common64", "pthread_cond_wait",
    "pthread_cond_timedwait", "__psynch_cvwait", "__psynch_mutexwait", "__semwait_signal",
    "mach_msg2_trap", "mach_msg_trap", "__workq_kernreturn", "__ulock_wait", "__ulock_wait2",
    "kevent", "kevent64", "epoll_wait", "nanosleep", "__select", "clock_nanosleep",
    "do_futex_wait", "sem_wait", "_M_futex_wait_until", "__wait4",
)
# Frames of a progress engine that polls without ever sleeping: a thread under one is
# busy whatever its leaf, even a parked frame's. Open MPI's `opal_progress` runs its
# event loop non-blocking (gdb of a wedged rank here: poll(..., timeout=0) under it);
# on a Mac its event library polls with select() or kqueue (Open MPI's event component:
# select by default on OS X), so a `sample` of the spinning thread may end in
# `__select` or `kevent`. (MPICH's progress may block in poll: not listed.)
POLLING_FRAMES: tuple[str, ...] = ("opal_progress",)


# -- reading a launch's variables and files ------------------------------------------


def first(env: Env, *names: str) -> str:
    """The first of `names` that is set and not empty, as JACCL looks them up."""
    for name in names:
        value = env.get(name)
        if value:
            return value
    return ""


def number(env: Env, *names: str) -> int | None:
    """The first of `names` set in `env`, as an int; None when unset or not a number."""
    raw = first(env, *names)
    return int(raw) if raw.isdigit() else None


def read(path: str) -> str | None:
    """A launch file's text (at most `READ_LIMIT` bytes), or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(READ_LIMIT).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def parse_json(text: str | None) -> Any:
    """`text` parsed as JSON, or None when there is none or it is not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def canonical(text: str | None) -> str:
    """The file's JSON re-dumped (mlx.launch `echo`es it: a trailing newline), else its text."""
    data = parse_json(text)
    if data is not None:
        return json.dumps(data, sort_keys=True, separators=(",", ":"))
    return (text or "").strip()


def split_address(address: str) -> tuple[str, str]:
    """("host", "port") of "host:port", "[v6]:port" or "v6:port"; ("", address) without a colon."""
    host, sep, port = address.rpartition(":")
    return (host, port) if sep else ("", address)


def mlx_world_size(env: Env) -> int:
    """`MLX_WORLD_SIZE` as an int, 0 when unset or not a number."""
    size = env.get("MLX_WORLD_SIZE", "")
    return int(size) if size.isdigit() else 0


def _rows(path: str) -> int:
    data = parse_json(read(path))
    return len(data) if isinstance(data, list) else 0


# -- ring: mlx.launch's default, exo's ring instances -----------------------------------


def _slots(data: Any) -> list[list[str]] | None:
    """A ring hostfile's slots: one list of "ip:port" per rank (a bare string is one)."""
    if not isinstance(data, list):
        return None
    slots = []
    for slot in data:
        entries = [slot] if isinstance(slot, str) else slot
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            return None
        slots.append(entries)
    return slots


def _ring_parts(env: Env, ppid: int | None) -> list[str]:
    """What every rank's hostfile of one launch agrees on: its canonical JSON, or with a
    wildcard slot (a file written per node, exo's way) its ports and slot count."""
    path = env.get("MLX_HOSTFILE")
    if not path:
        return []
    text = read(path)
    if text is None:
        return ["ring:" + path]  # unreadable: its path, which still agrees on one node
    slots = _slots(parse_json(text))
    if slots is not None and any(split_address(e)[0] in WILDCARDS for s in slots for e in s):
        ports = sorted({p for s in slots for p in (split_address(e)[1] for e in s)
                        if p not in ("", "0")})
        return [f"ring-ports:{len(slots)}:{','.join(ports)}"]
    return ["ring:" + canonical(text)]


# -- jaccl (and jaccl-ring): RDMA over Thunderbolt ---------------------------------------


def devices_path(env: Env) -> str:
    """The JACCL device file's path named by the environment ("" when unset)."""
    return first(env, "JACCL_IBV_DEVICES", "MLX_IBV_DEVICES")


def coordinator(env: Env) -> str:
    """The JACCL coordinator's address named by the environment ("" when unset)."""
    return first(env, "JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR")


def _jaccl_size(env: Env) -> int:
    """Rows of the device matrix; MLX_WORLD_SIZE without one."""
    path = devices_path(env)
    return _rows(path) if path else mlx_world_size(env)


def _jaccl_parts(env: Env, ppid: int | None) -> list[str]:
    parts = []
    devices = devices_path(env)
    if devices:
        text = read(devices)
        # An unreadable file: its path, which still agrees on one node.
        parts.append("jaccl:" + (canonical(text) if text is not None else devices))
    address = coordinator(env)
    if address:
        host, port = split_address(address)
        parts.append(f"coordinator-port:{port}" if host in WILDCARDS
                     else "coordinator:" + address)
    if first(env, "JACCL_RING", "MLX_JACCL_RING"):
        parts.append("jaccl-ring")
    return parts


# -- nccl: CUDA ------------------------------------------------------------------------


def _nccl_parts(env: Env, ppid: int | None) -> list[str]:
    return [f"{key}={env[key]}" for key in ("MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT")
            if env.get(key)]


# -- mpi: mpirun (Open MPI, MPICH's Hydra), or mlx.launch --backend mpi ------------------


def mpi(env: Env) -> str:
    """Which MPI launched this process: "openmpi", "mpich" (PMI, e.g. Hydra), or ""."""
    if env.get("OMPI_COMM_WORLD_SIZE") or (env.get("PMIX_NAMESPACE") and env.get("PMIX_RANK")):
        return "openmpi"
    if env.get("PMI_SIZE") and env.get("PMI_RANK"):
        return "mpich"
    return ""


def _mpi_parts(env: Env, ppid: int | None) -> list[str]:
    """What every rank of one MPI launch shares (rank/launchenv.py's docstring)."""
    if not mpi(env):
        return []
    if env.get("PMIX_NAMESPACE"):
        return ["mpi:" + env["PMIX_NAMESPACE"]]
    if env.get("SLURM_JOB_ID"):
        return [f"mpi:slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"]
    if env.get("OMPI_MCA_orte_hnp_uri"):  # Open MPI without PMIx: mpirun's own address
        return ["mpi:" + env["OMPI_MCA_orte_hnp_uri"]]
    # Hydra outside Slurm: nothing shared between nodes; the ranks of one node
    # share their parent, Hydra's proxy.
    return [f"mpi:hydra:{ppid}:{env.get('PMI_SIZE', '')}"] if ppid else []


# -- the table -----------------------------------------------------------------------

BACKENDS: tuple[Backend, ...] = (
    Backend(
        name="ring",
        launched_by="mlx.launch (its default), exo's ring instances: MLX_HOSTFILE, MLX_RANK",
        recognised=lambda env: bool(env.get("MLX_HOSTFILE")),
        rank_from=("MLX_RANK",),
        size=lambda env: _rows(env.get("MLX_HOSTFILE", "")),
        job_parts=_ring_parts,
        wait_spins=Spin.KERNEL,  # it polls its neighbours' sockets (~85% system time)
        links_probed=True,  # its listeners close after init: a connect upsets nothing
        # Its socket worker and the calls it spins on (recorded: tests/support/data/gdb_*).
        waiting_frames=("SocketThread::worker", "recv", "send", "poll", "recvmsg",
                        "sendmsg", "recvfrom", "sendto", "select", "ppoll",
                        "RingGroup::all_reduce_impl", "ring::RingGroup::send",
                        "ring::RingGroup::recv"),
    ),
    Backend(
        name="jaccl",
        launched_by="mlx.launch --backend jaccl / jaccl-ring, exo's JACCL instances: "
                    "MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR, MLX_RANK (JACCL_* first)",
        recognised=lambda env: bool(devices_path(env) or coordinator(env)),
        rank_from=("JACCL_RANK", "MLX_RANK"),
        size=_jaccl_size,
        job_parts=_jaccl_parts,
        outranks=("ring",),  # JACCL's own variables name it over a hostfile left set
        bytes_on_sockets=False,  # RDMA over Thunderbolt: its TCP side channel is idle
        # Its completion-queue polls (mlx #3910: 1156 of 1304 samples in tbt_poll_cq).
        waiting_frames=("MeshImpl::recv", "MeshImpl::send", "RingImpl::recv",
                        "RingImpl::send", "tbt_poll_cq", "tbt_poll_qp_recv",
                        "ibv_poll_cq", "ring_indicies_err", "jaccl::SideChannel"),
    ),
    Backend(
        name="nccl",
        launched_by="mlx.launch --backend nccl: MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT",
        bytes_on_sockets=False,  # NVLink or InfiniBand, its sockets only bootstrap
        recognised=lambda env: bool(env.get("NCCL_HOST_IP") and env.get("MLX_WORLD_SIZE")),
        rank_from=("MLX_RANK",),
        size=mlx_world_size,
        job_parts=_nccl_parts,
        waiting_frames=("ncclGroupEnd", "ncclProxyProgress", "cudaStreamSynchronize",
                        "cuStreamSynchronize", "cudaEventSynchronize"),
    ),
    Backend(
        name="mpi",
        launched_by="mpirun/mpiexec (Open MPI: OMPI_COMM_WORLD_*, PMIX_*; MPICH's Hydra: "
                    "PMI_*), or mlx.launch --backend mpi, which runs mpirun",
        recognised=lambda env: bool(mpi(env)),
        rank_from=("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"),
        size=lambda env: number(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE") or 0,
        job_parts=_mpi_parts,
        # An MLX backend's ranks started by mpirun keep that backend's identity.
        job_parts_alone=True,
        # Its wait spins in user space over shared memory (vader); over TCP 70-75% of
        # it is system time, yet not taken as ring's: a rank may wait on both
        # (docs/limits.md). Its progress engine (Open MPI, MPICH) and the waits that spin it.
        waiting_frames=("opal_progress", "ompi_request_default_wait",
                        "ompi_request_wait_completion", "ompi_sync_wait_mt", "MPI_Wait",
                        "PMPI_Wait", "mca_pml_ob1_recv", "mca_pml_ob1_send",
                        "mca_btl_tcp_", "mca_btl_sm_", "mca_btl_vader_", "MPID_Progress",
                        "MPIDI_", "MPIR_Wait",
                        # Open MPI's own event thread (opal's async progress thread),
                        # in libevent's loop: it waits on MPI's sockets, its leaf a poll
                        # or select. Where busy threads cannot be told (a Mac's `sample`)
                        # it is read with the rest, and must not read as computing.
                        "event_base_loop", "opal_libevent2022_event_base_loop"),
    ),
)

# A rank whose launch names no backend: its rank and size as mlx.launch spells them.
DEFAULT_RANK_FROM = ("MLX_RANK",)


def recognise(env: Env) -> Backend | None:
    """The backend this environment launches a rank of, None for none known."""
    found = [b for b in BACKENDS if b.recognised(env)]
    outranked = {name for b in found for name in b.outranks}
    return next((b for b in found if b.name not in outranked), None)


def by_name(name: str | None) -> Backend | None:
    """The entry of the backend a record names ("ring", ...), None for another name."""
    return next((b for b in BACKENDS if b.name == name), None)


def spins_in_kernel(name: str | None) -> bool:
    """Does this backend's wait on a peer poll in the kernel (so that a thread busy in
    user space is computing, not waiting)?"""
    backend = by_name(name)
    return backend is not None and backend.wait_spins is Spin.KERNEL


def waiting_frames(name: str | None) -> tuple[str, ...]:
    """The frames of a wait on a peer for this backend: its own and every backend's."""
    backend = by_name(name)
    return (backend.waiting_frames if backend is not None else ()) + WAITING_FRAMES


def bytes_on_sockets(name: str | None) -> bool:
    """Whether quiet sockets can show that nothing moves for `name`'s ranks (an unknown
    backend: as before, yes)."""
    backend = by_name(name)
    return backend is None or backend.bytes_on_sockets


def links_probed(name: str | None) -> bool:
    """Whether the backend named may have its data links probed (False for an unknown one)."""
    backend = by_name(name)
    return backend is not None and backend.links_probed


def entry_points() -> tuple[str, ...]:
    """Every backend's own mx.distributed functions, each once."""
    return tuple(dict.fromkeys(n for b in BACKENDS for n in b.entry_points))
