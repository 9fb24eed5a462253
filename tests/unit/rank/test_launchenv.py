"""JACCL and ring launches recognised from the environment mlx.launch really gives each
rank: mlx's own launcher code (launch_jaccl / launch_ring) builds each rank's launch
script, which bash runs here, `mktemp` files and all; the rank prints what the hook
derives. Ranks of a "node" each get their own temporary files, as on separate Macs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from watchdog.rank import env, hook, launchenv

launch = pytest.importorskip("mlx._distributed_utils.launch")
common = pytest.importorskip("mlx._distributed_utils.common")

# A JACCL hostfile as mlx.distributed_config writes it for a Thunderbolt mesh of
# three Mac Studios (ips for the coordinator, rdma[i][j]: rank i's device to rank j).
JACCL_HOSTS = {
    "backend": "jaccl",
    "envs": ["MLX_METAL_FAST_SYNCH=1"],
    "hosts": [
        {"ssh": "studio-1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en3", "rdma_en4"]},
        {"ssh": "studio-2", "ips": ["10.0.0.2"], "rdma": ["rdma_en3", None, "rdma_en5"]},
        {"ssh": "studio-3", "ips": ["10.0.0.3"], "rdma": ["rdma_en4", "rdma_en5", None]},
    ],
}
RING_HOSTS = [{"ssh": "studio-1", "ips": ["10.0.0.1"]}, {"ssh": "studio-2", "ips": ["10.0.0.2"]}]

PROBE = """
import json, os
from watchdog.rank import env, hook
rank, size = env.env_rank_size(os.environ)
keys = [k for k in os.environ if k.startswith(("MLX_", "JACCL_"))]
print(json.dumps({"job": hook.job_id(), "rank": rank, "size": size,
                  "backend": env.guess_backend(os.environ),
                  "env": {k: os.environ[k] for k in keys}}))
