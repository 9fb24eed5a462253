"""One job id for every rank of a launch, whatever launched it, derived from what each rank
sees as the group forms; and two launches never share one by accident.

Each launch style is written here as its launcher writes it on each node (files in each
node's own temporary directory, the variables it sets): exo's ring and JACCL instances
(exo/worker/engines/mlx/utils_mlx.py and master/placement_utils.py at b5375f8), a
hostfile written by hand, and MLX_WATCHDOG_JOB. mlx.launch and mpirun are in
test_launchenv.py, from mlx's own launcher code and real MPI environments."""

from __future__ import annotations

import json
from pathlib import Path

from watchdog.rank import launchenv

EXO_INSTANCE = "5f0c2a4e-7d3b-4c8e-9a61-2b7f1d0e8c33"


def job(env: dict[str, str], pid: int = 4242) -> str:
    return launchenv.job_id(env, pid, ppid=1)


def exo_ring(tmp_path: Path, ranks: int, port: int, instance: str = EXO_INSTANCE,
             addresses: list[str] | None = None) -> list[dict[str, str]]:
    """Each node's environment as exo's runner sets it just before mx.distributed.init:
    its own hostfile (own slot 0.0.0.0, neighbours as that node reaches them, others a
    TEST-NET placeholder) in its own temporary directory, named after the instance."""
    addresses = addresses or [f"10.77.0.{i + 1}" for i in range(ranks)]
    envs = []
    for rank in range(ranks):
        hosts = []
        for other in range(ranks):
            if other == rank:
                hosts.append(f"0.0.0.0:{port}")
            elif other in ((rank - 1) % ranks, (rank + 1) % ranks):
                hosts.append(f"{addresses[other]}:{port}")
            else:
                hosts.append("198.51.100.1:0")
        node = tmp_path / f"node{rank}-{instance[:8]}-{port}"
        node.mkdir()
        path = node / f"hosts_{instance}_{rank}.json"
        path.write_text(json.dumps(hosts))  # pydantic's model_dump_json: no spaces
        envs.append({"MLX_HOSTFILE": str(path), "MLX_RANK": str(rank)})
    return envs


def exo_jaccl(tmp_path: Path, ranks: int, port: int,
              instance: str = EXO_INSTANCE) -> list[dict[str, str]]:
    """exo's JACCL instance: the same device matrix on every node, the coordinator
    0.0.0.0:P on rank 0 and rank 0's address as each node reaches it elsewhere."""
    matrix = [[None if i == j else f"rdma_en{2 + i + j}" for j in range(ranks)]
              for i in range(ranks)]
    envs = []
    for rank in range(ranks):
        node = tmp_path / f"jnode{rank}-{instance[:8]}"
        node.mkdir()
        path = node / f"hosts_{instance}_{rank}.json"
        path.write_text(json.dumps(matrix))
        coordinator = f"0.0.0.0:{port}" if rank == 0 else f"169.254.{rank}.1:{port}"
        envs.append({"MLX_IBV_DEVICES": str(path), "MLX_RANK": str(rank),
                     "MLX_JACCL_COORDINATOR": coordinator})
    return envs


def test_exo_ring_instance_is_one_job_on_every_node(tmp_path):
    envs = exo_ring(tmp_path, 4, 52417)
    assert len({Path(e["MLX_HOSTFILE"]).read_text() for e in envs}) == 4  # every file differs
    jobs = {job(e, pid=1000 + i) for i, e in enumerate(envs)}
    assert jobs == {f"exo-{EXO_INSTANCE}"}
    assert [launchenv.rank(e) for e in envs] == [0, 1, 2, 3]
    assert {launchenv.world_size(e) for e in envs} == {4}
    assert {launchenv.backend(e) for e in envs} == {"ring"}


def test_exo_recreating_an_instance_is_another_job(tmp_path):
    first = job(exo_ring(tmp_path, 2, 52417)[0])
    again = job(exo_ring(tmp_path, 2, 61002, instance="0b1e6a77-aaaa-4bbb-8ccc-111122223333")[1])
    assert first != again


def test_exo_jaccl_instance_is_one_job_though_each_node_has_its_own_coordinator(tmp_path):
    envs = exo_jaccl(tmp_path, 3, 53001)
    assert len({e["MLX_JACCL_COORDINATOR"] for e in envs}) == 3
    assert {job(e) for e in envs} == {f"exo-{EXO_INSTANCE}"}
    assert {launchenv.backend(e) for e in envs} == {"jaccl"}
    assert {launchenv.world_size(e) for e in envs} == {3}


