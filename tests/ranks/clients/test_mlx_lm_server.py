"""The real `python -m mlx_lm.server` over 2 ring ranks, instrumented by MLX_WATCHDOG=1
only, watched by the real daemon at its default settings (only the directories and the
address given): a frozen peer is ended within 90 s whether the server idles, generates
or prefills, a killed peer takes its job down, and 3 minutes of real traffic (idle gaps, a
long prompt, a long generation) end in no incident.

One daemon and one healthy server are shared by the module: the healthy server's traffic
runs in the background for its 3 minutes while the fault tests run, each on a server (a
job) of its own; the three frozen peers run at once, so the whole module takes about as
long as its traffic, not the sum of its faults.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.lm_server import DefaultDaemon, LmServer, build_model
from tests.support.ranks import scrape, value, wait_for

pytestmark = pytest.mark.ranks

# docs/configuration.md: a server's waits last milliseconds, so auto learns 4 x the longest
# of them, under the 60 s floor: the floor is the deadline of every kind it has seen.
LEARNED = 60.0
BOUND = 90.0  # seconds from the freeze until every rank of the job is gone (docs/performance.md)
TRAFFIC = 180.0  # seconds of healthy traffic
LONG_PROMPT = 1500  # words of the long prompts (3 tokens each: a prefill of seconds here)


def words(n: int, salt: str) -> str:
    """A prompt of `n` words that no earlier prompt shares (the server caches prompts)."""
    return " ".join(f"{salt} fox lazy" if i % 7 == 0 else "watchdog dog quick"
                    for i in range(n))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DefaultDaemon, Path]]:
    base = tmp_path_factory.mktemp("node")
    records, state = base / "records", base / "state"
    records.mkdir()
    with DefaultDaemon(records, state) as daemon:
        yield daemon, records


class Traffic(threading.Thread):
    """A user of the healthy server: short chats with idle gaps, a long prompt and a long
    generation among them, for TRAFFIC seconds; every answer is checked."""

    def __init__(self, server: LmServer, daemon: DefaultDaemon | None = None) -> None:
        super().__init__(daemon=True)
        self.server, self.answers, self.errors = server, 0, []  # type: ignore[var-annotated]
        # The daemon's stragglers naming a rank of this server, as seen after each step
        # (rank 0 reads requests while rank 1 waits in a collective: never a straggler).
        self.watched, self.named = daemon, []  # type: ignore[var-annotated]
        self.began = time.monotonic()
        self.long_prompt_seconds = self.long_generation_seconds = 0.0

    def ask(self, text: str, tokens: int) -> float:
        began = time.monotonic()
        answer = self.server.chat(text, tokens, timeout=300)
        if answer["usage"]["completion_tokens"] < 1 or not answer["choices"]:
            raise AssertionError(f"an empty answer: {answer}")
        self.answers += 1
        return time.monotonic() - began

    def run(self) -> None:
        plan: list[Any] = ["chat", 12.0, "chat", "long prompt", 8.0, "chat", "chat",
                           "long generation", 20.0, "chat"]
        n = 0
        try:
            while time.monotonic() - self.began < TRAFFIC:
                step = plan[n % len(plan)]
                n += 1
                if isinstance(step, float):
                    time.sleep(min(step, max(0.0, TRAFFIC - (time.monotonic() - self.began))))
                elif step == "chat":
                    self.ask(f"hello {n}, how are you today?", 16)
                elif step == "long prompt":
                    self.long_prompt_seconds = self.ask(words(LONG_PROMPT, f"p{n}"), 4)
                else:
                    self.long_generation_seconds = self.ask(f"tell a story {n}", 600)
                if self.watched is not None:
                    self.named += [x for x in self.watched.status().get("stragglers", [])
                                   if x["pid"] in self.server.pids]
        except Exception as err:  # reported by the test that joins it
            self.errors.append(repr(err))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory, node: tuple[DefaultDaemon, Path],
            model: Path) -> Iterator[tuple[LmServer, Traffic]]:
    daemon, records = node
    with LmServer(tmp_path_factory.mktemp("healthy"), records, model) as server:
        traffic = Traffic(server, daemon)
        traffic.start()
        yield server, traffic
        traffic.join(TRAFFIC + 300)


def job_of(server: LmServer) -> str:
    jobs = {r.job for r in wait_for(lambda: len(server.records()) == server.size and
                                    server.records(), 60, what="both records").values()}
    assert len(jobs) == 1, jobs
    return jobs.pop()


def learned(daemon: DefaultDaemon, server: LmServer) -> dict[int, float] | None:
    """Each rank's deadline as the daemon publishes it, once it is the learned one."""
    ranks = daemon.ranks()
    found = {ranks[p]["rank"]: ranks[p]["deadline_seconds"] for p in server.pids if p in ranks}
    return found if len(found) == server.size and set(found.values()) == {LEARNED} else None