"""


def mlx_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostfile: Any, backend: str,
               port: int = 32323, env: list[str] | None = None) -> list[dict[str, Any]]:
    """Each rank's view, from the scripts mlx.launch would run on each host."""
    path = tmp_path / f"hosts-{backend}.json"
    path.write_text(json.dumps(hostfile))
    hosts = common.Hostfile.from_file(path)
    args = argparse.Namespace(starting_port=port, env=list(hosts.envs) + list(env or []),
                              cwd=None, verbose=False, python=None, backend=backend,
                              connections_per_ip=1)
    captured: list[tuple[Any, ...]] = []
    monkeypatch.setattr(launch, "_launch_with_io",
                        lambda cls, arguments, verbose: captured.extend(a for a, _ in arguments))
    command = [sys.executable, "-c", PROBE]
    {"jaccl": launch.launch_jaccl, "jaccl-ring": launch.launch_jaccl,
     "ring": launch.launch_ring}[backend](argparse.ArgumentParser(), hosts.hosts, args, command)
    views = []
    for rank, _host, python, cwd, files, rank_env, cmd in captured:
        node = tmp_path / f"node{rank}"  # each host's own /tmp
        node.mkdir(exist_ok=True)
        script = launch.RemoteProcess.make_launch_script(rank, python, cwd, files, rank_env,
                                                         cmd, True)
        done = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True,
                              timeout=120, env={"PATH": os.environ["PATH"], "TMPDIR": str(node),
                                                "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
        assert done.returncode == 0, done.stderr
        views.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return views


@pytest.mark.slow
def test_jaccl_mesh_ranks_agree(tmp_path, monkeypatch):
    views = mlx_launch(tmp_path, monkeypatch, JACCL_HOSTS, "jaccl")
    assert [(v["backend"], v["rank"], v["size"]) for v in views] == [
        ("jaccl", 0, 3), ("jaccl", 1, 3), ("jaccl", 2, 3)]
    # What mlx.launch set: a per-node temporary device file, the coordinator, no hostfile.
    paths = {v["env"]["MLX_IBV_DEVICES"] for v in views}
    assert len(paths) == 3  # a different mktemp path on every node...
    assert {v["env"]["MLX_JACCL_COORDINATOR"] for v in views} == {"10.0.0.1:32323"}
    assert all("MLX_HOSTFILE" not in v["env"] and "MLX_JACCL_RING" not in v["env"]
               for v in views)
    jobs = {v["job"] for v in views}
    assert len(jobs) == 1 and jobs.pop().startswith("j")  # ...and one job id all the same


@pytest.mark.slow
def test_jaccl_ring_is_its_own_job(tmp_path, monkeypatch):
    mesh = mlx_launch(tmp_path, monkeypatch, JACCL_HOSTS, "jaccl")
    ring = mlx_launch(tmp_path, monkeypatch, JACCL_HOSTS, "jaccl-ring")
    assert {v["env"]["MLX_JACCL_RING"] for v in ring} == {"1"}
    assert [(v["backend"], v["rank"], v["size"]) for v in ring] == [
        ("jaccl", 0, 3), ("jaccl", 1, 3), ("jaccl", 2, 3)]
    assert len({v["job"] for v in ring}) == 1 and ring[0]["job"] != mesh[0]["job"]


def test_ring_ranks_agree(tmp_path, monkeypatch):
    views = mlx_launch(tmp_path, monkeypatch, RING_HOSTS, "ring")
    assert [(v["backend"], v["rank"], v["size"]) for v in views] == [("ring", 0, 2),
                                                                     ("ring", 1, 2)]
    assert len({v["env"]["MLX_HOSTFILE"] for v in views}) == 2
    assert len({v["job"] for v in views}) == 1


@pytest.mark.slow
def test_another_port_is_another_job(tmp_path, monkeypatch):
    a = mlx_launch(tmp_path, monkeypatch, JACCL_HOSTS, "jaccl", port=32323)
    b = mlx_launch(tmp_path, monkeypatch, JACCL_HOSTS, "jaccl", port=40000)
    assert a[0]["job"] != b[0]["job"]


@pytest.mark.slow
def test_same_hostfile_and_ports_share_a_job_unless_the_launch_names_it(tmp_path, monkeypatch):
    """Nothing mlx.launch passes differs between two launches of one hostfile on the
    same ports (this asserts the documented limit); MLX_WATCHDOG_JOB through
    `mlx.launch --env` (what `mlx-watchdog launch` adds) tells them apart."""
    first = mlx_launch(tmp_path, monkeypatch, JACCL_HOSTS, "jaccl")
    second = mlx_launch(tmp_path, monkeypatch, JACCL_HOSTS, "jaccl")
    assert first[0]["job"] == second[0]["job"]
    named = [mlx_launch(tmp_path, monkeypatch, JACCL_HOSTS, "jaccl",
                        env=[f"MLX_WATCHDOG_JOB=train-{n}"]) for n in (1, 2)]
    assert [{v["job"] for v in launch_} for launch_ in named] == [{"train-1"}, {"train-2"}]


def test_jaccl_spellings_and_their_precedence(tmp_path):
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps([[None, "rdma_en3"], ["rdma_en3", None]]) + "\n")
    mlx = {"MLX_IBV_DEVICES": str(devices), "MLX_JACCL_COORDINATOR": "10.0.0.1:5000",
           "MLX_RANK": "1"}
    bare = {"JACCL_IBV_DEVICES": str(devices), "JACCL_COORDINATOR": "10.0.0.1:5000",
            "JACCL_RANK": "1"}
    for given in (mlx, bare):
        assert env.guess_backend(given) == "jaccl"
        assert env.env_rank_size(given) == (1, 2)
    assert hook.job_id(mlx) == hook.job_id(bare)
    # JACCL reads JACCL_* first (jaccl.cpp Config::from_env): so does the hook.
    both = dict(mlx, JACCL_RANK="0")
    assert env.env_rank_size(both) == (0, 2)
    assert hook.job_id({**mlx, "JACCL_RING": "1"}) != hook.job_id(mlx)
    assert hook.job_id({**mlx, "MLX_JACCL_RING": "1"}) == hook.job_id({**mlx, "JACCL_RING": "1"})