def test_a_file_named_like_exos_for_another_rank_is_not_taken_for_exo(tmp_path):
    env = exo_ring(tmp_path, 2, 52417)[1]
    env["MLX_RANK"] = "0"  # the name says rank 1: not exo's file for this rank
    assert launchenv.exo_instance(env) == ""
    assert not job(env).startswith("exo-")


def test_per_node_wildcard_hostfiles_agree_by_their_ports(tmp_path):
    """exo's way of writing a hostfile, without exo's file name (a launcher of one's own):
    the files differ by node, the ports agree."""
    envs = []
    for rank, hosts in enumerate((["0.0.0.0:7001", "10.0.0.2:7002"],
                                  [["10.0.0.1:7001"], ["0.0.0.0:7002"]])):
        path = tmp_path / f"n{rank}" / "hosts.json"
        path.parent.mkdir()
        path.write_text(json.dumps(hosts))
        envs.append({"MLX_HOSTFILE": str(path), "MLX_RANK": str(rank)})
    jobs = {job(e) for e in envs}
    assert len(jobs) == 1 and jobs.pop().startswith("j")
    other = tmp_path / "other.json"
    other.write_text(json.dumps(["0.0.0.0:7101", "10.0.0.2:7102"]))
    assert job({"MLX_HOSTFILE": str(other), "MLX_RANK": "0"}) != job(envs[0])


def test_a_hand_written_hostfile_copied_to_every_node_is_one_job(tmp_path):
    hosts = [["192.168.1.10:5000"], ["192.168.1.11:5000"], ["192.168.1.12:5000"]]
    envs = []
    for rank in range(3):
        path = tmp_path / f"copy{rank}.json"
        # Copied by hand: spacing and a trailing newline may differ.
        path.write_text(json.dumps(hosts, indent=rank or None) + "\n" * rank)
        envs.append({"MLX_HOSTFILE": str(path), "MLX_RANK": str(rank)})
    assert len({job(e) for e in envs}) == 1
    # The same ports on other machines are another job: full addresses count when no
    # slot is a wildcard, so two clusters with one port plan never share an id.
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps([["192.168.2.10:5000"], ["192.168.2.11:5000"],
                                     ["192.168.2.12:5000"]]))
    assert job({"MLX_HOSTFILE": str(elsewhere), "MLX_RANK": "0"}) != job(envs[0])


def test_an_mlx_launch_coordinator_counts_in_full(tmp_path):
    """mlx.launch gives every rank rank 0's address: two clusters on the default port
    with the same device matrix are two jobs."""
    matrix = tmp_path / "m.json"
    matrix.write_text(json.dumps([[None, "rdma_en3"], ["rdma_en3", None]]))
    a = {"MLX_IBV_DEVICES": str(matrix), "MLX_RANK": "0", "MLX_JACCL_COORDINATOR": "10.0.0.1:32323"}
    b = {**a, "MLX_JACCL_COORDINATOR": "10.0.1.1:32323"}
    assert job(a) != job(b)


def test_mlx_watchdog_job_wins_over_every_launch_style(tmp_path):
    for env in (exo_ring(tmp_path, 2, 52417)[0], exo_jaccl(tmp_path, 2, 53001)[1],
                {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
                 "PMIX_NAMESPACE": "prterun-mac-1@1"}):
        assert job({**env, "MLX_WATCHDOG_JOB": "train-7"}) == "train-7"


def test_odd_exo_like_files_never_raise(tmp_path):
    bad = tmp_path / "hosts_x_0.json"
    bad.write_text("[[1, 2], {}]")
    odd = tmp_path / "odd.json"
    odd.write_text('["0.0.0.0", ":", "[::]:9", 7]')
    long_name = tmp_path / ("hosts_" + "a" * 200 + "_0.json")
    long_name.write_text("[]")
    for env in ({"MLX_HOSTFILE": str(bad), "MLX_RANK": "0"},
                {"MLX_HOSTFILE": str(odd), "MLX_RANK": "0"},
                {"MLX_HOSTFILE": str(long_name), "MLX_RANK": "0"},
                {"MLX_HOSTFILE": str(tmp_path / "hosts_gone_0.json"), "MLX_RANK": "0"},
                {"MLX_JACCL_COORDINATOR": "[::]:77", "MLX_RANK": "1"}):
        found = job(env)
        assert found and len(found.encode()) <= 64
    assert job({"MLX_HOSTFILE": str(bad), "MLX_RANK": "0"}) == "exo-x"
