"""No failed write and no daemon restart loses a kill's record.

Real faults: the state directory is a small tmpfs filled to the last byte, the
daemon is SIGKILLed in the middle of its wired-memory settle, and the leak the
settle watches is a real SHM_LOCK'd segment (Unevictable memory).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.ranks import DaemonProc, http_get, wait_for
from tests.support.records import SyntheticWriter
from watchdog import record
from watchdog.daemon.store import journal
from watchdog.procstat import read_start_ticks
from watchdog.record import OP_CODE
from watchdog.states import Phase

pytestmark = pytest.mark.ranks

LEAK = 64 << 20  # bytes of locked memory left behind "by the kill"


@contextlib.contextmanager
def small_disk(path: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of `size` mounted on `path` (we are root), unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a filler file until the disk is full; returns it (unlink to free)."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
    return filler


@contextlib.contextmanager
def locked_memory(size: int = LEAK) -> Iterator[None]:
    """A SysV segment locked in memory (Unevictable), as a GPU driver leak looks."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    shmid = libc.shmget(0, ctypes.c_size_t(size), 0o1600)  # IPC_PRIVATE | IPC_CREAT
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.shmctl(shmid, 11, None) == 0, os.strerror(ctypes.get_errno())  # SHM_LOCK
        addr = libc.shmat(shmid, None, 0)
        ctypes.memset(addr, 1, size)
        libc.shmdt(ctypes.c_void_p(addr))
        yield
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


def hung_record(directory: Path, proc: subprocess.Popen, deadline: float) -> Path:
    """A record for our own process: in a wait from now on, with `deadline` seconds."""
    path = directory / f"{proc.pid}{record.SUFFIX}"
    start = psutil.Process(proc.pid).create_time()
    writer = SyntheticWriter(str(path), pid=proc.pid, start_time=start,
                          uid=os.getuid(), host="node", job="lost", rank=0, world_size=1,
                          backend="ring", dump_signal=0, start_ticks=read_start_ticks(proc.pid))
    now = time.monotonic_ns()
    writer.begin()
    writer.write_hot(1, 1, 0, 0, Phase.WAIT, OP_CODE["eval"], now, now, now, 0, 0)
    writer.write_expect(deadline, now, "")
    writer.end()
    writer.close(record.STATUS_OPEN, remove=False)  # a hung rank's record stays
    return path


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])


def status(daemon: DaemonProc) -> dict:
    code, _, body = http_get(daemon.url() + "/status")  # type: ignore[attr-defined]
    assert code == 200
    return json.loads(body)


def incidents(state_dir: Path) -> list[dict]:
    lines, bad = journal.read_incidents(str(state_dir))
    assert bad == 0, "a torn or half-written incident line"
    return [line.to_json() for line in lines]


def test_a_full_state_disk_loses_neither_the_reboot_flag_nor_the_incident(tmp_path, record_dir):
    """The flag's write fails (ENOSPC): the incident is not skipped, both are
    held in memory and shown, the kill is a kill (not a crash), and both reach the
    disk once there is room."""
    with small_disk(tmp_path / "state") as state_dir:
        daemon = DaemonProc(record_dir, state_dir, wired_threshold=16 << 20, settle=1,
                            blocked_deadline=3, evidence_timeout=1)
        proc = sleeper()
        try:
            daemon.start()
            filler = fill(state_dir)
            hung_record(record_dir, proc, deadline=3.0)
            wait_for(lambda: proc.pid in {r["pid"] for r in status(daemon)["ranks"]}, 10,
                     what="the rank watched")
            with locked_memory():
                wait_for(lambda: proc.poll() is not None, 30, what="the hung rank ended")
                snap = wait_for(lambda: (s := status(daemon)).get("unwritten", {}).get(
                    "incidents_unwritten") and s, 15, what="the incident held in memory")
                assert snap["reboot_required"] is True, snap["reboot"]
                assert snap["unwritten"]["reboot_flags_unwritten"], snap["unwritten"]
                rank = next(r for r in snap["ranks"] if r["pid"] == proc.pid)
                assert rank["state"] == "killed", rank
                assert not (state_dir / journal.REBOOT_FLAG).exists()
                assert incidents(state_dir) == []
                filler.unlink()  # room again: the next scans write both
                inc = wait_for(lambda: incidents(state_dir), 10, what="the incident written")
            assert len(inc) == 1 and inc[0]["pids"] == [proc.pid]
            assert inc[0]["outcome"] == {str(proc.pid): "killed"}
            assert inc[0]["wired_check"] == "leaked" and inc[0]["reboot_required"]
            flag = journal.reboot_flag(str(state_dir))
            assert flag is not None and flag.reasons[0].incident == inc[0]["id"]
            wait_for(lambda: not status(daemon)["unwritten"]["incidents_unwritten"], 5)
            assert not list((state_dir / "pending").glob("*.json"))
            assert "without closing its record" not in daemon.log()
            assert daemon.alive()
        finally:
            proc.kill()
            proc.wait()
            daemon.stop()


