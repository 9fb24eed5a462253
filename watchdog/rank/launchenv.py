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

The job id hashes file contents, never the per-node paths, so every rank of a
launch derives the same id. Nothing mlx.launch passes differs between two
launches of the same hostfile and ports; a launch-unique id must come from
MLX_WATCHDOG_JOB (`mlx.launch --env MLX_WATCHDOG_JOB=...`).
"""

from __future__ import annotations

import hashlib
import json
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


def backend(env: Env) -> str:
    if devices_path(env) or coordinator(env):
        return "jaccl"
    if env.get("MLX_HOSTFILE"):
        return "ring"
    if env.get("NCCL_HOST_IP") and env.get("MLX_WORLD_SIZE"):
        return "nccl"
    return ""


def rank(env: Env) -> int:
    raw = first(env, "JACCL_RANK", "MLX_RANK") if backend(env) == "jaccl" else env.get(
        "MLX_RANK", "")
    return int(raw) if raw.isdigit() else -1


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
    size = env.get("MLX_WORLD_SIZE", "")
    return int(size) if size.isdigit() else 0


def job_id(env: Env, pid: int) -> str:
    """MLX_WATCHDOG_JOB, else a hash every rank of the launch computes alike."""
    if env.get("MLX_WATCHDOG_JOB"):
        return env["MLX_WATCHDOG_JOB"]
    parts = []
    hostfile = env.get("MLX_HOSTFILE")
    if hostfile:
        text = _read(hostfile)
        parts.append("ring:" + (_canonical(text) if text is not None else hostfile))
    devices = devices_path(env)
    if devices:
        text = _read(devices)
        # An unreadable file: its path, which still agrees on one node.
        parts.append("jaccl:" + (_canonical(text) if text is not None else devices))
    if coordinator(env):
        parts.append("coordinator:" + coordinator(env))
    if first(env, "JACCL_RING", "MLX_JACCL_RING"):
        parts.append("jaccl-ring")
    for key in ("MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT"):
        if env.get(key):
            parts.append(f"{key}={env[key]}")
    if not parts:
        return f"pid{pid}"  # not a distributed launch: a job of one
    return "j" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:11]
