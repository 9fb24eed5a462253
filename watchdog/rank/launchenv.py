"""What a rank's launch environment says: backend, rank, world size, job id.

Rank side: stdlib only, never raises. `mlx.launch` (mlx/_distributed_utils/
launch.py) gives each rank, besides MLX_RANK:

- ring:  MLX_HOSTFILE, the path of a file (`mktemp` on each node, so the path
  differs between nodes) holding the JSON list of each rank's "ip:port"s.
- jaccl / jaccl-ring: MLX_IBV_DEVICES, the path of a file (again a per-node
  `mktemp`) holding the JSON matrix of RDMA devices, one row per rank;
  MLX_JACCL_COORDINATOR=<rank 0 ip>:<port>; MLX_JACCL_RING=1 for jaccl-ring.
  JACCL itself reads JACCL_IBV_DEVICES / JACCL_COORDINATOR / JACCL_RANK /
  JACCL_RING first and the MLX_ spellings second (jaccl.cpp Config::from_env);
  the same order is used here.
- nccl: MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT.
- mpi (`mpirun`, or `mlx.launch --backend mpi`, which runs mpirun): no MLX_
  variable at all. Open MPI gives every rank OMPI_COMM_WORLD_RANK/SIZE and, from
  its PMIx server, PMIX_NAMESPACE: the job's name, the same on every node of
  one mpirun and different for the next one (4.x "2135293953", 5.x
  "prterun-<host>-<pid>@1"). MPICH's Hydra gives PMI_RANK, PMI_SIZE and a
  per-rank PMI_FD (or PMI_PORT), and nothing shared between nodes; under
  Slurm, SLURM_JOB_ID and SLURM_STEP_ID are the step's on every node.

exo (exo/worker/engines/mlx/utils_mlx.py) sets MLX_HOSTFILE or MLX_IBV_DEVICES
with MLX_JACCL_COORDINATOR, and MLX_RANK, in its runner's os.environ right before
`mx.distributed.init`, in a file `hosts_<instance id>_<rank>.json` of a temporary
directory deleted after init. Its contents differ by node: a ring hostfile has the
node's own slot as `0.0.0.0:<port>` and the others' addresses as that node reaches
them (non-neighbours `198.51.100.1:0`); a JACCL coordinator is `0.0.0.0:<port>` on
rank 0 and `<rank 0's address>:<port>` elsewhere. So the hook derives the job when
the group forms (at `mx.distributed.init`, not at import), and the instance id in
exo's file name is the job: the same on every node, new for each instance.

Other launches: the job id hashes file contents, never the per-node paths, so every
rank of a launch derives the same id. A hostfile with a wildcard slot (`0.0.0.0`,
`::`), written per node as exo does, is hashed by its ports alone (every node's file
has the same ports, not the same addresses); a wildcard coordinator likewise counts
by its port. Nothing mlx.launch passes differs between two
launches of the same hostfile and ports; a launch-unique id must come from
MLX_WATCHDOG_JOB (`mlx.launch --env MLX_WATCHDOG_JOB=...`). An MPI job's id is
launch-unique already (the PMIx namespace), but for Hydra outside Slurm: there
the ranks of one node agree (they share Hydra's proxy as their parent) and
ranks on different nodes need MLX_WATCHDOG_JOB (`mpiexec -genv ...`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

READ_LIMIT = 1 << 20

Env = Mapping[str, str]


def first(env: Env, *names: str) -> str:
    """The first of `names` that is set and not empty, as JACCL looks them up."""
    for name in names:
        value = env.get(name)
        if value:
            return value
    return ""


def devices_path(env: Env) -> str:
    return first(env, "JACCL_IBV_DEVICES", "MLX_IBV_DEVICES")


def coordinator(env: Env) -> str:
    return first(env, "JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR")


def _number(env: Env, *names: str) -> int | None:
    raw = first(env, *names)
    return int(raw) if raw.isdigit() else None


def mpi(env: Env) -> str:
    """Which MPI launched this process: "openmpi", "mpich" (PMI, e.g. Hydra), or ""."""
    if env.get("OMPI_COMM_WORLD_SIZE") or (env.get("PMIX_NAMESPACE") and env.get("PMIX_RANK")):
        return "openmpi"
    if env.get("PMI_SIZE") and env.get("PMI_RANK"):
        return "mpich"
    return ""


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(READ_LIMIT).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _canonical(text: str | None) -> str:
    """The file's JSON re-dumped (mlx.launch `echo`es it: a trailing newline), else its text."""
    data = _json(text)
    if data is not None:
        return json.dumps(data, sort_keys=True, separators=(",", ":"))
    return (text or "").strip()


WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", "*", ""})
# exo's coordination file (utils_mlx.py): hosts_<instance id>_<rank>.json
EXO_FILE = re.compile(r"hosts_(?P<instance>[A-Za-z0-9._-]{1,128})_(?P<rank>\d{1,6})\.json")


def _split(address: str) -> tuple[str, str]:
    """("host", "port") of "host:port", "[v6]:port" or "v6:port"; ("", address) without a colon."""
    host, sep, port = address.rpartition(":")
    return (host, port) if sep else ("", address)


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


def _ring_part(text: str | None, path: str) -> str:
    """What every rank's hostfile of one launch agrees on: its canonical JSON, or with a
    wildcard slot (a file written per node, exo's way) its ports and slot count."""
    if text is None:
        return "ring:" + path  # unreadable: its path, which still agrees on one node
    slots = _slots(_json(text))
    if slots is not None and any(_split(e)[0] in WILDCARDS for s in slots for e in s):
        ports = sorted({p for s in slots for p in (_split(e)[1] for e in s) if p not in ("", "0")})
        return f"ring-ports:{len(slots)}:{','.join(ports)}"
    return "ring:" + _canonical(text)


def _coordinator_part(address: str) -> str:
    host, port = _split(address)
    return f"coordinator-port:{port}" if host in WILDCARDS else "coordinator:" + address


def exo_instance(env: Env) -> str:
    """exo's instance id from its coordination file's name, "" for another launch. The
    rank in the name must be this rank's (MLX_RANK), so a file named so by chance is not
    taken for exo's."""
    path = env.get("MLX_HOSTFILE") or devices_path(env)
    match = EXO_FILE.fullmatch(os.path.basename(path)) if path else None
    if match is None or match["rank"] != first(env, "JACCL_RANK", "MLX_RANK"):
        return ""
    return match["instance"]


def backend(env: Env) -> str:
    if devices_path(env) or coordinator(env):
        return "jaccl"
    if env.get("MLX_HOSTFILE"):
        return "ring"
    if env.get("NCCL_HOST_IP") and env.get("MLX_WORLD_SIZE"):
        return "nccl"
    if mpi(env):
        return "mpi"
    return ""


def rank(env: Env) -> int:
    kind = backend(env)
    names = {"jaccl": ("JACCL_RANK", "MLX_RANK"),
             "mpi": ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")}.get(kind, ("MLX_RANK",))
    found = _number(env, *names)
    return -1 if found is None else found


def world_size(env: Env) -> int:
    """Ranks in the launch: rows of the device matrix (jaccl), hosts of the hostfile
    (ring), MLX_WORLD_SIZE otherwise; 0 when unknown."""
    kind = backend(env)
    if kind == "jaccl" and devices_path(env):
        data = _json(_read(devices_path(env)))
        return len(data) if isinstance(data, list) else 0
    if kind == "ring":
        data = _json(_read(env["MLX_HOSTFILE"]))
        return len(data) if isinstance(data, list) else 0
    if kind == "mpi":
        return _number(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE") or 0
    size = env.get("MLX_WORLD_SIZE", "")
    return int(size) if size.isdigit() else 0


def _mpi_parts(env: Env, ppid: int | None) -> list[str]:
    """What every rank of one MPI launch shares (see the module's docstring)."""
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


def job_id(env: Env, pid: int, ppid: int | None = None) -> str:
    """MLX_WATCHDOG_JOB, else a hash every rank of the launch computes alike
    (`ppid`, the parent's pid, for an MPI launch that shares nothing else)."""
    if env.get("MLX_WATCHDOG_JOB"):
        return env["MLX_WATCHDOG_JOB"]
    instance = exo_instance(env)
    if instance:
        return "exo-" + instance[:60]  # the record's job field is 64 bytes
    parts = []
    hostfile = env.get("MLX_HOSTFILE")
    if hostfile:
        parts.append(_ring_part(_read(hostfile), hostfile))
    devices = devices_path(env)
    if devices:
        text = _read(devices)
        # An unreadable file: its path, which still agrees on one node.
        parts.append("jaccl:" + (_canonical(text) if text is not None else devices))
    if coordinator(env):
        parts.append(_coordinator_part(coordinator(env)))
    if first(env, "JACCL_RING", "MLX_JACCL_RING"):
        parts.append("jaccl-ring")
    for key in ("MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT"):
        if env.get(key):
            parts.append(f"{key}={env[key]}")
    if not parts:  # an MPI launch of another backend's ranks has its own id already
        parts = _mpi_parts(env, ppid)
    if not parts:
        return f"pid{pid}"  # not a distributed launch: a job of one
    return "j" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:11]
