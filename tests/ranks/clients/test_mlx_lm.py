"""A real client nobody here wrote: mlx-lm generation over 2 ring ranks, instrumented
only by MLX_WATCHDOG=1, watched by the real daemon under its default settings (the
`auto` deadline) except for a short deadline floor."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.support.ranks import LM_PROG, DaemonProc, RingJob, wait_for
from watchdog.states import Phase

pytestmark = pytest.mark.ranks

FLOOR = 3.0
# The daemon's defaults (docs/configuration.md), restated: DaemonProc's own are short.
DEFAULTS = dict(interval=1.0, deadline="auto", grace=10, kill_timeout=10, evidence_timeout=10,
                blocked_deadline=900, auto_floor=FLOOR)
ZERO_CODE = {"MLX_WATCHDOG": "1"}


def learned_deadlines(daemon: DaemonProc, job: RingJob) -> dict[int, float] | None:
    """Each rank's deadline once `auto` has learned it (not the fallback before that)."""
    ranks = daemon.ranks()
    found = {pid: ranks[pid]["deadline_seconds"] for pid in job.pids if pid in ranks}
    if len(found) == len(job.pids) and all(d is not None and d < 100 for d in found.values()):
        return found
    return None


def test_a_frozen_peer_during_mlx_lm_generation_is_caught(tmp_path: Path, record_dir: Path,
                                                            state_dir: Path) -> None:
    with DaemonProc(record_dir, state_dir, **DEFAULTS) as daemon, \
            RingJob(tmp_path, record_dir, 2, "generate", env=ZERO_CODE, prog=LM_PROG) as job:
        job.wait_running(timeout=120, collectives=64)
        deadlines = wait_for(lambda: learned_deadlines(daemon, job), 120,
                             what="the auto deadline to be learned")
        deadline = max(deadlines.values())
        assert deadline >= FLOOR
        wait_for(lambda: "round 3 " in job.log(0), 60, what="three rounds of generation")
        frozen = job.procs[1].pid
        job.signal(1, signal.SIGSTOP)
        froze_at = time.monotonic()
        # The survivor sits in mlx-lm's async_eval (or the .item() after it): a wait. The
        # one it is stuck in has lasted seconds (an async_eval that schedules and returns
        # may be seen in a wait a moment before the eval that blocks).
        survivor = wait_for(lambda: next((r for r in job.records().values()
                                          if r.rank == 0 and r.phase is Phase.WAIT
                                          and time.monotonic_ns() - r.wait_since_ns > 2e9),
                                         None),
                            30, what="rank 0 in a wait of seconds")
        assert survivor.op in ("async_eval", "item", "eval"), survivor.op
        wait_for(lambda: job.procs[0].poll() is not None, 120, what="the survivor to be ended")
        took = time.monotonic() - froze_at
        assert took >= FLOOR, "ended before the deadline"
        interval, grace, evidence = (float(DEFAULTS[k]) for k in  # type: ignore[arg-type]
                                     ("interval", "grace", "evidence_timeout"))
        # Judged within deadline + 2 scans; evidence is time-boxed before the SIGTERM, and
        # the grace bounds the SIGTERM (a rank in pthread_cond_wait dies at once on it).
        assert took <= deadline + 2 * interval + evidence + grace, (took, deadline)
        wait_for(lambda: job.procs[1].poll() is not None, 30, what="the frozen rank to go too")
        assert [p.returncode for p in job.procs] == [-signal.SIGTERM] * 2
        inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
        assert inc["verdict"] == "stalled"
        assert inc["culprit"]["pid"] == frozen and inc["culprit"]["rank"] == 1
        assert inc["culprit"]["state"] == "stopped"
        waiting = next(r for r in inc["ranks"] if r["rank"] == 0)
        # The wait it was judged in: mlx-lm's async_eval, or the eval or .item() after it
        # (which of them blocks on the frozen peer varies from run to run).
        assert waiting["phase"] == "wait" and waiting["op"] in ("async_eval", "item", "eval")
        assert waiting["seconds_in_wait"] >= FLOOR
        assert inc["flight_recorder_tail"]["0"][-1]["op"] == "all_sum"
        # Evidence: the survivor's main thread, in mlx-lm's generate_step, in the entry
        # point (the wrapper carries the entry point's name into every stack dump).
        python = [p for p in inc["evidence"] if p.endswith("-python.txt") and "rank0" in p]
        assert python, inc["evidence"]
        dump = Path(python[0]).read_text()
        assert "generate_step" in dump and f"in {waiting['op']}" in dump, dump
        native = [p for p in inc["evidence"] if p.endswith("-native.txt") and "rank0" in p]
        text = Path(native[0]).read_text() if native else ""
        if "MainThread" in text:  # py-spy attached within its time box (a busy box may not)
            assert waiting["op"] in text, text


