"""The macOS probe on any OS: wired memory as psutil reports it on a Mac, through the
reboot-flag logic, and `sample` as the native-stack tool (a stand-in at the tool's
path that prints what the real one prints, hangs, or fails), parsed into the incident.
The probe runs a Mac's tools by their absolute paths, never one found on PATH."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support import BIN, DATA
from tests.support.fakes import DIES_ON_TERM, FakeClock, FakeSignaller, target
from tests.support.ladders import respond
from watchdog.daemon.act.enforcer import Enforcer
from watchdog.daemon.config import Settings
from watchdog.daemon.probes import ProbeError, macos, probe, samplegraph
from watchdog.daemon.probes.macos import MacProbe
from watchdog.daemon.store import journal
from watchdog.status import Incident

GiB = 1 << 30
REPORT = (DATA / "sample_jaccl_recv.txt").read_text()

# psutil.virtual_memory() on macOS: these fields, in this order (psutil's _psosx.svmem).
MacVmem = collections.namedtuple(
    "MacVmem", "total available percent used free active inactive wired")


def mac_vmem(wired: int) -> MacVmem:
    return MacVmem(192 * GiB, 150 * GiB, 21.9, 42 * GiB, 100 * GiB, 30 * GiB, 20 * GiB, wired)


def test_probe_choice_follows_the_one_seam(darwin):
    assert isinstance(probe(), MacProbe)
    darwin.OS = darwin.LINUX
    assert probe().name == "linux"
    darwin.OS = darwin.OTHER
    assert probe().name == "generic"


def test_wired_present(monkeypatch):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: mac_vmem(7 * GiB))
    assert MacProbe().wired_bytes() == 7 * GiB


def test_wired_absent_is_a_probe_error_as_on_this_linux_psutil():
    # Linux's psutil has no `wired` field: the real AttributeError path.
    assert not hasattr(psutil.virtual_memory(), "wired")
    with pytest.raises(ProbeError, match="wired"):
        MacProbe().wired_bytes()


def test_wired_read_failing_is_a_probe_error(monkeypatch):
    def broken() -> MacVmem:
        raise OSError(5, "host_statistics64 failed")

    monkeypatch.setattr(psutil, "virtual_memory", broken)
    with pytest.raises(ProbeError, match="host_statistics64"):
        MacProbe().wired_bytes()


def test_the_macos_probe_samples_a_real_process():
    sample = MacProbe().sample(os.getpid())
    assert sample is not None and sample.pid == os.getpid() and sample.threads


# -- wired memory through the reboot flag ------------------------------------------------


def enforcer(state_dir: Path, clock: FakeClock, **kw) -> Enforcer:
    settings = dataclasses.replace(
        Settings(dir=str(state_dir.parent / "records"), state_dir=str(state_dir), grace=5.0,
                 kill_timeout=5.0, settle=30.0, evidence_timeout=10.0, wired_threshold=GiB),
        **kw)
    return Enforcer(settings, FakeSignaller({101: DIES_ON_TERM}), MacProbe(),
                    clock=clock.now, sleep=clock.sleep, wall=clock.wall)


def leak(monkeypatch, clock: FakeClock, baseline: int, leaked: int, returns_after: float | None
         ) -> None:
    """Wired memory on a Mac after a kill: `leaked` above the baseline until the clock
    has moved `returns_after` seconds (None: never), as psutil would report it."""
    start = clock.now()

    def virtual_memory() -> MacVmem:
        back = returns_after is not None and clock.now() - start >= returns_after
        return mac_vmem(baseline if back else baseline + leaked)

    monkeypatch.setattr(psutil, "virtual_memory", virtual_memory)


def incident() -> Incident:
    return Incident.from_json({"id": "20261130T101402-mac001", "time": 1.7e9, "job": "j1",
                               "ranks": [], "verdict": "stalled"})


@pytest.mark.parametrize("returns_after, verdict, flagged", [
    (12.0, "returned", False),  # the GPU driver unwires within the settle time
    (45.0, "leaked", True),  # back only after the settle time: too late, flag it
    (None, "leaked", True),  # never back
])
def test_wired_leak_and_the_reboot_flag(monkeypatch, state_dir, returns_after, verdict,
                                         flagged):
    clock = FakeClock()
    leak(monkeypatch, clock, baseline=8 * GiB, leaked=40 * GiB, returns_after=returns_after)
    enf = enforcer(state_dir, clock)
    result = respond(enf, incident(), [target(101)], baseline=8 * GiB,
                     evidence=False).incident.to_json()
    assert result["wired_before"] == 48 * GiB
    assert result["wired_check"] == verdict
    assert (journal.reboot_flag(str(state_dir)) is not None) is flagged
    if flagged:
        assert "wired memory stayed above" in result["reboot_required"]
        assert result["wired_after"] == 48 * GiB
    else:
        assert result["reboot_required"] is False and result["wired_after"] == 8 * GiB


def test_a_leak_while_other_ranks_hold_wired_memory_is_no_verdict(monkeypatch, state_dir):
    clock = FakeClock()
    leak(monkeypatch, clock, baseline=8 * GiB, leaked=40 * GiB, returns_after=None)
    result = respond(enforcer(state_dir, clock), incident(), [target(101)], baseline=8 * GiB,
                     others_live=lambda: True, evidence=False).incident.to_json()
    assert result["wired_check"] == "skipped: other ranks are live"
    assert journal.reboot_flag(str(state_dir)) is None


def test_wired_absent_means_no_reboot_verdict(state_dir):
    # The real psutil here has no `wired`: exactly a Mac whose psutil lost the field.
    clock = FakeClock()
    result = respond(enforcer(state_dir, clock), incident(), [target(101)],
                     baseline=8 * GiB, evidence=False).incident.to_json()
    assert result["wired_before"] is None and result["wired_check"] == "probe failed"
    assert journal.reboot_flag(str(state_dir)) is None


# -- sample: the native stacks ---------------------------------------------------------


def test_parse_a_jaccl_rank_hung_in_recv():
    typed = samplegraph.parse(REPORT.format(pid=4242, ppid=1))
    threads = [t.to_json() for t in typed]  # as an incident journals them
    assert [t["thread"] for t in threads] == [
        "Thread_8812211 DispatchQueue_1: com.apple.main-thread (serial)",
        "Thread_8812260: StreamThread", "Thread_8812261"]
    stream = threads[1]
    assert stream["samples"] == 1304
    assert stream["top"] == [
        {"frame": "ibv_poll_cq", "lib": "librdma.dylib", "samples": 1102},
        {"frame": "tbt_post_send", "lib": "libjaccl_tbt.dylib", "samples": 148},
        {"frame": "tbt_poll_cq", "lib": "libjaccl_tbt.dylib", "samples": 54}]
    recv = next(p for p in stream["path"] if "MeshImpl::recv" in p["frame"])
    assert recv["samples"] == 1156  # 1156 of 1304 StreamThread samples inside recv
    assert stream["path"][-1] == {"frame": "ibv_poll_cq", "samples": 1102}
    assert threads[0]["top"][0]["frame"] == "__psynch_cvwait"
    assert "1102 of 1304 samples in ibv_poll_cq" in samplegraph.summary_line(typed[1])


@pytest.mark.parametrize("text", [
    "", "sample cannot find any existing process you have access to which has a name like "
    "'4242'\n", "Call graph:\n", "Call graph:\n    + 12 orphan  (in x)  [0x1]\n",
    "Call graph:\n    12 Thread_1\n    + x not a count\n    + 3 f  (in a)  [0x1]\n",
])
def test_parse_never_raises_on_junk(text):
    threads = samplegraph.parse(text)
    assert isinstance(threads, list)


def test_parse_caps_the_thread_count():
    text = "Call graph:\n" + "".join(
        f"    5 Thread_{i}\n    + 5 f{i}  (in lib)  [0x1]\n" for i in range(200))
    threads = samplegraph.parse(text)
    assert len(threads) == samplegraph.MAX_THREADS
    assert threads[-1].to_json()["top"] == [
        {"frame": f"f{samplegraph.MAX_THREADS - 1}", "lib": "lib", "samples": 5}]


@pytest.fixture
def fake_sample_on_path(monkeypatch, tmp_path):
    """The stand-in as the Mac's /usr/bin/sample (its absolute path the probe's TOOLS)."""
    log = tmp_path / "sample-argv.log"
    monkeypatch.setitem(macos.TOOLS, "sample", str(BIN / "sample"))
    monkeypatch.setenv("FAKE_SAMPLE_LOG", str(log))
    return log


def test_the_stand_in_is_what_the_probe_runs(fake_sample_on_path):
    command = MacProbe().stack_command(4242)
    assert command == [str(BIN / "sample"), "4242", "1"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert out.startswith("Sampling process 4242 for 1 second")
    assert "Analysis Tool:   /usr/bin/sample" in out


def end_to_end(state_dir: Path, timeout: float = 10.0) -> tuple[dict, float]:
    clock = FakeClock()
    enf = enforcer(state_dir, clock, evidence_timeout=timeout)
    began = time.monotonic()
    result = respond(enf, incident(), [target(101, rank=3)]).incident.to_json()
    return result, time.monotonic() - began


def incidents_text(state_dir: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "watchdog.cli", "incidents", "--state-dir",
                           str(state_dir)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_sample_evidence_is_parsed_into_the_incident(fake_sample_on_path, state_dir):
    result, _ = end_to_end(state_dir)
    assert fake_sample_on_path.read_text() == "101 1\n"
    native = state_dir / "evidence" / result["id"] / "rank3-pid101-native.txt"
    assert str(native) in result["evidence"]
    [hot] = result["native_hot"]
    assert hot["rank"] == 3 and hot["pid"] == 101
    assert hot["threads"][1]["top"][0] == {"frame": "ibv_poll_cq", "lib": "librdma.dylib",
                                           "samples": 1102}
    journaled = json.loads((state_dir / "incidents.jsonl").read_text().splitlines()[-1])
    assert journaled["native_hot"] == result["native_hot"]
    text = incidents_text(state_dir)
    assert "native stacks, rank 3 pid 101:" in text
    assert "Thread_8812260: StreamThread: 1102 of 1304 samples in ibv_poll_cq" in text


@pytest.mark.slow
def test_sample_that_fails_is_recorded_and_the_kill_goes_on(fake_sample_on_path, monkeypatch,
                                                            state_dir):
    monkeypatch.setenv("FAKE_SAMPLE", "fail")
    result, _ = end_to_end(state_dir)
    [hot] = result["native_hot"]
    assert hot["error"].startswith("no call graph in the output: sample cannot find any "
                                   "existing process")
    assert result["outcome"] == {"101": "killed"}
    assert "native stacks, rank 3 pid 101: no call graph" in incidents_text(state_dir)


@pytest.mark.slow
def test_sample_that_hangs_is_cut_at_the_evidence_timeout(fake_sample_on_path, monkeypatch,
                                                          state_dir):
    monkeypatch.setenv("FAKE_SAMPLE", "hang")
    result, took = end_to_end(state_dir, timeout=1.5)
    assert took < 30  # cut at ~1.5 s; generous for a loaded machine
    [hot] = result["native_hot"]
    assert hot["error"].startswith("no call graph in the output: Sampling process 101")
    assert result["outcome"] == {"101": "killed"}


def test_no_sample_at_its_path_means_no_native_evidence(monkeypatch, state_dir, tmp_path):
    """No /usr/bin/sample (this Linux host): none, even with a `sample` first on PATH
    (issue 57: a root daemon started from a user's shell runs no tool of theirs)."""
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    assert all(MacProbe().tool(path) is None for path in macos.TOOLS.values())
    assert MacProbe().tool("sample") is None and MacProbe().tool(str(BIN / "sample")) is None
    result, _ = end_to_end(state_dir)
    assert "native_hot" not in result and result["evidence"] == []


def test_load_per_cpu_on_a_mac_is_the_load_average(monkeypatch):
    # macOS has no /proc/loadavg: the generic one-minute average per core.
    monkeypatch.setattr(psutil, "getloadavg", lambda: (48.0, 30.0, 20.0))
    monkeypatch.setattr(psutil, "cpu_count", lambda: 24)
    assert MacProbe().load_per_cpu() == 2.0
    monkeypatch.setattr(psutil, "getloadavg", lambda: (3.0, 3.0, 3.0))
    assert MacProbe().load_per_cpu() == 1.0  # at least one

    def broken() -> tuple[float, float, float]:
        raise OSError("getloadavg failed")

    monkeypatch.setattr(psutil, "getloadavg", broken)
    assert MacProbe().load_per_cpu() == 1.0


class MacProcess:
    """psutil.Process as psutil behaves on macOS for the cases below."""

    behaviour = "ok"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        if self.behaviour == "gone":
            raise psutil.NoSuchProcess(pid)

    def oneshot(self):
        import contextlib

        return contextlib.nullcontext()

    def status(self) -> str:
        if self.behaviour == "denied":
            raise psutil.AccessDenied(self.pid)
        if self.behaviour == "vanishing":
            raise OSError(3, "No such process")
        return psutil.STATUS_ZOMBIE if self.behaviour == "zombie" else psutil.STATUS_RUNNING

    def create_time(self) -> float:
        return 1.7e9

    def uids(self):
        return collections.namedtuple("uids", "real effective saved")(501, 501, 501)

    def threads(self):
        # macOS: another user's threads need task_for_pid, which only root gets.
        if self.behaviour == "threads-denied":
            raise psutil.AccessDenied(self.pid)
        pthread = collections.namedtuple("pthread", "id user_time system_time")
        return [pthread(1, 3.0, 1.0), pthread(2, 0.5, 0.5)]


@pytest.mark.parametrize("behaviour, expected", [
    ("ok", ((1, 4.0), (2, 1.0))), ("threads-denied", ()), ("zombie", None), ("gone", None)])
def test_mac_process_samples(monkeypatch, behaviour, expected):
    monkeypatch.setattr(MacProcess, "behaviour", behaviour)
    monkeypatch.setattr(psutil, "Process", MacProcess)
    sample = MacProbe().sample(4242)
    assert (None if sample is None else sample.threads) == expected
    if sample is not None:
        assert (sample.uid, sample.start_time) == (501, 1.7e9)


@pytest.mark.parametrize("behaviour, message", [("denied", "access denied reading pid 4242"),
                                                ("vanishing", "reading pid 4242")])
def test_mac_process_errors(monkeypatch, behaviour, message):
    monkeypatch.setattr(MacProcess, "behaviour", behaviour)
    monkeypatch.setattr(psutil, "Process", MacProcess)
    with pytest.raises(ProbeError, match=message):
        MacProbe().sample(4242)


def test_split_offsets_of_one_function_are_summed():
    # `sample` lists one function once per return address, as siblings.
    text = ("Call graph:\n"
            "    100 Thread_7\n"
            "    + 100 start_wqthread  (in libsystem_pthread.dylib) + 8  [0x1]\n"
            "    + ! 60 __workq_kernreturn  (in libsystem_kernel.dylib) + 8  [0x2]\n"
            "    + ! 36 tbt_poll_cq  (in libjaccl_tbt.dylib) + 40  [0x3]\n"
            "    + 4 start_wqthread  (in libsystem_pthread.dylib) + 0,2  [0x4,0x5]\n")
    [thread] = samplegraph.parse(text)
    assert thread.to_json()["top"] == [
        {"frame": "__workq_kernreturn", "lib": "libsystem_kernel.dylib", "samples": 60},
        {"frame": "tbt_poll_cq", "lib": "libjaccl_tbt.dylib", "samples": 36},
        {"frame": "start_wqthread", "lib": "libsystem_pthread.dylib", "samples": 8}]


def test_incidents_output_survives_a_malformed_native_hot():
    from watchdog.cli.node.commands import _native_hot_lines

    def native_hot(hot):  # a journal line's native_hot, read as `incidents` reads it
        return Incident.from_json({"id": "i", "native_hot": hot}).native_hot

    lines = _native_hot_lines(native_hot([
        {"rank": 0, "pid": 1, "threads": [{"top": "x"}, None, {"thread": "T", "samples": 3,
                                                               "top": [{"frame": "f",
                                                                        "samples": 3}]}]},
        "junk", {"rank": 1, "pid": 2, "error": "no call graph"}]))
    assert lines == ["    native stacks, rank 0 pid 1:", "      T: 3 of 3 samples in f",
                     "    native stacks, rank 1 pid 2: no call graph"]
    assert _native_hot_lines(native_hot({"not": "a list"})) == []


def test_held_wired_memory_on_a_mac_is_each_processs_wired_size() -> None:
    """Issue 57, item 3: ri_wired_size (proc_pid_rusage, after ri_pageins) of every
    live process, summed; none readable (not root): unknown."""
    import struct

    from watchdog.daemon.probes import macos

    class Ps:
        @staticmethod
        def pids() -> list[int]:
            return [1, 2, 3]

    class Lib:
        def __init__(self, readable: bool) -> None:
            self.readable = readable

        def proc_pid_rusage(self, pid, flavor, buffer) -> int:  # type: ignore[no-untyped-def]
            if not self.readable or pid.value == 3:
                return -1
            struct.pack_into("<Q", buffer, macos.WIRED_OFFSET, pid.value << 20)
            return 0

    assert MacProbe(ps=Ps, libproc=Lib(True)).held_wired_bytes() == 3 << 20
    assert MacProbe(ps=Ps, libproc=Lib(False)).held_wired_bytes() is None
