"""The real `mlx_lm lora --train` over 2 ring ranks (data parallel: gradients averaged with
an all_sum every step, rank 0 alone saving the adapters), instrumented by MLX_WATCHDOG=1
only, watched by the real daemon at its default settings, on a tiny random model and a
small dataset written here:

(a) a run with validation and periodic saves ends with both ranks at 0, no incident;
(b) a frozen peer is ended within the floor plus 15 s, the frozen rank named;
(c) a peer paused 40 s and resumed: the run finishes, no incident;
(d) rank 0's checkpoint to slow storage (~105 s, bytes trickling) holds the job: shown
    held, the run finishes, no incident;
(e) a checkpoint to storage that never answers is ended at the documented bound (the
    floor of silence, docs/configuration.md), the incident naming rank 0 and its op.

One daemon, one model and one dataset serve the module; the five jobs run at once, each a
thread that drives its own job (its own ports) and keeps what it saw, and each test joins
its own: the module takes about as long as the slow save, not the sum of the five.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.lm_server import DefaultDaemon, build_model
from tests.support.lm_train import LmTrain, SlowStorage, build_dataset, checkpoint_name
from tests.support.ranks import wait_for

pytestmark = pytest.mark.ranks

FLOOR = 60.0  # auto_floor: a training step's waits last well under it (docs/configuration.md)
BOUND = FLOOR + 15  # seconds from a freeze (or a save going silent) to every rank ended
PAUSE = 40.0
SLOW_SAVE = 105.0  # seconds the slow storage takes: past BOUND, when a silent save is ended
SAVE_AT = 20  # the iteration whose checkpoint is slow (its eval deadline learned by then)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dataset(tmp_path_factory.mktemp("data"))


class Scenario(threading.Thread):
    """One job of the module, driven by `script` on a thread of its own."""

    def __init__(self, name: str, job: LmTrain, daemon: DefaultDaemon,
                 script: Callable[[Scenario], None]) -> None:
        super().__init__(daemon=True, name=name)
        self.job, self.node, self.script = job, daemon, script
        self.facts: dict[str, Any] = {}
        self.error = ""
        self.reasons: set[str] = set()  # the daemon's reasons for this job's ranks, as seen
        self.named: list[dict[str, Any]] = []  # the daemon's stragglers of this job, as seen

    def run(self) -> None:
        try:
            with self.job:
                self.script(self)
        except Exception:  # reported by the test that joins it
            self.error = traceback.format_exc() + self.job.logs()

    def jobid(self) -> str:
        records = wait_for(lambda: len(self.job.records()) == 2 and self.job.records(), 120,
                           interval=0.2, what="both records")
        ids = {r.job for r in records.values()}
        assert len(ids) == 1, ids
        return ids.pop()

    def shown(self) -> dict[int, dict[str, Any]]:
        """This job's ranks as the daemon shows them, by rank; their reasons kept."""
        status = self.node.status()
        ranks = {r["rank"]: r for r in status["ranks"] if r["pid"] in self.job.pids}
        self.reasons.update(r["reason"] or "" for r in ranks.values())
        self.named += [s for s in status.get("stragglers", []) if s["pid"] in self.job.pids]
        return ranks

    def learned(self) -> bool:
        """Both ranks in a training step's eval, on the learned deadline, not the fallback."""
        ranks = self.shown()
        return len(ranks) == 2 and all(r["deadline_seconds"] < 600 for r in ranks.values())

    def finish(self, timeout: float) -> list[int | None]:
        def done() -> bool:
            self.shown()
            return self.job.finished()
        wait_for(done, timeout, interval=0.5, what="the training to end")
        return self.job.codes()

    def incidents(self) -> list[dict[str, Any]]:
        job = self.facts.get("job")
        return [i for i in self.node.incidents() if i["job"] == job]


def healthy(s: Scenario) -> None:
    s.facts["job"] = s.jobid()
    s.facts["codes"] = s.finish(300)


def frozen(s: Scenario) -> None:
    s.facts["job"] = s.jobid()
    wait_for(s.learned, 180, interval=0.5, what="the learned deadline")
    s.job.signal(1, signal.SIGSTOP)
    froze = time.monotonic()
    wait_for(s.job.finished, BOUND + 60, interval=0.2, what="both ranks ended")
    s.facts["took"] = time.monotonic() - froze
    s.facts["incident"] = wait_for(lambda: s.incidents(), 30, what="the incident")[0]


def paused(s: Scenario) -> None:
    s.facts["job"] = s.jobid()
    wait_for(s.learned, 180, interval=0.5, what="the learned deadline")
    s.job.signal(1, signal.SIGSTOP)
    s.facts["paused_at"] = s.job.records()[1].collectives
    time.sleep(PAUSE)
    s.job.signal(1, signal.SIGCONT)
    s.facts["codes"] = s.finish(300)


def slow_save(s: Scenario) -> None:
    s.facts["job"] = s.jobid()
    storage: SlowStorage = s.facts["storage"]
    regular = s.job.adapters / "adapters.safetensors"  # written first, at the same save
    wait_for(lambda: regular.exists() and regular.stat().st_size > 0, 300, interval=0.2,
             what="the first save")
    storage.size = regular.stat().st_size
    s.facts["codes"] = s.finish(SLOW_SAVE + 300)
    storage.join(30)


