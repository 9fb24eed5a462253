"""One look at a record's process (`daemon/observation.py`), shared by the daemon's
scan, the CLI's sampling and the signaller; and the one start-ticks parser
(`watchdog/procstat.py`) the rank side and the probe both use.

Real processes throughout: this test's own pid (live), a child that exited and
was reaped (gone), this pid under another start time or owner (forged), and a
probe over a /proc whose stat is unreadable (the probe failed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from watchdog import procstat, record
from watchdog.cli.look.sampling import sample_ranks
from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.observation import Observation, Presence, identify, observe
from watchdog.daemon.probes import ProbeError, probe
from watchdog.daemon.probes.linux import LinuxProbe
from watchdog.daemon.signaller import Result, Signaller, Target
from watchdog.rank import hook
from watchdog.record import Record, RecordWriter

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
ME = psutil.Process()


def reaped_pid() -> int:
    """The pid of a child that exited and was reaped: no process has it now."""
    child = subprocess.Popen(["true"])
    child.wait()
    assert not psutil.pid_exists(child.pid)  # not yet recycled (pids go round slowly)
    return child.pid


def write(directory: Path, name: str, *, pid: int = 0, start_time: float | None = None,
          uid: int | None = None, start_ticks: int | None = None,
          status: int | None = None) -> Record:
    """A real record for `pid` (default: this process, its true identity)."""
    path = str(directory / (name + record.SUFFIX))
    writer = RecordWriter(
        path, pid=pid or os.getpid(), start_time=ME.create_time() if start_time is None
        else start_time, uid=os.getuid() if uid is None else uid, host="h", job="j", rank=0,
        world_size=1, backend="ring", dump_signal=0,
        start_ticks=hook._start_ticks() if start_ticks is None else start_ticks)
    if status is not None:
        writer.close(status, remove=False)
    return record.read_path(path)


def test_own_process_with_an_open_record_is_live_with_its_sample(tmp_path: Path) -> None:
    look = observe(write(tmp_path, "me"), probe())
    assert look.seen is Presence.LIVE
    assert look.sample is not None and look.sample.pid == os.getpid()
    assert look.sample.uid == os.getuid() and look.error is None


@pytest.mark.parametrize("status", [record.STATUS_CLOSED, record.STATUS_ABANDONED,
                                    record.STATUS_ERROR])
def test_own_process_behind_a_record_no_longer_open_is_closed_with_its_sample(
        tmp_path: Path, status: int) -> None:
    look = observe(write(tmp_path, "me", status=status), probe())
    assert look.seen is Presence.CLOSED
    assert look.sample is not None and look.sample.pid == os.getpid()


def test_a_reaped_child_is_gone_whatever_its_record_says(tmp_path: Path) -> None:
    pid = reaped_pid()
    for status in (None, record.STATUS_CLOSED):
        look = observe(write(tmp_path, f"dead-{status}", pid=pid, start_ticks=0,
                             status=status), probe())
        assert look == Observation(Presence.GONE)


@pytest.mark.parametrize("forgery", ["start time", "start ticks", "uid"])
def test_a_live_pid_under_another_identity_is_not_ours(tmp_path: Path, forgery: str) -> None:
    identity: dict[str, object] = {
        "start time": {"start_time": ME.create_time() + 5.0, "start_ticks": 0},
        "start ticks": {"start_ticks": hook._start_ticks() + 1},
        "uid": {"uid": os.getuid() + 4242},
    }[forgery]
    if forgery == "start ticks" and not sys.platform.startswith("linux"):
        pytest.skip("start ticks are Linux's")
    look = observe(write(tmp_path, "forged", **identity), probe())  # type: ignore[arg-type]
    assert look.seen is Presence.NOT_OURS and look.sample is None  # nothing of it is handed on


@linux_only
def test_a_probe_that_cannot_read_the_process_is_unknown_with_its_error(
        tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / str(os.getpid())).mkdir(parents=True)
    (proc / str(os.getpid()) / "stat").write_text("not a stat line")
    look = observe(write(tmp_path, "me"), LinuxProbe(proc=str(proc)))
    assert look.seen is Presence.UNKNOWN and look.sample is None
    assert isinstance(look.error, ProbeError) and "stat" in str(look.error)


@linux_only
def test_the_signaller_words_the_same_look_as_a_signal_result(tmp_path: Path) -> None:
    def target(pid: int, **changed: object) -> Target:
        fields: dict[str, object] = dict(pid=pid, start_time=ME.create_time(),
                                         uid=os.getuid(), job="j", rank=0,
                                         start_ticks=hook._start_ticks())
        fields.update(changed)
        return Target(**fields)  # type: ignore[arg-type]

    broken = tmp_path / "proc" / str(os.getpid())
    broken.mkdir(parents=True)
    (broken / "stat").write_text("")
    real = Signaller(probe())
    assert real.identify(target(os.getpid())) == Result.OURS
    assert real.identify(target(reaped_pid())) == Result.GONE
    assert real.identify(target(os.getpid(), uid=os.getuid() + 4242)) == Result.NOT_OURS
    assert Signaller(LinuxProbe(proc=str(tmp_path / "proc"))).identify(
        target(os.getpid())) == Result.UNKNOWN
    assert identify(probe(), os.getpid(), ME.create_time(), os.getuid(),
                    hook._start_ticks()).seen is Presence.LIVE


def test_status_without_a_daemon_words_each_case_as_before(tmp_path: Path) -> None:
    """The CLI keeps its own words over the shared classification."""
    dead = reaped_pid()
    write(tmp_path, "live")
    write(tmp_path, "closed", pid=os.getpid(), status=record.STATUS_CLOSED)
    write(tmp_path, "gone", pid=dead, start_ticks=0)
    # Only one record per pid is read as itself: the forged one names another live
    # process of ours (this test's parent), under a start time it never had.
    parent = psutil.Process(os.getppid())
    write(tmp_path, "forged", pid=parent.pid, uid=parent.uids().real,
          start_time=parent.create_time() + 5.0, start_ticks=1)
    ranks, invalid = sample_ranks(str(tmp_path), Rules(), pause=0.0)
    states = sorted((r.pid, r.state, r.reason) for r in ranks)
    assert (dead, "exited", "exited without closing its record") in states
    assert (os.getpid(), "abandoned", "record closed while the process runs") in states
    assert any(pid == os.getpid() and state not in ("exited", "abandoned")
               for pid, state, _ in states)
    assert invalid == {str(tmp_path / "forged.rec"):
                       f"stale: pid {parent.pid} is now another process"}


# -- the one start-ticks parser ---------------------------------------------------------


@pytest.mark.parametrize("comm", ["python3", "a b", "x) (y", ")", "((("])
def test_start_ticks_is_field_22_whatever_the_command_name_holds(comm: str) -> None:
    fields = ["S"] + [str(n) for n in range(4, 22)] + ["123456789", "0", "0"]
    assert procstat.start_ticks(f"4242 ({comm}) " + " ".join(fields)) == 123456789


@pytest.mark.parametrize("line", ["", "4242 (short) S 1 2", "no parenthesis at all"])
def test_a_stat_line_that_is_not_one_raises(line: str) -> None:
    with pytest.raises((ValueError, IndexError)):
        procstat.start_ticks(line)


@linux_only
def test_the_rank_and_the_probe_read_the_same_start_ticks() -> None:
    """The hook's identity and the probe's check come from the one parser: they agree."""
    ticks = hook._start_ticks()
    assert ticks > 0 and ticks == procstat.read_start_ticks(os.getpid())
    sample = LinuxProbe().sample(os.getpid())
    assert sample is not None and sample.start_ticks == ticks
    with pytest.raises(FileNotFoundError):
        procstat.read_start_ticks(reaped_pid())