def test_an_idle_mlx_lm_style_server_is_never_judged_then_serves(
        tmp_path: Path, record_dir: Path, state_dir: Path) -> None:
    """Rank 0 polls for requests and shares the flag with a tiny all_sum every ~0.1 s
    (no hb.idle(): zero-code, as mlx_lm.server would run); nobody asks for 20 s (more than
    six deadlines, four fallbacks: the real mlx_lm.server idles at the defaults elsewhere)."""
    folder = tmp_path / "requests"
    folder.mkdir()
    # The flag's waits are far shorter than a scan; `auto` learns them all the same, from
    # the record's pace table: the deadline is the floor (3 s here) or 4 x the longest,
    # never the fallback (5 s here, for a kind not yet learned), so that a false
    # judgement of the idle loop, or of the backstop, would show within the test.
    with DaemonProc(record_dir, state_dir, **{**DEFAULTS, "auto_fallback": 5}) as daemon, \
            RingJob(tmp_path, record_dir, 2, "server", (str(folder),), env=ZERO_CODE,
                    prog=LM_PROG) as job:
        job.wait_running(timeout=120, collectives=5)
        wait_for(lambda: all(pid in daemon.ranks() for pid in job.pids), 60,
                 what="both ranks watched")
        # Past init as the daemon sees them (init has a deadline of its own, 600 s): the
        # daemon's view may lag the ranks' own by a scan.
        wait_for(lambda: all(daemon.ranks()[pid]["phase"] != "init"
                             and FLOOR <= daemon.ranks()[pid]["deadline_seconds"] != 5
                             for pid in job.pids), 30, what="the learned deadline")
        assert all(daemon.ranks()[pid]["deadline_seconds"] < 60 for pid in job.pids)
        first = {pid: r["progress"] for pid, r in daemon.ranks().items()}
        idle_until = time.monotonic() + 20
        seen: set[str] = set()
        while time.monotonic() < idle_until:
            states = {r["state"] for pid, r in daemon.ranks().items() if pid in job.pids}
            seen |= states
            assert states <= {"running", "suspect"}, daemon.ranks()
            assert daemon.incidents() == []
            assert all(p.poll() is None for p in job.procs)
            time.sleep(0.5)
        assert "running" in seen
        ranks = daemon.ranks()
        for pid in job.pids:  # the flag's all_sum kept completing: progress, not a hang
            assert ranks[pid]["progress"] > first.get(pid, 0) + 100
        # Then a request is served, by both ranks alike.
        (folder / "request").write_text("16")
        replies = [folder / f"reply-rank{r}.json" for r in range(2)]
        wait_for(lambda: all(p.exists() for p in replies), 60, what="the replies")
        tokens = [json.loads(p.read_text()) for p in replies]
        assert tokens[0] == tokens[1] and len(tokens[0]) == 16, tokens
        assert all(0 <= t < 256 for t in tokens[0])
        time.sleep(3)  # a few scans after serving: still nothing judged
        assert daemon.incidents() == []
        assert all(p.poll() is None for p in job.procs)
        kills = [line for line in daemon.log().splitlines() if "SIGTERM" in line
                 or "SIGKILL" in line]
        assert kills == [], kills
