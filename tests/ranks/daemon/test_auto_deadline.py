"""The real daemon under its default judgement (deadline auto) with a short floor,
against real ring ranks: a long first step and a long prefill after many short
steps are not killed; a frozen peer is still caught.

Only the floor is lowered (3 s instead of 60 s) so that the learned deadline is
short enough to be tested; auto_factor, auto_min_waits, auto_fallback,
blocked_deadline, spin_ratio, confirm and the scan interval are the defaults.
Evidence, grace and kill timeouts are shortened: they shape the ladder, not
the verdict."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from tests.support.ranks import DaemonProc, RingJob, torn_down, wait_for

pytestmark = pytest.mark.ranks

FLOOR = 3.0
DEFAULTS = dict(deadline="auto", auto_floor=FLOOR, interval=1.0, blocked_deadline=900)


def learned(daemon: DaemonProc, ranks: list[int]) -> bool:
    """Every rank's current deadline is a learned one (not the 600 s fallback)."""
    seen = daemon.ranks()
    return all(pid in seen and seen[pid]["phase"] == "wait"
               and seen[pid]["deadline_seconds"] < 600 for pid in ranks)


def test_a_frozen_peer_is_caught_at_the_learned_deadline(tmp_path, record_dir, state_dir):
    with DaemonProc(record_dir, state_dir, **DEFAULTS) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        job.wait_running()
        # Fast waits: the job is learned within seconds; its deadline is the floor, or
        # 4x the slowest round when the machine is loaded.
        wait_for(lambda: learned(daemon, job.pids), 90, interval=0.2,
                 what="the learned deadline")
        frozen = job.procs[1].pid
        job.signal(1, signal.SIGSTOP)
        froze = time.monotonic()
        wait_for(lambda: all(p.poll() is not None for p in job.procs), 60,
                 what="the hung job ended")
        assert time.monotonic() - froze >= FLOOR
        inc = wait_for(daemon.incidents, 10, what="the incident")[-1]
        assert inc["verdict"] == "stalled"
        assert inc["culprit"]["pid"] == frozen and inc["culprit"]["state"] == "stopped"
        assert torn_down(inc["outcome"]), inc["outcome"]
        found = re.search(r"past the ([0-9.]+)s deadline", inc["reason"])
        assert found and FLOOR <= float(found.group(1)) < 600, inc["reason"]
    # What was learned outlives the daemon: the state dir has it per kind.
    kept = json.loads((state_dir / "learned.json").read_text())["jobs"]
    kinds = {k for entry in kept.values() for k in entry["kinds"]}
    assert kinds & {"eval", "item"}, kept


def run_prefill(tmp_path, record_dir, state_dir, first: float, prefill: float,
                platform: dict[str, str] | None = None):
    """Run the prefill mode under the daemon; the ranks' status rows seen during
    the first step and during the prefill. Fails on any incident or kill."""
    daemon = DaemonProc(record_dir, state_dir, **DEFAULTS)
    daemon.extra_env = dict(platform or {})
    with daemon, RingJob(tmp_path, record_dir, 2, "prefill",
                         args=(str(first), "8", str(prefill)), env=platform) as job:
        wait_for(lambda: "prefill 1 start" in job.log(0), 60, what="the first step")
        rows: dict[str, list[dict]] = {"first": [], "prefill": []}
        while any(p.poll() is None for p in job.procs):
            log = job.log(0)
            # Each window is its long step alone: not the short rounds between them,
            # nor the rounds after the prefill (their `.item()` and `.tolist()` waits
            # are a kind of their own, learned down to the floor).
            phase = ("first" if "short rounds" not in log
                     else "prefill" if "prefill 2 start" in log
                     and log.count("long step took") < 2 else None)
            if phase is not None:
                rows[phase].extend(r for r in map(daemon.ranks().get, job.pids)
                                   if r and (r["current_op"] or "").startswith("eval"))
            time.sleep(0.25)
            assert daemon.incidents() == [], daemon.incidents()
        assert [p.returncode for p in job.procs] == [0, 0], job.log(0) + job.log(1)
        assert "done" in job.log(0) and "done" in job.log(1)
        assert daemon.incidents() == []
        took = [float(t) for t in re.findall(r"long step took ([0-9.]+)s", job.log(0))]
    assert len(took) == 2, job.log(0)
    return {k: [r for r in v if r["phase"] == "wait"] for k, v in rows.items()}, took


def test_incident_3_a_cold_first_step_then_a_prefill_as_long_after_short_steps(
        tmp_path, record_dir, state_dir):
    rows, took = run_prefill(tmp_path, record_dir, state_dir, first=3 * FLOOR,
                             prefill=3 * FLOOR)
    assert took[0] > FLOOR, f"the first step took {took[0]}s: not long, the test proves nothing"
    # The first step (longer than the floor) was judged on the fallback: nothing known yet.
    assert rows["first"] and {r["deadline_seconds"] for r in rows["first"]} == {600}
    # Eight seconds of short decode steps (thousands) did not bring the eval deadline down
    # to the floor: the first step taught it (4 x its length, as rank 0 timed it).
    learned = {r["deadline_seconds"] for r in rows["prefill"]}
    assert learned and min(learned) >= 4 * took[0] * 0.9, (learned, took)


def test_incident_6_a_prefill_longer_than_anything_learned_is_held_not_killed(
        tmp_path, record_dir, state_dir):
    """On the simulated Mac (its GPU profile) both ranks compute the long step with every
    CPU thread asleep in the eval, then rank 0 waits in the all_sum while rank 1 computes
    on: only their GPU time advancing tells it from a quiet hang. (On Linux a peer
    computing on the CPU holds its job: test_slow_peer, test_wedge's matmul chain; the
    Mac's case is the hard one, nothing on its CPU moves.)"""
    platform = {"MLX_WATCHDOG_SIMULATE": "macos"}
    rows, took = run_prefill(tmp_path, record_dir, state_dir, first=0.5, prefill=4 * FLOOR,
                             platform=platform)
    # The prefill ran on a learned deadline and outlasted it; the rule that a rank
    # computing (or still making progress) is not a hang is what kept the job.
    late = [r for r in rows["prefill"] if r["deadline_seconds"] < 600
            and r["seconds_in_wait"] > r["deadline_seconds"]]
    assert late, rows["prefill"][-4:]
    assert any(r["state"] == "suspect" and "GPU time advances" in r["reason"]
               for r in late), late