def test_same_devices_written_differently_is_one_job(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text('[[null, "rdma_en3"], ["rdma_en3", null]]\n')
    b.write_text('[[null,"rdma_en3"],["rdma_en3",null]]')
    assert hook.job_id({"MLX_IBV_DEVICES": str(a)}) == hook.job_id({"MLX_IBV_DEVICES": str(b)})


@pytest.mark.parametrize("env, expected", [
    ({}, ("", -1, 0)),
    ({"MLX_RANK": "x"}, ("", -1, 0)),
    ({"MLX_IBV_DEVICES": "/nonexistent/devices"}, ("jaccl", -1, 0)),
    ({"MLX_JACCL_COORDINATOR": "10.0.0.1:5000", "MLX_RANK": "2"}, ("jaccl", 2, 0)),
    ({"MLX_HOSTFILE": "/nonexistent/hosts"}, ("ring", -1, 0)),
    ({"NCCL_HOST_IP": "10.0.0.1", "NCCL_PORT": "12345", "MLX_WORLD_SIZE": "4",
      "MLX_RANK": "3"}, ("nccl", 3, 4)),
])
def test_odd_environments_never_raise(env, expected):
    assert (launchenv.backend(env), launchenv.rank(env), launchenv.world_size(env)) == expected
    job = hook.job_id(env)
    assert job == f"pid{os.getpid()}" if not expected[0] else job.startswith("j")


def test_unreadable_device_file_still_agrees_on_one_node(tmp_path):
    env = {"MLX_IBV_DEVICES": str(tmp_path / "gone.json")}
    assert hook.job_id(env) == hook.job_id(dict(env))
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\xff\xfe not json")
    assert launchenv.world_size({"MLX_IBV_DEVICES": str(garbage)}) == 0


# -- mlx-watchdog launch: a fresh job id per launch, through the real mlx.launch --------

# A file per rank, as for mpirun below: a launcher's forwarded stdout may run lines together.
LAUNCH_PROBE = ("import json, os, sys; from watchdog.rank import hook; "
                "open(os.path.join(sys.argv[1], os.environ['MLX_RANK']), 'w').write("
                "json.dumps([os.environ['MLX_RANK'], hook.job_id()]))")


def watchdog_launch(*extra: str, env: dict[str, str] | None = None
                    ) -> tuple[dict[str, str], str]:
    """Rank -> job id, printed by two real local ranks of `mlx-watchdog launch -n 2`."""
    with tempfile.TemporaryDirectory() as state:  # the launcher journals there
        out = Path(state, "views")
        out.mkdir()
        done = subprocess.run(
            [sys.executable, "-m", "watchdog.cli", "launch", "-n", "2", *extra, "--",
             sys.executable, "-c", LAUNCH_PROBE, str(out)],
            capture_output=True, text=True, timeout=180,
            env=dict(os.environ, MLX_WATCHDOG_STATE_DIR=state, **(env or {})))
        assert done.returncode == 0, done.stderr
        jobs = dict(json.loads(p.read_text()) for p in out.iterdir())
    return jobs, done.stderr


@pytest.mark.slow
def test_mlx_watchdog_launch_gives_each_launch_its_own_job():
    first, said = watchdog_launch()
    second, _ = watchdog_launch()
    assert set(first) == set(second) == {"0", "1"}
    assert len(set(first.values())) == 1 and len(set(second.values())) == 1
    assert first["0"] != second["0"] and first["0"].startswith("launch-")
    assert f"mlx-watchdog: job {first['0']}" in said


@pytest.mark.slow
def test_mlx_watchdog_launch_keeps_a_job_the_user_named(monkeypatch):
    jobs, _ = watchdog_launch("--env", "MLX_WATCHDOG_JOB=train-7")
    assert set(jobs.values()) == {"train-7"}
    monkeypatch.delenv("MLX_WATCHDOG_JOB", raising=False)
    jobs, _ = watchdog_launch(env={"MLX_WATCHDOG_JOB": "from-env"})
    assert set(jobs.values()) == {"from-env"}


def test_the_launch_puts_the_job_before_the_command(tmp_path):
    from watchdog.daemon.config import Settings
    from watchdog.launch.launcher import JOB_ENV, named_env
    from watchdog.launch.supervisor import Plan, Supervisor

    args = ["--hostfile", "h.json", "--", "python", "t.py", "--env", "MLX_WATCHDOG_JOB=not-ours"]
    settings = Settings(dir=str(tmp_path), state_dir=str(tmp_path))
    plan = Plan(mlx_launch="/v/bin/mlx.launch", args=args, job="J",
                job_given=named_env(args, JOB_ENV) is not None, record_dir=str(tmp_path),
                settings=settings)
    assert Supervisor(plan).argv(1) == [
        "/v/bin/mlx.launch", "--env", "MLX_WATCHDOG_JOB=J", "--env",
        f"MLX_WATCHDOG_DIR={tmp_path}", "--env", "MLX_WATCHDOG_ATTEMPT=1",
        "--hostfile", "h.json", "--", "python", "t.py", "--env", "MLX_WATCHDOG_JOB=not-ours"]
    assert named_env(["--env=MLX_WATCHDOG_JOB=x", "t.py"], JOB_ENV) == "x"


def test_a_device_file_that_is_not_json_is_hashed_as_text(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_text("rdma_en3 rdma_en4\n")
    b.write_text("rdma_en3 rdma_en4")
    c.write_text("rdma_en5")
    jobs = [hook.job_id({"MLX_IBV_DEVICES": str(p)}) for p in (a, b, c)]
    assert jobs[0] == jobs[1] != jobs[2]


# -- MPI: what mpirun (Open MPI) and mpiexec (MPICH's Hydra) give each rank -----------

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp",
          "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
# Each rank writes its view to a file of its own: mpirun forwards the ranks' stdout in
# whatever chunks it read, so two ranks' lines can arrive run together.
MPI_PROBE = ("import json, os, sys; from watchdog.rank import env, hook; "
             "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').write(json.dumps("
             "[hook.job_id(), *env.env_rank_size(os.environ), env.guess_backend(os.environ)]))")


def mpirun_views(size: int = 2) -> list[list[Any]]:
    """[job, rank, size, backend] of each rank of one real `mpirun -np SIZE`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_", "OMPI_", "PMI"))}
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([*MPIRUN, "-np", str(size), sys.executable, "-c", MPI_PROBE, out],
                              capture_output=True, text=True, timeout=120, env=clean)
        assert done.returncode == 0, done.stderr
        return sorted(json.loads(p.read_text()) for p in Path(out).iterdir())


@pytest.mark.slow
def test_ranks_of_one_mpirun_agree_and_the_next_mpirun_is_another_job():
    first, second = mpirun_views(), mpirun_views()
    assert [v[1:] for v in first] == [[0, 2, "mpi"], [1, 2, "mpi"]]
    assert len({v[0] for v in first}) == 1 and first[0][0].startswith("j")
    assert first[0][0] != second[0][0]  # PMIX_NAMESPACE is launch-unique


# Open MPI 5 (PRRTE) names the namespace after mpirun's host and pid.
OMPI5 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
         "PMIX_NAMESPACE": "prterun-studio-1-4242@1", "PMIX_RANK": "1"}
# MPICH's Hydra (mpiexec.hydra): PMI_RANK, PMI_SIZE, a per-rank PMI_FD.
HYDRA = {"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_FD": "7", "MPI_LOCALRANKID": "1"}


def test_open_mpi_5_and_a_bare_pmix_namespace():
    assert (launchenv.backend(OMPI5), launchenv.rank(OMPI5), launchenv.world_size(OMPI5)) == (
        "mpi", 1, 4)
    other_rank = dict(OMPI5, OMPI_COMM_WORLD_RANK="0", PMIX_RANK="0")
    assert launchenv.job_id(OMPI5, 10, 1) == launchenv.job_id(other_rank, 11, 2)  # any node
    assert launchenv.job_id(OMPI5, 10) != launchenv.job_id(
        dict(OMPI5, PMIX_NAMESPACE="prterun-studio-1-4243@1"), 10)
    pmix = {"PMIX_NAMESPACE": "ns7", "PMIX_RANK": "2"}  # another PMIx launcher: no size
    assert (launchenv.backend(pmix), launchenv.rank(pmix), launchenv.world_size(pmix)) == (
        "mpi", 2, 0)


def test_mpich_hydra_agrees_within_a_node_and_slurm_across_nodes():
    assert (launchenv.backend(HYDRA), launchenv.rank(HYDRA), launchenv.world_size(HYDRA)) == (
        "mpi", 3, 4)
    mate = dict(HYDRA, PMI_RANK="2", PMI_FD="6")
    # Nothing Hydra passes is shared between nodes: ranks agree through their proxy.
    assert launchenv.job_id(HYDRA, 100, 50) == launchenv.job_id(mate, 101, 50)
    assert launchenv.job_id(HYDRA, 100, 50) != launchenv.job_id(HYDRA, 100, 51)
    slurm = dict(HYDRA, SLURM_JOB_ID="881", SLURM_STEP_ID="0")
    assert launchenv.job_id(slurm, 100, 50) == launchenv.job_id(dict(slurm, PMI_RANK="0"), 9, 8)
    assert launchenv.job_id(slurm, 1, 2) != launchenv.job_id(dict(slurm, SLURM_STEP_ID="1"), 1, 2)
    assert launchenv.job_id(dict(HYDRA, MLX_WATCHDOG_JOB="train"), 1, 2) == "train"


def test_an_mlx_backend_launched_by_mpirun_keeps_its_own_identity(tmp_path):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([["10.0.0.1:5000"], ["10.0.0.2:5000"]]))
    ring = dict(OMPI5, MLX_HOSTFILE=str(hostfile), MLX_RANK="0")
    assert (launchenv.backend(ring), launchenv.rank(ring), launchenv.world_size(ring)) == (
        "ring", 0, 2)
    assert launchenv.job_id(ring, 1) == launchenv.job_id({"MLX_HOSTFILE": str(hostfile)}, 2)


@pytest.mark.parametrize("env, expected", [
    ({"PMI_RANK": "x", "PMI_SIZE": "2"}, ("mpi", -1, 2)),
    ({"OMPI_COMM_WORLD_SIZE": "two"}, ("mpi", -1, 0)),
    ({"PMIX_NAMESPACE": "", "PMIX_RANK": "0"}, ("", -1, 0)),
    ({"PMI_SIZE": "2"}, ("", -1, 0)),
])
def test_odd_mpi_environments_never_raise(env, expected):
    assert (launchenv.backend(env), launchenv.rank(env), launchenv.world_size(env)) == expected
    assert launchenv.job_id(env, 5) == "pid5"  # nothing shared: a job of one
