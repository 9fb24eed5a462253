"""`mlx-watchdog demo` end to end: the real daemon, real ring ranks, real faults.

Each test runs the demo as a user would (`python -m watchdog.cli demo`), as a
subprocess with a hard timeout, and checks its exit code, its narration, and
that nothing it started is left: no rank, no daemon, no scratch directory.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import REPO

pytestmark = pytest.mark.ranks

TIMEOUT = 120


def demo_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def demo_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "watchdog.cli", "demo", "--ranks", "3", "--deadline", "3",
            *args]


def run_demo(tmp_path: Path, *args: str) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.run(demo_argv(*args), capture_output=True, text=True, timeout=TIMEOUT,
                          env=demo_env(), cwd=tmp_path)
    took = time.monotonic() - started
    return proc.returncode, proc.stdout + proc.stderr, took


def ours_alive(pid: int) -> bool:
    """Is pid still a live process of the demo (a rank or the daemon)?"""
    try:
        p = psutil.Process(pid)
        if p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        return "watchdog" in " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def assert_cleaned_up(out: str) -> None:
    ranks = [int(p) for p in re.findall(r"started rank \d+ \(pid (\d+)\)", out)]
    daemon = [int(p) for p in re.findall(r"started the watchdog daemon \(pid (\d+)\)", out)]
    assert len(ranks) >= 3 and len(daemon) == 1, out
    left = [pid for pid in ranks + daemon if ours_alive(pid)]
    assert not left, f"processes left behind: {left}\n{out}"
    scratch = re.search(r"scratch directory (\S+)", out)
    assert scratch, out
    assert not os.path.exists(scratch.group(1)), f"{scratch.group(1)} left behind"


def test_frozen_rank_is_named_and_the_job_ended(tmp_path):
    code, out, took = run_demo(tmp_path)
    assert code == 0, out
    frozen = re.search(r"rank 1 frozen with SIGSTOP \(pid (\d+)\)", out)
    assert frozen, out
    # Its peers are judged hung: "stalled" when their spinning thread gets most of a
    # core; on a loaded 2-core machine the share can drop under the spin ratio and
    # the same wait is "blocked" (the demo gives that verdict a short deadline too).
    assert re.search(r"watchdog sees: rank 0 suspect", out), out
    assert re.search(r"watchdog sees: rank 0 (stalled|blocked) .*rank 1 stopped", out), out
    assert re.search(r"verdict (stalled|blocked)", out), out
    assert f"culprit: rank 1 pid {frozen.group(1)}: stopped" in out, out
    assert re.search(rf"cause: peer_stopped: rank 1 on \S+ \(pid {frozen.group(1)}\) is "
                     r"stopped at all_sum #\d+", out), out
    assert re.search(r"watchdog sees: rank 0 killed; rank 1 killed; rank 2 killed", out), out
    assert "SIGTERM to rank 1" in out and "evidence:" in out, out
    # The hung rank's Python stack, down to the demo rank's own line of code.
    assert "where the hung rank waits" in out and "demo/rank.py" in out, out
    assert "mx.eval(x)" in out, out
    assert "outcome as expected" in out, out
    assert_cleaned_up(out)
    assert took < 60, f"the demo took {took:.0f}s"


def test_killed_rank_makes_the_ring_survivors_exit(tmp_path):
    code, out, took = run_demo(tmp_path, "--fault", "kill")
    assert code == 0, out
    assert re.search(r"rank 1 killed with SIGKILL \(pid \d+\)", out), out
    assert "connection to a peer was lost" in out, out
    assert re.search(r"rank 0 \(pid \d+\) exited with code 1", out), out
    assert re.search(r"watchdog sees: rank 0 exited.*rank 2 exited", out), out
    assert "had nothing to end" in out, out
    assert "outcome as expected" in out, out
    assert_cleaned_up(out)
    assert took < 60, f"the demo took {took:.0f}s"


def test_unanswered_recv_is_found_and_the_job_ended(tmp_path):
    code, out, took = run_demo(tmp_path, "--fault", "mismatch")
    assert code == 0, out
    assert re.search(r"watchdog sees: rank 0 (stalled|blocked) \([\d.]+s in eval \(recv #\d+\)",
                     out), out
    assert re.search(r"culprit: rank 0 pid \d+: (stalled|blocked) in eval after recv #\d+",
                     out), out
    assert "mx.distributed.recv" in out, out  # the line of code it waits in, from the dump
    assert re.search(r"watchdog sees: rank 0 killed; rank 1 killed; rank 2 killed", out), out
    assert "outcome as expected" in out, out
    assert_cleaned_up(out)
    assert took < 60, f"the demo took {took:.0f}s"


def _as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # not ignored, as in a background job


class LiveDemo:
    """The demo as a subprocess whose output is read as it comes."""

    def __init__(self, tmp_path: Path, *args: str, **popen: Any) -> None:
        self.proc = subprocess.Popen(demo_argv(*args), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=demo_env(),
                                     cwd=tmp_path, **popen)
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for_line(self, marker: str, timeout: float = 90) -> None:
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None, "the demo ended early:\n" + self.text()
                continue
            self.out.append(line)
            if marker in line:
                return
        pytest.fail(f"no line with {marker!r} within {timeout}s:\n" + self.text())

    def finish(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.reader.join(timeout=5)
            while not self.lines.empty():
                self.out.append(self.lines.get())

    def text(self) -> str:
        return "".join(self.out)


def test_ctrl_c_cleans_up_everything(tmp_path):
    # Its own process group, like a terminal's foreground job: Ctrl-C reaches the
    # demo, the daemon and every rank at once.
    demo = LiveDemo(tmp_path, start_new_session=True, preexec_fn=_as_in_a_terminal)
    try:
        demo.wait_for_line("frozen with SIGSTOP")
        os.killpg(demo.proc.pid, signal.SIGINT)  # Ctrl-C, while a rank is stopped
    finally:
        code = demo.finish()
    text = demo.text()
    assert code == 130, text
    assert "interrupted: cleaning up" in text and "cleanup: removed" in text, text
    assert_cleaned_up(text)


def test_sigterm_cleans_up_everything(tmp_path):
    demo = LiveDemo(tmp_path, "--fault", "mismatch")
    try:
        demo.wait_for_line("ranks up")
        demo.proc.terminate()
    finally:
        code = demo.finish()
    text = demo.text()
    assert code == 130, text
    assert "interrupted: cleaning up" in text and "cleanup: killed leftover ranks" in text, text
    assert_cleaned_up(text)
