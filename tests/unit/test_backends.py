"""The table of backends (watchdog/backends.py) is all the hook and the judge know of one.

Each real entry is checked through its readers (launchenv for the hook, the detector's
computing flag, the data-link probe); a backend added as one more entry, as the
module's docstring says to, is then recognised, identified, judged and wrapped with
no other edit. Job ids are pinned: the table's order is part of every job's id.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import types
from pathlib import Path

import pytest

from tests.unit.daemon.test_detector_backstop import KERNEL_SPIN, USER_SPIN, run, wait_shape
from watchdog import backends, record
from watchdog.backends import BACKENDS, Backend, Spin
from watchdog.daemon.probes.datalink import Prober
from watchdog.rank import launchenv, patches

HOSTS = [["10.0.0.1:5000"], ["10.0.0.2:5000"]]
DEVICES = [[None, "rdma_en3"], ["rdma_en3", None]]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "hosts").write_text(json.dumps(HOSTS))
    (tmp_path / "devices").write_text(json.dumps(DEVICES))
    return {"hosts": str(tmp_path / "hosts"), "devices": str(tmp_path / "devices")}


# What each launcher gives a rank, and what the hook must derive (the ids computed by
# the code before the table: reordering the table, or a part, changes them).
LAUNCHES = {
    "ring": ({"MLX_HOSTFILE": "@hosts", "MLX_RANK": "1"}, ("ring", 1, 2, "jda816c35b32")),
    "jaccl": ({"MLX_IBV_DEVICES": "@devices", "MLX_JACCL_COORDINATOR": "10.0.0.1:7000",
               "MLX_JACCL_RING": "1", "MLX_RANK": "0"}, ("jaccl", 0, 2, "je1664d3d875")),
    "jaccl over a hostfile left set": (
        {"MLX_HOSTFILE": "@hosts", "MLX_IBV_DEVICES": "@devices", "MLX_RANK": "1"},
        ("jaccl", 1, 2, "j62c9974f078")),
    "nccl": ({"NCCL_HOST_IP": "10.0.0.9", "NCCL_PORT": "1234", "MLX_WORLD_SIZE": "4",
              "MLX_RANK": "3"}, ("nccl", 3, 4, "j388de3cc069")),
    "mpi": ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
             "PMIX_NAMESPACE": "prterun-h-1@1", "PMIX_RANK": "1"}, ("mpi", 1, 2, "ja8054878bfc")),
}


def _env(given: dict[str, str], files: dict[str, str]) -> dict[str, str]:
    return {k: files[v[1:]] if v.startswith("@") else v for k, v in given.items()}


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_each_launch_is_derived_as_before(name: str, files: dict[str, str]) -> None:
    given, expected = LAUNCHES[name]
    env = _env(given, files)
    assert (launchenv.backend(env), launchenv.rank(env), launchenv.world_size(env),
            launchenv.job_id(env, 42, 7)) == expected


def test_every_entry_is_what_its_readers_say(files: dict[str, str]) -> None:
    """The hook, the judge and the probe read each entry, not a list of their own."""
    assert [b.name for b in BACKENDS] == ["ring", "jaccl", "nccl", "mpi"]  # append only
    for backend in BACKENDS:
        assert backends.by_name(backend.name) is backend
        assert backends.spins_in_kernel(backend.name) is (backend.wait_spins is Spin.KERNEL)
        assert backends.links_probed(backend.name) is backend.links_probed
    for given, (name, _, _, _) in LAUNCHES.values():
        env = _env(given, files)
        assert backends.recognise(env) is backends.by_name(name)
    assert backends.recognise({}) is None and not backends.spins_in_kernel("single")
    for backend in BACKENDS:  # asked of a launch not its own: nothing, never an error
        assert (backend.size({}), backend.job_parts({}, None)) == (0, [])


# -- a backend added as the module's docstring says: one entry ------------------------

def _tcpx_size(env: backends.Env) -> int:
    return len(env.get("TCPX_PEERS", "").split(","))


TCPX = Backend(
    name="tcpx",
    launched_by="a made-up launcher: TCPX_PEERS, TCPX_RANK",
    recognised=lambda env: bool(env.get("TCPX_PEERS")),
    rank_from=("TCPX_RANK",),
    size=_tcpx_size,
    job_parts=lambda env, ppid: ["tcpx:" + env["TCPX_PEERS"]] if env.get("TCPX_PEERS") else [],
    wait_spins=Spin.KERNEL,
    links_probed=True,
    entry_points=("tcpx_barrier",),
)


@pytest.fixture(params=[Spin.KERNEL, Spin.USER], ids=["kernel", "user"])
def tcpx(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    added = dataclasses.replace(TCPX, wait_spins=request.param)
    monkeypatch.setattr(backends, "BACKENDS", (*BACKENDS, added))
    return added


def test_the_hook_derives_a_new_backend_from_its_entry(tcpx: Backend) -> None:
    ranks = [{"TCPX_PEERS": "10.0.0.1:9,10.0.0.2:9,10.0.0.3:9", "TCPX_RANK": str(r)}
             for r in range(3)]
    assert [launchenv.backend(e) for e in ranks] == ["tcpx"] * 3
    assert [launchenv.rank(e) for e in ranks] == [0, 1, 2]
    assert {launchenv.world_size(e) for e in ranks} == {3}
    jobs = {launchenv.job_id(e, pid) for pid, e in enumerate(ranks, 100)}
    assert len(jobs) == 1 and jobs.pop().startswith("j")  # every rank agrees, not pid<n>
    other = {"TCPX_PEERS": "10.0.0.1:9,10.0.0.2:9", "TCPX_RANK": "0"}
    assert launchenv.job_id(other, 1) != launchenv.job_id(ranks[0], 1)


def test_the_judge_reads_a_new_backend_s_wait_from_its_entry(tcpx: Backend) -> None:
    """A thread busy in user space inside a wait: computing where the backend's wait
    spins in the kernel (as a ring's), not to be told apart from the wait elsewhere."""
    kernel = tcpx.wait_spins is Spin.KERNEL
    assert run(wait_shape(USER_SPIN, backend="tcpx"))[-1].computing is kernel
    assert run(wait_shape(KERNEL_SPIN, backend="tcpx"))[-1].computing is False


def test_the_probe_knocks_on_a_new_backend_s_links_from_its_entry(tcpx: Backend) -> None:
    submitted: list[object] = []
    prober = Prober(submitted.append, lambda: 1.0, probe_=lambda pid, timeout: "up")
    prober.ask((1, 0.0), 0.0, "tcpx")
    prober.ask((2, 0.0), 0.0, "jaccl")
    assert len(submitted) == 1  # only tcpx's probe ran
    assert prober.found[(2, 0.0)] == "not probed: the jaccl backend"


def test_the_hook_wraps_a_new_backend_s_entry_point(
        tcpx: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(record.OP_CODE, "tcpx_barrier", record.OP_CODE["all_sum"])
    issued: list[int] = []
    hb = types.SimpleNamespace(_wait=None, publish_threads=lambda: None,
                               collective=lambda op, out: issued.append(op))
    mx = types.SimpleNamespace(array=type("FakeArray", (), {}), distributed=types.SimpleNamespace(
        init=lambda *a, **k: None, tcpx_barrier=lambda x: x))
    start = threading.Thread.start
    patches.instrument(hb, mx)  # type: ignore[arg-type]
    try:
        assert mx.distributed.tcpx_barrier(5) == 5
    finally:
        patches.restore()
    assert threading.Thread.start is start
    assert issued == [record.OP_CODE["all_sum"]]
