"""One teardown order for every kill (issue 36): every rank of the job frozen first,
the evidence from frozen ranks, then SIGTERM and SIGCONT to every rank back to back;
a fence carries the moment the origin ends its own, and its receiver holds its ranks
frozen until then. Pure: the fakes' clock, signaller and probe."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from tests.support.fakes import (
    DIES_ON_TERM,
    FakeClock,
    FakeProbe,
    FakeSignaller,
    process_sample,
    target,
)
from tests.support.ladders import complete, drive
from tests.unit.daemon.test_enforcer import enforcer, incident, settings
from watchdog.daemon.act.exo import EXO_STAGGER
from watchdog.daemon.act.ladder import EVIDENCE_SLACK, Step
from watchdog.daemon.act.responses import Responses
from watchdog.daemon.fences import Fences
from watchdog.daemon.store import pending
from watchdog.net import fence
from watchdog.status import Culprit, Fence, FenceAnswer, FenceSent, NodeStatus


def test_a_ladder_holds_its_frozen_ranks_until_the_moment_the_peers_were_told(
        state_dir: Path) -> None:
    fake = FakeSignaller({11: DIES_ON_TERM, 12: DIES_ON_TERM})
    enf, clock = enforcer(state_dir, fake)
    targets = [target(11), target(12, rank=1)]
    start = clock.now()
    ladder = enf.begin(incident(targets=targets), targets, evidence=False, term_at=start + 3.0)
    # Frozen at once, and journaled so before anything else happens.
    assert fake.names() == ["SIGSTOP", "SIGSTOP"] and fake.frozen == {11, 12}
    (entry,) = pending.unfinished(str(state_dir))
    assert [s.signal for s in entry.incident.signals or ()] == ["SIGSTOP", "SIGSTOP"]
    assert enf.step(ladder) is None and ladder.step is Step.HOLD
    clock.advance(2.9)
    assert enf.step(ladder) is None and fake.names() == ["SIGSTOP", "SIGSTOP"]
    outcome = drive(enf, ladder)
    assert fake.names() == ["SIGSTOP"] * 2 + ["SIGTERM"] * 2 + ["SIGCONT"] * 2
    terms = [s.time for s in outcome.incident.signals or () if s.signal == "SIGTERM"]
    assert min(terms) - clock.wall_origin - start >= 3.0
    assert outcome.results == {11: "killed", 12: "killed"}
    assert outcome.incident.freeze == "2 ranks frozen"


@pytest.mark.parametrize("job,later", [("job-1", 0.0), ("exo-3f2a", EXO_STAGGER)])
def test_the_hold_never_outlasts_the_evidence_time_box(state_dir: Path, job: str,
                                                        later: float) -> None:
    """A fenced exo job's box is exo's stagger longer: its origin's evidence may take the
    whole box and its peers still end theirs EXO_STAGGER after it (cut to the box, a
    slow evidence under load brought them within exo's 8 s: tests/multihost/test_exo)."""
    fake = FakeSignaller({13: DIES_ON_TERM})
    enf, clock = enforcer(state_dir, fake, evidence_timeout=2.0)
    start = clock.now()
    outcome = drive(enf, enf.begin(incident(job, targets=[target(13)]), [target(13)],
                                   evidence=False, term_at=start + 600.0))
    (term,) = [s.time for s in outcome.incident.signals or () if s.signal == "SIGTERM"]
    held = term - clock.wall_origin - start
    assert 2.0 + EVIDENCE_SLACK + later - 0.1 <= held <= 2.0 + EVIDENCE_SLACK + later + 0.1


def test_a_rank_in_uninterruptible_sleep_is_said_not_frozen(state_dir: Path) -> None:
    fake = FakeSignaller({21: DIES_ON_TERM, 22: DIES_ON_TERM})
    probe = FakeProbe({21: process_sample(21, status="disk-sleep"), 22: process_sample(22)})
    enf, _ = enforcer(state_dir, fake, probe)
    targets = [target(21), target(22, rank=1)]
    outcome = drive(enf, enf.begin(incident(targets=targets), targets, evidence=False))
    assert outcome.incident.freeze is not None
    assert "rank 0 (pid 21) not frozen: in uninterruptible sleep" in outcome.incident.freeze
    assert "pid 22" not in outcome.incident.freeze
    assert json.loads(json.dumps(outcome.incident.to_json()))["freeze"] == \
        outcome.incident.freeze


def test_a_frozen_rank_is_resumed_for_its_python_dump_alone_and_frozen_again(
        state_dir: Path, tmp_path: Path) -> None:
    """faulthandler runs only in a running process: the rank is resumed with its dump
    signal pending, and frozen again once it wrote it (no peer has ended meanwhile)."""
    stacks = tmp_path / "31.stacks"
    stacks.write_text("")

    probe = FakeProbe({31: process_sample(31, status="running")})

    class Dumps(FakeSignaller):
        def _react(self, pid: int, signum: int) -> None:
            super()._react(pid, signum)
            if signum in (signal.SIGSTOP, signal.SIGCONT):
                probe.set_sample(process_sample(pid, status="stopped" if signum == signal.SIGSTOP
                                                else "running"))
            if signum == signal.SIGCONT and pid in self.asked:
                stacks.write_text('Thread 0x1 (most recent call first):\n  File "x.py"\n')
            if signum == signal.SIGUSR2:
                self.asked.add(pid)

    fake = Dumps({31: DIES_ON_TERM})
    fake.asked = set()  # type: ignore[attr-defined]
    enf, _ = enforcer(state_dir, fake, probe)
    t = target(31, dump_signal=int(signal.SIGUSR2), stacks_path=str(stacks))
    outcome = drive(enf, enf.begin(incident(targets=[t]), [t]))
    assert fake.names() == ["SIGSTOP", "SIGUSR2", "SIGCONT", "SIGSTOP", "SIGTERM", "SIGCONT"]
    (dump,) = outcome.incident.evidence or ()
    assert dump.endswith("-python.txt") and "x.py" in Path(dump).read_text()
    # A rank stopped by someone else (not the ladder) is never resumed for a dump.
    assert enf.capture("other", [t], frozenset()) == []


def test_a_rank_stopped_by_someone_else_is_never_resumed_before_its_sigterm(
        state_dir: Path, tmp_path: Path) -> None:
    """The rank its job waits on, SIGSTOPped by someone: resumed for a dump, it would
    complete the collective its peers wait in (they would compute on)."""
    stacks = tmp_path / "32.stacks"
    stacks.write_text("")
    fake = FakeSignaller({32: DIES_ON_TERM, 33: DIES_ON_TERM})
    probe = FakeProbe({32: process_sample(32, status="stopped"), 33: process_sample(33)})
    enf, _ = enforcer(state_dir, fake, probe)
    targets = [target(32, dump_signal=int(signal.SIGUSR2), stacks_path=str(stacks)),
               target(33, rank=1)]
    outcome = drive(enf, enf.begin(incident(targets=targets), targets))
    assert fake.signals_to(32) == ["SIGSTOP", "SIGTERM", "SIGCONT"]
    assert outcome.incident.freeze == "1 rank frozen; rank 0 (pid 32) was stopped already"


def test_a_response_closed_unfinished_thaws_what_it_froze(state_dir: Path) -> None:
    fake = FakeSignaller({41: DIES_ON_TERM})
    enf, clock = enforcer(state_dir, fake)
    ladder = enf.begin(incident(targets=[target(41)]), [target(41)], evidence=False,
                       term_at=clock.now() + 5.0)
    outcome = enf.close_unfinished(ladder, "its worker never returned")
    assert fake.names() == ["SIGSTOP", "SIGCONT"] and fake.frozen == set()
    assert [s.signal for s in outcome.incident.signals or ()] == ["SIGSTOP", "SIGCONT"]


def _crashed_while_frozen(state_dir: Path, pids: list[int]) -> pending.Entry:
    """An earlier daemon froze the ranks and died before their SIGTERM."""
    fake = FakeSignaller({pid: DIES_ON_TERM for pid in pids})
    enf, clock = enforcer(state_dir, fake)
    targets = [target(pid, rank=i) for i, pid in enumerate(pids)]
    enf.begin(dataclasses.replace(incident(targets=targets), time=clock.wall()), targets,
              evidence=False, term_at=clock.now() + 5.0)
    (entry,) = pending.unfinished(str(state_dir))
    return entry


def test_a_restarted_daemon_ends_ranks_an_earlier_one_left_frozen(state_dir: Path) -> None:
    entry = _crashed_while_frozen(state_dir, [51, 52])
    fake = FakeSignaller({51: DIES_ON_TERM, 52: DIES_ON_TERM})
    fake.frozen = {51, 52}
    clock = FakeClock()
    enf, _ = enforcer(state_dir, fake, clock=clock)
    outcome = complete(enf, entry)
    assert fake.names() == ["SIGTERM", "SIGTERM", "SIGCONT", "SIGCONT"]
    assert outcome.results == {51: "killed", 52: "killed"} and fake.alive_pids == set()


def test_a_restarted_daemon_thaws_ranks_whose_frozen_verdict_is_stale(state_dir: Path) -> None:
    entry = _crashed_while_frozen(state_dir, [61])
    fake = FakeSignaller({61: DIES_ON_TERM})
    fake.frozen = {61}
    clock = FakeClock()
    clock.advance(10_000.0)  # long past the response's bound: the verdict is not replayed
    enf, _ = enforcer(state_dir, fake, clock=clock)
    outcome = complete(enf, entry)
    assert fake.names() == ["SIGCONT"] and fake.frozen == set()
    assert 61 in fake.alive_pids and outcome.results == {61: "unknown"}


# -- the fence ---------------------------------------------------------------------------


def test_a_fence_carries_when_its_origin_ends_its_own(tmp_path: Path) -> None:
    body, headers = fence.make("s3cret", "j", "node-a", "stalled", None, now=1000.0,
                               uid=7, term_at=1011.25)
    got = fence.verify("s3cret", headers, body, fence.NonceCache(), now=1000.1)
    assert got.term_in == 11.25 and got.job == "j" and got.uid == 7
    # An older sender's fence names none: its ranks end at once (after their freeze).
    old = {k: v for k, v in json.loads(body).items() if k != "term_in"}
    assert Fence.from_json(old).term_in is None
    assert "term_in" not in fence.make("s3cret", "j", "a", "r", None)[0].decode()


def test_a_fence_holds_its_ranks_frozen_at_most_the_receivers_time_box(state_dir: Path) -> None:
    fences = Fences(settings(state_dir, evidence_timeout=4.0), "node-b", None,  # type: ignore[arg-type]
                    None, threading.RLock(), threading.Event())  # type: ignore[arg-type]

    def held(term_in: float | None, local: bool = False) -> float:
        return fences.term_in(Fence(job="j", uid=0, origin="a", reason="r", culprit=None,
                                    term_in=term_in, local=local))

    assert held(2.5) == 2.5
    assert held(600.0) == 4.0 + EVIDENCE_SLACK

    # An exo job's: EXO_STAGGER more on every node but the first, the culprit's (else
    # the origin's), the origin's moment as it named it, or "now" (act/exo.py).
    def exo(term_in: float, culprit_host: str | None) -> float:
        named = None if culprit_host is None else Culprit(host=culprit_host, rank=1)
        return fences.term_in(Fence(job="exo-3f2a", uid=0, origin="a", reason="r",
                                    culprit=named, term_in=term_in))

    assert exo(600.0, None) == exo(600.0, "a") == exo(600.0, "node-c") == \
        4.0 + EVIDENCE_SLACK + EXO_STAGGER
    assert exo(600.0, "node-b") == 4.0 + EVIDENCE_SLACK  # the culprit here: first
    assert exo(0.0, None) == EXO_STAGGER and exo(0.0, "node-b") == 0.0  # "now"
    assert held(None) == held(-3.0) == held(math.nan) == held(5.0, local=True) == 0.0


class FencingPeers:
    """The peers' side of a response: every fence sent, with the signals sent by then."""

    def __init__(self, signaller: FakeSignaller) -> None:
        self.signaller = signaller
        self.sent: list[tuple[float | None, list[str]]] = []
        self.since: list[float | None] = []
        self.incidents: list[str | None] = []

    def fence(self, uid: int, job: str, reason: str, culprit: object,
              term_in: float | None = None, since: float | None = None,
              again: bool = False, incident: str | None = None) -> Future[list[FenceSent]]:
        self.sent.append((term_in, self.signaller.names()))
        self.incidents.append(incident)
        self.since.append(since)
        done: Future[list[FenceSent]] = Future()
        done.set_result([FenceSent("node-b:9100", FenceAnswer(job, uid, (7,), incident="b-1",
                                                              host="node-b")),
                         FenceSent("node-c:9100", error="timed out")])
        return done


@pytest.mark.parametrize("job,later", [("job-1", 0.0), ("exo-3f2a", EXO_STAGGER)])
def test_a_verdict_freezes_its_ranks_then_fences_then_ends_with_the_peers(
        state_dir: Path, job: str, later: float) -> None:
    """No culprit named elsewhere: ours first; an exo job's peers add EXO_STAGGER to the
    moment told, on their side (test_a_fence_holds_...; docs/exo.md: exo loops when both
    runners of an instance end before it gave the second up)."""
    fake = FakeSignaller({71: DIES_ON_TERM, 72: DIES_ON_TERM})
    enf, clock = enforcer(state_dir, fake, evidence_timeout=3.0)
    peers = FencingPeers(fake)
    responses = Responses(
        settings(state_dir, evidence_timeout=3.0, secret="s", peers=("node-b:9100",)),
        enf, peers, lambda: NodeStatus(), lambda: None)  # type: ignore[arg-type]
    targets = [target(71), target(72, rank=1)]
    responses.start([(71, 1.7e9), (72, 1.7e9)], clock.now(), 0, job,
                    incident(targets=targets), targets, lambda: False,
                    ask_peers=False, may_hold=False, evidence=True)
    # Ours frozen before the peers were told; they were told the evidence's time box.
    (first_fence,) = peers.sent
    assert first_fence == (3.0 + EVIDENCE_SLACK, ["SIGSTOP", "SIGSTOP"])
    # The evidence (none here) is in at once: the peers are told again, to end theirs
    # now, and ours end with them.
    ended = []
    for _ in range(5):
        ended += responses.step(clock.now())
        clock.advance(enf.TICK)
    assert [t for t, _ in peers.sent] == [3.0 + EVIDENCE_SLACK, 0.0]
    del later
    assert peers.sent[1][1] == ["SIGSTOP", "SIGSTOP"]  # before any SIGTERM of ours
    # Both name the moment the job was found dead: the second ends no relaunch since.
    assert peers.since[0] is not None and peers.since[0] == peers.since[1]
    assert fake.names()[2:] == ["SIGTERM", "SIGTERM", "SIGCONT", "SIGCONT"]
    # Ended well within the box, not at its end; a peer that missed the fence is said.
    ((_, outcome),) = ended
    assert outcome is not None and outcome.results == {71: "killed", 72: "killed"}
    assert clock.now() < 1000.0 + 3.0
    assert outcome.incident.freeze == ("2 ranks frozen; node-c:9100 did not answer the "
                                       "fence (timed out)")
    # Each fence names our incident; the peer that took it named its own: where the
    # evidence of the job's ranks there is.
    assert peers.incidents == [outcome.incident.id] * 2
    assert [(e.host, e.incident) for e in outcome.incident.elsewhere or ()] == [
        ("node-b", "b-1")]


def test_an_exo_job_whose_culprit_is_on_a_peer_ends_there_first_and_here_later(
        state_dir: Path) -> None:
    """The frozen runner's node first, ours EXO_STAGGER after, still frozen meanwhile: exo
    reports that runner failed (its worker, waiting on it, could not give it up), and
    ours, given up by our free worker first, ends unreported (docs/exo.md, the idle
    freeze that looped on the bed with ours first)."""
    fake = FakeSignaller({71: DIES_ON_TERM})
    enf, clock = enforcer(state_dir, fake, evidence_timeout=3.0)
    peers = FencingPeers(fake)
    responses = Responses(
        settings(state_dir, evidence_timeout=3.0, secret="s", peers=("node-b:9100",)),
        enf, peers, lambda: NodeStatus(), lambda: None)  # type: ignore[arg-type]
    targets = [target(71)]
    named = dataclasses.replace(incident("exo-3f2a", targets=targets),
                                culprit=Culprit(host="node-b", rank=1, pid=7))
    responses.start([(71, 1.7e9)], clock.now(), 0, "exo-3f2a", named, targets,
                    lambda: False, ask_peers=False, may_hold=False, evidence=True)
    ended = []
    while not ended and clock.now() < 1000.0 + 30.0:
        ended += responses.step(clock.now())
        clock.advance(enf.TICK)
    # The evidence (none) in at once: the peers told "now", ours held EXO_STAGGER more,
    # frozen all along.
    assert [t for t, _ in peers.sent] == [3.0 + EVIDENCE_SLACK, 0.0]
    assert fake.names() == ["SIGSTOP", "SIGTERM", "SIGCONT"]
    ((_, outcome),) = ended
    assert outcome is not None and outcome.results == {71: "killed"}
    times = {s.signal: s.time for s in outcome.incident.signals or ()}
    assert EXO_STAGGER <= times["SIGTERM"] - times["SIGSTOP"] <= EXO_STAGGER + 0.5
