"""What a rank's launch environment says: backend, rank, world size, job id.

Rank side: stdlib only, never raises. Each backend's part (how it is recognised,
its rank, size and job parts) is its entry in watchdog/backends.py; this module
adds what belongs to no backend: MLX_WATCHDOG_JOB, exo's instance, a job of one.

`mlx.launch` (mlx/_distributed_utils/
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
import os
import re
from collections.abc import Mapping

from watchdog import backends
from watchdog.backends import devices_path, first

Env = Mapping[str, str]

# exo's coordination file (utils_mlx.py): hosts_<instance id>_<rank>.json
EXO_FILE = re.compile(r"hosts_(?P<instance>[A-Za-z0-9._-]{1,128})_(?P<rank>\d{1,6})\.json")


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
    """The backend recognised from the launch environment ("" when none is)."""
    found = backends.recognise(env)
    return found.name if found else ""


def rank(env: Env) -> int:
    """The rank the launch environment gives, -1 when it gives none."""
    found = backends.recognise(env)
    number = backends.number(env, *(found.rank_from if found else backends.DEFAULT_RANK_FROM))
    return -1 if number is None else number


def world_size(env: Env) -> int:
    """Ranks in the launch, as its backend tells (backends.py); MLX_WORLD_SIZE for a
    launch of none known; 0 when unknown."""
    found = backends.recognise(env)
    return found.size(env) if found else backends.mlx_world_size(env)


def job_id(env: Env, pid: int, ppid: int | None = None) -> str:
    """MLX_WATCHDOG_JOB, else a hash every rank of the launch computes alike
    (`ppid`, the parent's pid, for an MPI launch that shares nothing else)."""
    if env.get("MLX_WATCHDOG_JOB"):
        return env["MLX_WATCHDOG_JOB"]
    instance = exo_instance(env)
    if instance:
        return "exo-" + instance[:60]  # the record's job field is 64 bytes
    parts = [p for b in backends.BACKENDS if not b.job_parts_alone for p in b.job_parts(env, ppid)]
    if not parts:  # e.g. an MPI launch of another backend's ranks has that one's id
        parts = [p for b in backends.BACKENDS if b.job_parts_alone for p in b.job_parts(env, ppid)]
    if not parts:
        return f"pid{pid}"  # not a distributed launch: a job of one
    return "j" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:11]