def freeze_and_time(daemon: DefaultDaemon, server: LmServer) -> tuple[float, dict[str, Any]]:
    """SIGSTOP rank 1; seconds until both ranks are gone, and the job's incident."""
    job = job_of(server)
    server.signal(1, signal.SIGSTOP)
    froze = time.monotonic()
    wait_for(lambda: all(p.poll() is not None for p in server.procs), BOUND + 60, interval=0.2,
             what="both ranks of the frozen job to be ended")
    took = time.monotonic() - froze
    incident = wait_for(lambda: next((i for i in daemon.incidents() if i["job"] == job), None),
                        30, what="the job's incident")
    return took, incident


def assert_names_the_frozen_rank(incident: dict[str, Any], server: LmServer) -> None:
    assert incident["verdict"] == "stalled", incident
    culprit = incident["culprit"]
    assert culprit is not None and culprit["rank"] == 1, incident
    assert culprit["pid"] == server.pids[1] and culprit["state"] == "stopped"
    assert sorted(incident["pids"]) == sorted(server.pids)  # the whole job went down
    assert any(s["signal"] in ("SIGTERM", "SIGKILL") and s["pid"] == server.pids[0]
               for s in incident["signals"]), incident["signals"]


def test_the_learned_deadline_is_shown_within_a_minute_of_start(
        node: tuple[DefaultDaemon, Path], healthy: tuple[LmServer, Traffic]) -> None:
    """status and mlx_watchdog_rank_deadline_seconds show the learned deadline, not the
    600 s fallback, within a minute of the server's start (it idles most of that)."""
    daemon, _ = node
    server, traffic = healthy
    wait_for(lambda: learned(daemon, server), 60 - (time.monotonic() - traffic.began),
             interval=0.5, what="the learned deadline of an idle server in status")
    families = scrape(daemon.url())  # type: ignore[attr-defined]
    job = job_of(server)
    for rank in range(server.size):
        shown = value(families, "mlx_watchdog_rank_deadline_seconds", mlx_job=job,
                      uid=str(os.getuid()), rank=str(rank))
        assert shown == LEARNED, (rank, shown)


class Frozen(threading.Thread):
    """One frozen-peer scenario on a server (a job) of its own, driven on a thread of its
    own: `script` brings the server to its moment and returns what it saw there; rank 1 is
    then frozen and the seconds until both ranks are gone kept with the job's incident."""

    def __init__(self, folder: Path, node: tuple[DefaultDaemon, Path], model: Path,
                 script: Any) -> None:
        super().__init__(daemon=True)
        self.folder, self.node, self.model, self.script = folder, node, model, script
        self.facts: dict[str, Any] = {}
        self.error = ""

    def run(self) -> None:
        daemon, records = self.node
        try:
            with LmServer(self.folder, records, self.model) as server:
                self.server = server
                for n in range(4):
                    server.chat(f"hello {n}", 16)
                self.script(self, daemon, server)
                self.facts["took"], self.facts["incident"] = freeze_and_time(daemon, server)
                talker = self.facts.get("talker")
                if talker is not None:
                    talker.join(60)
        except Exception:  # reported by the test that joins it
            self.error = traceback.format_exc()


def idle(s: Frozen, daemon: DefaultDaemon, server: LmServer) -> None:
    """The seeds' workload: a distributed server, idle, hung at once by a frozen peer.
    Rank 0 waits in `eval(all_sum(0))`, spinning; the 600 s fallback would apply if auto
    only learned from the waits a scan sees."""
    wait_for(lambda: learned(daemon, server), 30, interval=0.5, what="learned deadlines")
    time.sleep(3)  # idle: rank 0 polls its queue and shares "nothing" every 0.1 s


def generation(s: Frozen, daemon: DefaultDaemon, server: LmServer) -> None:
    failed: list[str] = []

    def generate() -> None:
        try:
            server.chat("tell me a long story", 4000, timeout=BOUND + 120)
        except Exception as err:  # the server is torn down under it
            failed.append(repr(err))

    s.facts["failed"] = failed
    s.facts["talker"] = talker = threading.Thread(target=generate, daemon=True)
    talker.start()
    # Generating: rank 0's waits are mlx-lm's async_eval of each next token.
    wait_for(lambda: (server.records().get(0) is not None
                      and server.records()[0].collectives > 500), 60,
             what="the generation under way")
    # The daemon's view may lag the records by a scan or two.
    wait_for(lambda: learned(daemon, server), 10, interval=0.2,
             what="a generating server to show its learned deadline")


def prefill(s: Frozen, daemon: DefaultDaemon, server: LmServer) -> None:
    began = time.monotonic()
    server.chat(words(LONG_PROMPT, "first"), 1, timeout=300)
    s.facts["prefill"] = took = time.monotonic() - began  # the prompt's own length, healthy
    sent = threading.Event()

    def prompt() -> None:
        sent.set()
        try:
            server.chat(words(LONG_PROMPT, "second"), 1, timeout=BOUND + took + 120)
        except Exception:  # torn down under it
            pass

    s.facts["talker"] = talker = threading.Thread(target=prompt, daemon=True)
    talker.start()
    assert sent.wait(10)
    time.sleep(min(0.5, took / 4))  # inside the prefill
    s.facts["before"] = server.records()[0].collectives