def stuck_save(s: Scenario) -> None:
    s.facts["job"] = s.jobid()

    def saving() -> bool:
        r = s.job.records().get(0)
        s.shown()
        return r is not None and r.op == "save_safetensors" and r.phase.label == "wait"
    # The first save (a regular file) takes milliseconds; the FIFO's never ends.
    wait_for(lambda: saving() and (s.job.adapters / "adapters.safetensors").exists(), 300,
             interval=0.2, what="rank 0 in the checkpoint's save")
    began = time.monotonic()
    wait_for(lambda: s.shown() is not None and s.job.finished(), 600, interval=0.2,
             what="both ranks ended")
    s.facts["took"] = time.monotonic() - began
    s.facts["incident"] = wait_for(lambda: s.incidents(), 30, what="the incident")[0]


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory, model: Path,
              data: Path) -> Iterator[dict[str, Scenario]]:
    base = tmp_path_factory.mktemp("node")
    records = base / "records"
    records.mkdir()
    with DefaultDaemon(records, base / "state") as daemon:
        def job(name: str, **shape: int) -> LmTrain:
            folder = tmp_path_factory.mktemp(name)
            return LmTrain(folder, records, model, data, **shape)
        runs = {
            "healthy": (job("healthy", iters=40, save_every=10, eval_every=10), healthy),
            "frozen": (job("frozen", iters=100000, save_every=1000, eval_every=1000), frozen),
            "paused": (job("paused", iters=200, save_every=50, eval_every=25), paused),
            "slow_save": (job("slow", iters=SAVE_AT + 4, save_every=SAVE_AT, eval_every=10),
                          slow_save),
            "stuck_save": (job("stuck", iters=SAVE_AT + 4, save_every=SAVE_AT, eval_every=10),
                           stuck_save),
        }
        found = {name: Scenario(name, train, daemon, script)
                 for name, (train, script) in runs.items()}
        slow = SlowStorage(found["slow_save"].job.adapters / checkpoint_name(SAVE_AT),
                           seconds=SLOW_SAVE)
        found["slow_save"].facts["storage"] = slow
        SlowStorage(found["stuck_save"].job.adapters / checkpoint_name(SAVE_AT))  # never read
        slow.start()
        for scenario in found.values():
            scenario.start()
        yield found
        for scenario in found.values():
            scenario.join(1)
        slow.stopping.set()


def joined(scenarios: dict[str, Scenario], name: str, timeout: float = 900) -> Scenario:
    s = scenarios[name]
    s.join(timeout)
    assert not s.is_alive(), f"{name} still running"
    assert not s.error, s.error
    return s


def test_a_training_run_with_validation_and_saves_ends_clean(
        scenarios: dict[str, Scenario]) -> None:
    s = joined(scenarios, "healthy")
    assert s.facts["codes"] == [0, 0], s.job.logs()
    assert s.incidents() == []
    assert s.named == [], s.named  # two ranks in step, with ordinary jitter: no straggler
    saved = sorted(p.name for p in s.job.adapters.glob("*_adapters.safetensors"))
    assert saved == [checkpoint_name(n) for n in (10, 20, 30, 40)], saved
    assert "val" in s.job.log(0)  # validation ran (rank 0 reports it)


def test_a_frozen_peer_is_ended_within_the_floor_plus_15s_and_named(
        scenarios: dict[str, Scenario]) -> None:
    s = joined(scenarios, "frozen")
    took, incident = s.facts["took"], s.facts["incident"]
    print(f"frozen peer: every rank ended {took:.1f}s after the freeze")
    assert FLOOR <= took <= BOUND, f"the frozen training job was ended after {took:.0f}s"
    assert incident["verdict"] == "stalled", incident
    culprit = incident["culprit"]
    assert culprit["rank"] == 1 and culprit["pid"] == s.job.pids[1], incident
    assert culprit["state"] == "stopped"
    assert sorted(incident["pids"]) == sorted(s.job.pids)


def test_a_peer_paused_40s_and_resumed_finishes_with_no_incident(
        scenarios: dict[str, Scenario]) -> None:
    s = joined(scenarios, "paused")
    assert s.facts["codes"] == [0, 0], s.job.logs()
    assert s.incidents() == []


def test_a_checkpoint_to_slow_storage_holds_the_job_and_the_run_finishes(
        scenarios: dict[str, Scenario]) -> None:
    s = joined(scenarios, "slow_save")
    storage: SlowStorage = s.facts["storage"]
    assert s.facts["codes"] == [0, 0], s.job.logs()
    assert s.incidents() == []
    print(f"slow save: {storage.size} bytes in {storage.ended - storage.began:.1f}s; "
          f"held: {sorted(r for r in s.reasons if 'held' in r)[:3]}")
    assert storage.received == storage.size > 0  # the whole checkpoint went through
    assert storage.ended - storage.began >= SLOW_SAVE * 0.7, (storage.began, storage.ended)
    # Rank 1 waited past its learned deadline in the next step's all_sum, and was held.
    held = [r for r in s.reasons if "held: rank 0 is writing a checkpoint (save_safetensors"
            in r]
    assert held, s.reasons
    assert any("B written)" in r for r in held), held


def test_a_checkpoint_to_storage_that_never_answers_is_ended_and_rank_0_named(
        scenarios: dict[str, Scenario]) -> None:
    s = joined(scenarios, "stuck_save")
    took, incident = s.facts["took"], s.facts["incident"]
    print(f"stuck save: every rank ended {took:.1f}s after rank 0 began it; {incident}")
    assert FLOOR <= took <= BOUND, f"the stuck save was ended after {took:.0f}s"
    assert sorted(incident["pids"]) == sorted(s.job.pids)
    saving = next(r for r in incident["ranks"] if r["rank"] == 0)
    assert saving["op"] == "save_safetensors", incident
    culprit = incident["culprit"]
    assert culprit is not None and culprit["rank"] == 0, incident
    assert "save_safetensors" in culprit["reason"], culprit