def test_a_daemon_killed_during_the_settle_leaves_a_kill_the_next_one_completes(
        tmp_path, record_dir, state_dir):
    """SIGKILL the daemon after its kill, while wired memory settles: the next
    daemon finds the journaled response, writes its incident, raises the flag and
    reports the rank killed, not crashed."""
    first = DaemonProc(record_dir, state_dir, wired_threshold=16 << 20, settle=60,
                       blocked_deadline=3, evidence_timeout=1)
    second = DaemonProc(record_dir, state_dir, wired_threshold=16 << 20, settle=1,
                        blocked_deadline=3)
    proc = sleeper()
    try:
        first.start()
        hung_record(record_dir, proc, deadline=3.0)
        wait_for(lambda: proc.pid in first.ranks(), 10, what="the rank watched")
        with locked_memory():
            wait_for(lambda: proc.poll() is not None, 30, what="the hung rank ended")
            assert proc.returncode == -signal.SIGTERM
            first.stop(signal.SIGKILL)  # mid-settle: up to 60 s of it were left
            assert incidents(state_dir) == [] and journal.reboot_flag(str(state_dir)) is None
            second.start()
            inc = wait_for(lambda: incidents(state_dir), 15, what="the completed incident")
        assert len(inc) == 1 and inc[0]["pids"] == [proc.pid]
        assert inc[0]["outcome"] == {str(proc.pid): "killed"}, inc[0]
        assert "completed_at_start" in inc[0]
        # The ladder had begun (journaled before its first signal); the rank was gone
        # at the restart, so nothing more was sent to it.
        assert inc[0]["ladder"] == "begun"
        assert {s["signal"] for s in inc[0]["signals"]} <= {"SIGSTOP", "SIGCONT", "SIGTERM"}
        assert inc[0]["wired_check"] == "leaked"
        flag = journal.reboot_flag(str(state_dir))
        assert flag is not None and flag.reasons[0].incident == inc[0]["id"]
        rank = wait_for(lambda: (r := second.ranks().get(proc.pid)) and r["state"] == "killed"
                        and r, 10, what="the rank shown killed")
        assert "ended by the watchdog" in rank["reason"], rank
        assert "without closing its record" not in second.log()
        assert not list((state_dir / "pending").glob("*.json"))
    finally:
        proc.kill()
        proc.wait()
        first.stop(signal.SIGKILL)
        second.stop()


def test_a_flag_held_in_memory_keeps_its_entry_so_a_restart_still_raises_it(state_dir):
    """The incident is written but the flag is not (the flag's path is unusable): the
    write-ahead entry stays; the next daemon raises the flag and writes no second line."""
    from tests.support.fakes import UNKILLABLE, FakeProbe, FakeSignaller, target
    from tests.support.ladders import complete, respond
    from tests.unit.daemon.test_enforcer import enforcer, incident
    from watchdog.daemon.store import pending

    (state_dir / journal.REBOOT_FLAG).mkdir()  # os.replace onto it fails: EISDIR
    targets = [target(301)]
    enf, _ = enforcer(state_dir, FakeSignaller({301: UNKILLABLE}), FakeProbe(wired=None))
    out = respond(enf, incident(targets=targets), targets)
    assert out.incident.reboot_required and "301" in str(out.incident.reboot_required)
    assert [i["id"] for i in incidents(state_dir)] == [out.incident.id]
    assert enf.backlog.state().reboot_flags_unwritten, enf.backlog.state()
    assert enf.backlog.state().incidents_unwritten == ()
    (entry,) = pending.unfinished(str(state_dir))  # kept: the flag is not on disk
    # A restart with the path usable again.
    (state_dir / journal.REBOOT_FLAG).rmdir()
    again, _ = enforcer(state_dir, FakeSignaller({301: UNKILLABLE}), FakeProbe(wired=None))
    complete(again, entry)
    flag = journal.reboot_flag(str(state_dir))
    assert flag is not None and flag.reasons[0].incident == out.incident.id
    assert [i["id"] for i in incidents(state_dir)] == [out.incident.id]  # not twice
    assert pending.unfinished(str(state_dir)) == []


def test_a_mistyped_write_ahead_entry_is_moved_aside_and_the_daemon_starts(
        record_dir, state_dir):
    """Issue 30, item 11: an entry whose target's `start_time` is a string (a hand
    edit, another version) made the real daemon exit 1 at every start, and stay.
    It is moved aside with a log line; a good entry beside it is still completed."""
    from tests.support.fakes import target
    from tests.unit.daemon.test_enforcer import incident
    from watchdog.daemon.store import pending

    good = incident(targets=[target(999_991)])
    pending.write_ahead(str(state_dir), good, [target(999_991)], None)
    bad_incident = incident(targets=[target(999_992)])
    bad_incident = type(bad_incident)(**{**bad_incident.__dict__, "id": "bad-entry"})
    pending.write_ahead(str(state_dir), bad_incident, [target(999_992)], None)
    bad = state_dir / "pending" / "bad-entry.json"
    entry = json.loads(bad.read_text())
    entry["targets"][0]["start_time"] = "yesterday"
    bad.write_text(json.dumps(entry))
    with DaemonProc(record_dir, state_dir) as daemon:
        wait_for(lambda: (state_dir / "pending" / "bad-entry.json.bad").exists(), 10,
                 what="the bad entry moved aside")
        assert "bad-entry.json is unusable" in daemon.log()
        wait_for(lambda: not (state_dir / "pending" / f"{good.id}.json").exists(), 20,
                 what="the good entry completed")
        assert daemon.alive()
    assert not bad.exists()