@pytest.fixture(scope="module")
def frozen(tmp_path_factory: pytest.TempPathFactory, node: tuple[DefaultDaemon, Path],
           model: Path) -> Iterator[dict[str, Frozen]]:
    """The three frozen-peer scenarios at once (each waits a minute for its deadline: the
    module takes one such minute, not three)."""
    found = {name: Frozen(tmp_path_factory.mktemp(name), node, model, script)
             for name, script in (("idle", idle), ("generation", generation),
                                  ("prefill", prefill))}
    for scenario in found.values():
        scenario.start()
    yield found
    for scenario in found.values():
        scenario.join(1)


def joined(frozen: dict[str, Frozen], name: str) -> tuple[Frozen, float, dict[str, Any]]:
    s = frozen[name]
    s.join(BOUND + 600)
    assert not s.is_alive(), f"{name} still running"
    assert not s.error, s.error
    return s, s.facts["took"], s.facts["incident"]


def test_a_peer_frozen_while_the_server_idles_is_ended_within_90s(
        frozen: dict[str, Frozen]) -> None:
    s, took, incident = joined(frozen, "idle")
    assert took <= BOUND, f"the frozen idle server was ended after {took:.0f}s"
    assert took >= LEARNED, f"ended after {took:.0f}s, before the deadline"
    assert_names_the_frozen_rank(incident, s.server)
    due = next(r for r in incident["ranks"] if r["rank"] == 0)
    assert due["op"] == "eval" and due["state"] == "stalled", due


def test_a_peer_frozen_during_a_generation_is_ended_within_90s(
        frozen: dict[str, Frozen]) -> None:
    s, took, incident = joined(frozen, "generation")
    assert took <= BOUND, f"the frozen generating server was ended after {took:.0f}s"
    assert_names_the_frozen_rank(incident, s.server)
    assert s.facts["failed"], "the request in flight cannot have been answered"


def test_a_peer_frozen_during_a_long_prefill_is_ended_within_90s_plus_the_prefill(
        frozen: dict[str, Frozen]) -> None:
    s, took, incident = joined(frozen, "prefill")
    prefill = s.facts["prefill"]
    assert prefill > 0.5, f"the long prompt's prefill took only {prefill:.2f}s"
    assert took <= BOUND + prefill, (took, prefill)
    assert_names_the_frozen_rank(incident, s.server)
    assert s.facts["before"] > 0


def test_a_killed_peer_takes_its_job_down_and_is_named(
        tmp_path: Path, node: tuple[DefaultDaemon, Path], model: Path) -> None:
    """SIGKILL rank 1: rank 0's generation thread dies on the ring's "connection to a peer
    was lost", but mlx_lm.server stays up, deaf; the daemon ends it and names rank 1."""
    daemon, records = node
    with LmServer(tmp_path, records, model) as server:
        server.chat("hello", 16)
        job = job_of(server)
        # The daemon has seen both alive (a record first seen dead may be a leftover).
        wait_for(lambda: set(server.pids) <= set(daemon.ranks()), 30, interval=0.2,
                 what="the daemon watching both ranks")
        server.signal(1, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: server.procs[0].poll() is not None, 60, interval=0.2,
                 what="the survivor to be ended")
        took = time.monotonic() - killed
        incident = wait_for(lambda: next((i for i in daemon.incidents() if i["job"] == job),
                                         None), 30, what="the job's incident")
    assert took <= 30, took
    assert incident["verdict"] == "peer_died", incident
    assert incident["culprit"]["rank"] == 1 and incident["culprit"]["pid"] == server.pids[1]
    assert "rank 1" in incident["reason"] and incident["pids"] == [server.pids[0]]
    assert "rank 1) exited without closing its record" in daemon.log()


def test_three_minutes_of_real_traffic_end_in_no_incident(
        node: tuple[DefaultDaemon, Path], healthy: tuple[LmServer, Traffic]) -> None:
    """Idle gaps, a long prompt and a long generation at the defaults: never judged.
    (It ran beside every fault above, on the same node.)"""
    daemon, _ = node
    server, traffic = healthy
    traffic.join(TRAFFIC + 300)
    assert not traffic.errors, traffic.errors
    assert time.monotonic() - traffic.began >= TRAFFIC
    assert traffic.answers >= 10 and traffic.long_prompt_seconds > 0
    assert traffic.long_generation_seconds > 0
    job = job_of(server)
    assert [i for i in daemon.incidents() if i["job"] == job] == []
    assert all(p.poll() is None for p in server.procs), "a healthy rank was ended"
    assert traffic.named == [], traffic.named  # rank 0 reading requests is no straggler
    states = {r["rank"]: r["state"] for r in daemon.ranks().values() if r["job"] == job}
    assert set(states) == {0, 1} and set(states.values()) == {"running"}, states
    assert server.chat("still there?", 8)["choices"], "it still answers"
