"""A rank the others wait for, writing a checkpoint, holds its job (issue 27): real ring
ranks (tests/support/rank_prog.py `save`: rank 1 saves with mx.save_safetensors to a FIFO
while rank 0 waits in the next all_sum, spinning) and the real daemon on a 3 s deadline,
with a 5 s floor: the stuck window.

- slow storage (bytes trickling for ~12 s, four deadlines): held, no incident, both exit 0;
- storage that never answers: ended once the save has been silent for the floor, the
  incident's culprit the saving rank and its op;
- across nodes (one rank per daemon, peers of each other): the waiting rank's node holds
  the job on the saving rank's `holding` in its peer's /status.
"""

from __future__ import annotations

import time

import pytest

from tests.support.lm_train import SlowStorage
from tests.support.ranks import DaemonProc, RingJob, free_ports, wait_for

DEADLINE, FLOOR = 3.0, 5.0
SIZE = 64 * 1024 * 4  # the tensors' bytes (the header adds a few kB)
SLOW = 12.0


def watch_held(daemon: DaemonProc, job: RingJob) -> set[str]:
    """Rank 0's reasons as the daemon showed them until the job ended."""
    seen: set[str] = set()
    while any(p.poll() is None for p in job.procs):
        r0 = daemon.ranks().get(job.procs[0].pid)
        if r0 and r0["reason"]:
            seen.add(r0["reason"])
        time.sleep(0.2)
    return seen


@pytest.mark.parametrize("platform", [
    pytest.param({}, id="linux"),
    pytest.param({"MLX_WATCHDOG_SIMULATE": "macos"}, id="macos-simulated")])
def test_a_checkpoint_to_slow_storage_holds_the_waiting_rank(tmp_path, record_dir, state_dir,
                                                             platform):
    """On the simulated Mac the disk counters see no byte into the FIFO (ri_diskio counts
    block I/O): its offset moving is the save's bytes."""
    fifo = tmp_path / "ckpt.safetensors"
    storage = SlowStorage(fifo, SIZE, SLOW)
    storage.start()
    daemon = DaemonProc(record_dir, state_dir, deadline=DEADLINE, auto_floor=FLOOR)
    daemon.extra_env = dict(platform)
    with daemon, RingJob(tmp_path, record_dir, 2, "save", args=(str(fifo),),
                         env=platform) as job:
        seen = watch_held(daemon, job)
        assert [p.returncode for p in job.procs] == [0, 0], job.log(0) + job.log(1)
        assert daemon.incidents() == []
    storage.join(10)
    assert storage.received >= SIZE and storage.ended - storage.began >= SLOW * 0.6
    held = [r for r in seen if "held: rank 1 is writing a checkpoint (save_safetensors" in r]
    assert held, seen


def test_a_checkpoint_to_storage_that_never_answers_is_ended_naming_the_saver(
        tmp_path, record_dir, state_dir):
    fifo = tmp_path / "ckpt.safetensors"
    SlowStorage(fifo)  # never opened: the writer's open() never returns
    with DaemonProc(record_dir, state_dir, deadline=DEADLINE, auto_floor=FLOOR) as daemon, \
            RingJob(tmp_path, record_dir, 2, "save", args=(str(fifo),)) as job:
        wait_for(lambda: "saving" in job.log(1), 60, what="rank 1 saving")
        began = time.monotonic()
        wait_for(lambda: all(p.poll() is not None for p in job.procs), 60,
                 what="the job ended")
        took = time.monotonic() - began
        incident = wait_for(daemon.incidents, 10, what="the incident")[-1]
    # Within the stuck window and a few scans of this clock, started once the test has
    # read "saving" in the rank's log (late by a poll, more on a loaded machine) ...
    assert took <= FLOOR + 15, took
    culprit = incident["culprit"]
    assert culprit["rank"] == 1 and culprit["pid"] == job.pids[1], incident
    assert culprit["reason"].startswith("in save_safetensors of its own for"), culprit
    assert "no byte moved" in culprit["reason"]
    saver = next(r for r in incident["ranks"] if r["rank"] == 1)
    assert saver["op"] == "save_safetensors"
    # ... and not before its own deadline (no byte moving, the save's deadline is the
    # job's, DEADLINE, under the stuck window): by the saver's wait as the verdict saw it.
    assert saver["seconds_in_wait"] >= DEADLINE, [
        (r["rank"], r["seconds_in_wait"], r["op"]) for r in incident["ranks"]]


def test_across_nodes_a_rank_saving_on_another_node_holds_the_job(tmp_path):
    ports = free_ports(2)
    peers = [f"127.0.0.1:{p}" for p in ports]
    daemons = []
    fifo = tmp_path / "ckpt.safetensors"
    storage = SlowStorage(fifo, SIZE, SLOW)
    storage.start()
    try:
        for i, port in enumerate(ports):
            d = DaemonProc(tmp_path / f"node{i}" / "records", tmp_path / f"node{i}" / "state",
                           "--peers", peers[1 - i], listen=f"127.0.0.1:{port}", peer_timeout=3,
                           deadline=DEADLINE, auto_floor=FLOOR)
            d.record_dir.mkdir(parents=True)
            daemons.append(d.start())
        with RingJob(tmp_path, [d.record_dir for d in daemons], 2, "save",
                     args=(str(fifo),)) as job:
            seen = watch_held(daemons[0], job)
            assert [p.returncode for p in job.procs] == [0, 0], job.log(0) + job.log(1)
            assert daemons[0].incidents() == [] and daemons[1].incidents() == []
    finally:
        for d in daemons:
            d.stop()
    held = [r for r in seen if "held: rank 1 on " in r and "writing a checkpoint" in r]
    assert held, seen
