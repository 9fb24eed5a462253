"""The real daemon's /metrics against real MLX ring ranks (healthy, frozen, killed,
expired): `python -m watchdog.cli run` and a ring job, scrapes parsed with
`prometheus_client.parser`, as Prometheus would read them.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.support.ranks import DaemonProc, RingJob, samples, scrape, value, wait_for
from tests.unit.net.test_metrics import RANK_FAMILIES, P


def stalls(families: dict, verdict: str) -> float:
    """Hangs acted on with this verdict, whatever their cause."""
    return sum(samples(families, P + "stalls_total", verdict=verdict).values())


def rank_states(families: dict, job: str) -> dict[str, str]:
    """rank -> the state whose series is 1, for one job."""
    return {dict(k)["rank"]: dict(k)["state"]
            for k, v in samples(families, P + "rank_state", mlx_job=job).items() if v == 1}


def rank_series(families: dict, job: str) -> list:
    return [s for name in RANK_FAMILIES for s in families[name].samples
            if s.labels.get("mlx_job") == job]


def compress(history: list[str]) -> list[str]:
    out: list[str] = []
    for state in history:
        if not out or out[-1] != state:
            out.append(state)
    return out


@pytest.mark.ranks
def test_real_job_healthy_frozen_killed_then_expired(tmp_path, record_dir, state_dir):
    size = 2
    with DaemonProc(record_dir, state_dir, deadline=2, retention=2) as daemon, \
            RingJob(tmp_path, record_dir, size, "loop") as job:
        url = daemon.url()
        recs = job.wait_running()
        name = recs[0].job
        ranks = [str(r) for r in range(size)]

        # Healthy: every rank running, progress and collectives growing.
        def healthy(f: dict) -> bool:  # running, and past init (whose deadline is 600 s)
            return rank_states(f, name) == dict.fromkeys(ranks, "running") and all(
                value(f, P + "rank_deadline_seconds", mlx_job=name, uid="0", rank=r) == 2
                for r in ranks)

        first = wait_for(lambda: (f := scrape(url)) and healthy(f) and f, 15,
                         what="every rank running in /metrics")
        assert value(first, P + "kills_total", signal="SIGTERM") == 0
        assert stalls(first, "stalled") == 0
        assert value(first, P + "job_kills_total", mlx_job=name, uid="0") == 0
        time.sleep(0.6)  # a couple of scans
        second = scrape(url)
        for r in ranks:
            for counter in (P + "rank_progress_total", P + "rank_collectives_total"):
                before = value(first, counter, mlx_job=name, uid="0", rank=r)
                after = value(second, counter, mlx_job=name, uid="0", rank=r)
                assert after > before > 0, (counter, r, before, after)

        # The reboot gauge follows the flag file on the next scan.
        flag = state_dir / "reboot-required"
        flag.write_text(json.dumps({"reason": "test flag"}))
        wait_for(lambda: value(scrape(url), P + "node_reboot_required") == 1, 5,
                 what="reboot gauge 1 after the flag appeared")
        flag.unlink()
        wait_for(lambda: value(scrape(url), P + "node_reboot_required") == 0, 5,
                 what="reboot gauge 0 after the flag went")

        # Freeze rank 1: it reads `stopped`; the survivor goes suspect, then stalled.
        job.signal(1, signal.SIGSTOP)
        history: dict[str, list[str]] = {r: [] for r in ranks}
        cpu_when_stalled: list[float] = []
        last: dict = {}
        end = time.monotonic() + 40
        while time.monotonic() < end:
            last = scrape(url)
            for r, state in rank_states(last, name).items():
                history[r].append(state)
                if state == "stalled":
                    cpu_when_stalled.append(value(
                        last, P + "rank_busiest_thread_cpu_ratio", mlx_job=name, uid="0", rank=r))
            if (all(p.poll() is not None for p in job.procs)
                    and value(last, P + "kills_total", signal="SIGTERM")
                    and set(rank_states(last, name).values()) == {"killed"}):
                break
            time.sleep(0.1)
        seen = {r: compress(h) for r, h in history.items()}
        assert all(p.poll() is not None for p in job.procs), seen
        assert "stopped" in seen["1"] and not {"suspect", "stalled"} & set(seen["1"]), seen
        survivor = seen["0"]
        assert "suspect" in survivor and "stalled" in survivor, seen
        assert survivor.index("suspect") < survivor.index("stalled"), seen
        # A spinning thread is what "stalled" means (a loaded machine gives it less
        # than a core; the detector scales its threshold by the load).
        assert max(cpu_when_stalled) >= 0.1
        assert {h[-1] for h in seen.values()} == {"killed"}, seen

        # The kill moved the counters: one stall acted on, every rank ended by SIGTERM.
        ended = sum(p.returncode == -signal.SIGTERM for p in job.procs)
        assert ended == size
        assert value(last, P + "kills_total", signal="SIGTERM") == size
        assert value(last, P + "kills_total", signal="SIGKILL") == 0
        assert stalls(last, "stalled") == 1
        assert stalls(last, "blocked") == 0
        assert value(last, P + "job_kills_total", mlx_job=name, uid="0") == ended

        # After `retention` (2 s) the killed ranks' series are gone; the counters stay.
        gone = wait_for(lambda: (f := scrape(url)) and not rank_series(f, name) and f, 10,
                        what="the killed ranks' series to disappear")
        assert value(gone, P + "job_kills_total", mlx_job=name, uid="0") == ended
        assert value(gone, P + "kills_total", signal="SIGTERM") == size
        assert daemon.alive()


@pytest.mark.ranks
def test_observe_mode_counts_one_hang_once(tmp_path, record_dir, state_dir):
    """In observe mode a hang that lasts is one stall and one incident, not one
    per scan: the stalls counter counts hangs, and the journal must not grow
    by a line every interval for as long as the hang lasts."""
    with DaemonProc(record_dir, state_dir, "--mode", "observe", deadline=1.5) as daemon, \
            RingJob(tmp_path, record_dir, 2, "loop") as job:
        url = daemon.url()
        name = job.wait_running()[0].job
        job.signal(1, signal.SIGSTOP)
        wait_for(lambda: stalls(scrape(url), "stalled"), 30,
                 what="the hang to be observed")
        time.sleep(2.5)  # ten more scans of the same hang
        families = scrape(url)
        assert rank_states(families, name) == {"0": "stalled", "1": "stopped"}
        assert all(p.poll() is None for p in job.procs), "observe mode ended a rank"
        assert value(families, P + "kills_total", signal="SIGTERM") == 0
        assert stalls(families, "stalled") == 1
        assert len(daemon.incidents()) == 1
