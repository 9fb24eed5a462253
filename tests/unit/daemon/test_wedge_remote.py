"""A collective wedged across nodes (judge/wedge.py with members a peer published): the
facts each daemon publishes per rank in `/status`, a peer's rank read back as a member,
and the loop's members from the peers' background answers (stale, missing, silent).
Pure but for one in-process daemon with no rank and no network, and one record file."""

from __future__ import annotations

import dataclasses
import os

import pytest

from tests.support.users import publish
from watchdog.daemon.act.incidents import fence_culprit, new_incident, with_view
from watchdog.daemon.config import Settings
from watchdog.daemon.jobs import ASK_AHEAD, REMOTE_FRESH
from watchdog.daemon.judge import frames
from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.judge.sighting import Sockets
from watchdog.daemon.judge.wedge import QUIET_FOR, Member, decide, remote
from watchdog.daemon.lifecycle import Rank
from watchdog.daemon.loop import Daemon
from watchdog.daemon.view import Shown, rank_status
from watchdog.record import Collective, Record, read_path
from watchdog.states import FrameKind, Phase, State
from watchdog.status import LastCollective, NodeAnswer, NodeStatus, PeerView, RankStatus

NOW = 5_000_000_000_000
SPIN = "busy thread 7 spins in SocketThread::worker -> recv"


def local(rank: int, **kw) -> Member:
    base = dict(rank=rank, world_size=2, phase=Phase.WAIT, waiting_since_ns=1,
                collectives=10, op="eval (all_sum)", stopped=False,
                seen=frames.Reading(FrameKind.WAITING, SPIN), quiet=QUIET_FOR + 1, unread=0,
                link="up")
    base.update(kw)
    return Member(**base)  # type: ignore[arg-type]


def published(rank: int = 1, **kw) -> RankStatus:
    """A rank as a peer's daemon publishes it once sampled and its sockets tracked."""
    base = dict(job="j", uid=501, pid=77, host="host-b", rank=rank, world_size=2,
                state="stalled", phase="wait", collectives=10, seconds_in_wait=18.0,
                current_op="eval (all_sum #10)",
                last_collective=LastCollective(number=10, op="all_sum"),
                frames=SPIN, frames_kind="waiting", quiet_seconds=4.5, unread_bytes=4096,
                data_link="up")
    base.update(kw)
    return RankStatus(**base)  # type: ignore[arg-type]


# -- the status fields -----------------------------------------------------------------

def test_the_wedge_facts_cross_the_wire_and_are_omitted_while_unknown():
    shown = published().to_json()
    assert (shown["frames_kind"], shown["quiet_seconds"], shown["unread_bytes"]) == \
        ("waiting", 4.5, 4096)
    back = RankStatus.from_json(shown)
    assert (back.frames_kind, back.quiet_seconds, back.unread_bytes) == ("waiting", 4.5, 4096)
    bare = published(frames_kind=None, quiet_seconds=None, unread_bytes=None).to_json()
    assert not {"frames_kind", "quiet_seconds", "unread_bytes"} & set(bare)
    old = RankStatus.from_json(bare)  # an old peer's rank: no such keys
    assert (old.frames_kind, old.quiet_seconds, old.unread_bytes) == (None, None, None)
    wrong = RankStatus.from_json({**shown, "quiet_seconds": "long", "unread_bytes": "x"})
    assert wrong.quiet_seconds is None and wrong.unread_bytes is None


REC = Record(
    pid=4242, start_time=1.7e9, uid=501, rank=0, world_size=2, dump_signal=0, status=0,
    host="host-a", job="j", backend="ring", seq=2, collectives=10, waits_entered=10,
    waits_completed=9, steps=0, phase=Phase.WAIT, op="eval", phase_since_ns=1,
    wait_since_ns=1, last_progress_ns=1, last_wait_ns=0, max_wait_ns=0,
    expect_seconds=0.0, expect_since_ns=0, expect_reason="",
    flight=(Collective(number=10, op="all_sum", dtype="float32", nbytes=4096, issued_ns=1),),
)


def test_the_daemon_publishes_the_sample_s_kind_and_the_sockets_it_tracks():
    verdict = Verdict(State.STALLED, 15.0, 18.0, 18.0, 1.0, False, "r", seen=SPIN,
                      seen_kind=FrameKind.WAITING)
    shown = rank_status(REC, State.STALLED, verdict, Shown(sockets=Sockets(4.25, 64, True)))
    assert (shown.frames, shown.frames_kind, shown.quiet_seconds, shown.unread_bytes,
            shown.quiet_exact) == (SPIN, "waiting", 4.25, 64, True)
    unsampled = rank_status(REC, State.STALLED, dataclasses.replace(verdict, seen="",
                                                                    seen_kind=""))
    assert unsampled.frames_kind is None and unsampled.quiet_seconds is None
    # What this node publishes reads back, on a peer, as the member it judges here.
    member = remote(RankStatus.from_json(shown.to_json()), "host-a", NOW)
    assert member is not None
    assert (member.op, member.seen, member.quiet, member.unread, member.host) == \
        ("eval (all_sum)", frames.Reading(FrameKind.WAITING, SPIN), 4.25, 64, "host-a")
    # Exact on the peer's counters only once its ring link was probed up (issue 58).
    assert not member.exact
    linked = dataclasses.replace(RankStatus.from_json(shown.to_json()), data_link="up")
    found = remote(linked, "host-a", NOW)
    assert found is not None and found.exact
    queues = dataclasses.replace(linked, quiet_exact=False)
    assert not remote(queues, "host-a", NOW).exact  # type: ignore[union-attr]


# -- decide with remote members ---------------------------------------------------------

def test_a_wedge_across_nodes_names_the_remote_culprit_with_its_host():
    member = remote(published(), "host-b", NOW)
    assert member is not None and member.waiting_since_ns > 0
    found = decide([local(0), member])
    assert found is not None
    assert (found.culprit, found.culprit_host) == (1, "host-b")
    assert "collective wedged across nodes: rank 1 on host-b leaves 4096 B unread" \
        in found.note
    assert f"rank 0's {SPIN}" in found.note and f"rank 1 on host-b's {SPIN}" in found.note


def test_a_local_culprit_is_named_without_a_host():
    found = decide([local(0, unread=64), remote(published(unread_bytes=0), "host-b", NOW)])
    assert found is not None and (found.culprit, found.culprit_host) == (0, None)
    assert "rank 0 leaves 64 B unread" in found.note


@pytest.mark.parametrize("change, why", [
    ({"frames_kind": None, "frames": None}, "not sampled there (or an old peer)"),
    ({"frames_kind": "computing", "frames": "busy thread 8 computes in sgemm_"},
     "a slow peer: the remote rank computes"),
    ({"frames_kind": "unknown"}, "no frame read there"),
    ({"quiet_seconds": None}, "its sockets not tracked there"),
    ({"quiet_seconds": QUIET_FOR - 1}, "bytes moved there lately"),
    ({"state": "stopped"}, "a pause: the remote rank stopped"),
    ({"phase": "running", "seconds_in_wait": 0.0}, "outside its wait"),
    ({"collectives": 8}, "two collectives apart"),
    ({"current_op": "eval (all_gather #10)",
      "last_collective": LastCollective(number=10, op="all_gather")}, "another op"),
    ({"data_link": "down 10.0.0.1:5151 (econnrefused)"}, "its link down"),
])
def test_a_remote_rank_that_explains_the_wait_or_lacks_a_fact_is_no_wedge(change, why):
    member = remote(published(**change), "host-b", NOW)
    assert member is None or decide([local(0), member]) is None, why


def test_a_remote_rank_lacking_what_a_member_needs_is_none():
    for lacking in ({"phase": None}, {"rank": None}, {"collectives": None},
                    {"phase": "sleeping"}, {"state": None}):
        assert remote(published(**lacking), "host-b", NOW) is None, lacking


# -- the loop's members from the peers' answers -----------------------------------------

PEER = "10.0.0.2:9753"


@pytest.fixture
def daemon(tmp_path):
    settings = Settings(dir=str(tmp_path / "records"), state_dir=str(tmp_path / "state"),
                        mode="observe", peers=(PEER,), secret="s" * 24)
    os.makedirs(settings.dir)
    os.makedirs(settings.state_dir)
    d = Daemon(settings)
    yield d
    d.executor.shutdown()
    d.jobs.sampling.shutdown()
    d.asking.shutdown()


def answered(daemon: Daemon, age: float, *ranks: RankStatus, ok: bool = True,
             scanned_ago: float = 0.5) -> None:
    status = NodeStatus(host="host-b", ranks=ranks, scanned=True, interval=1.0,
                        time=daemon.clock.wall() - scanned_ago) if ok else None
    daemon.peers._asked = (daemon.clock.monotonic() - age,  # as the background ask does
                           [NodeAnswer(PEER, ok, status, None if ok else "timed out")])


def test_the_loop_builds_the_job_s_remote_members_from_a_fresh_answer(daemon):
    rank = Rank(path="r", record=REC)
    other_job = published(rank=0, job="k")
    other_user = published(rank=0, uid=502)
    gone = published(rank=0, state="exited")
    answered(daemon, 1.0, published(), other_job, other_user, gone)
    (member,) = daemon.jobs.remote_members(rank, 1, NOW)
    assert (member.rank, member.host, member.unread) == (1, "host-b", 4096)
    assert decide([local(0), member]) is not None
    assert daemon.jobs.remote_members(rank, 2, NOW) == []  # all the job's ranks here


def test_without_the_shared_secret_no_peer_s_answer_makes_a_member(daemon):
    """Unsigned, anything at a peer's address could say "rank 1 waits" (issue 48, 3)."""
    rank = Rank(path="r", record=REC)
    answered(daemon, 1.0, published())
    assert len(daemon.jobs.remote_members(rank, 1, NOW)) == 1
    daemon.live.settings = dataclasses.replace(daemon.settings, secret=None)
    assert daemon.jobs.remote_members(rank, 1, NOW) == []


def test_a_stale_answer_a_silent_peer_or_an_unknown_rank_gives_no_remote_member(daemon):
    rank = Rank(path="r", record=REC)
    answered(daemon, REMOTE_FRESH + 1, published())
    assert daemon.jobs.remote_members(rank, 1, NOW) == []  # stale
    answered(daemon, 1.0, ok=False)
    assert daemon.jobs.remote_members(rank, 1, NOW) == []  # a partition: today's rules
    answered(daemon, 1.0, published(phase=None))
    assert daemon.jobs.remote_members(rank, 1, NOW) == []  # an old or broken peer
    answered(daemon, 1.0, published(), scanned_ago=REMOTE_FRESH + 2)
    assert daemon.jobs.remote_members(rank, 1, NOW) == []  # its loop stalled: facts old
    answered(daemon, 1.0, published(), scanned_ago=-(REMOTE_FRESH + 2))
    assert daemon.jobs.remote_members(rank, 1, NOW) == []  # its clock far off ours
    answered(daemon, 1.0, published())
    assert len(daemon.jobs.remote_members(rank, 1, NOW)) == 1  # fresh again
    daemon.peers._asked = None
    assert daemon.jobs.remote_members(rank, 1, NOW) == []  # never asked
    # Each case leaves the job with a rank unseen: no wedge.
    assert decide([local(0)]) is None


def test_a_wedge_is_asked_for_ahead_from_half_the_wedge_deadline(daemon):
    rank = Rank(path="r", record=REC, state=State.RUNNING,
                verdict=Verdict(State.RUNNING, 60.0, 8.0, 8.0, 1.0, False, "r",
                                wedge_deadline=15.0, hot=(7,)))
    assert daemon.jobs.probe_links([rank], 0.0)  # the loop then asks the peers ahead
    rank.verdict = dataclasses.replace(rank.verdict, seconds_in_wait=7.0)
    assert not daemon.jobs.probe_links([rank], 0.0)  # before half of it: no ask


def test_a_quiet_wait_is_asked_for_ahead_only_as_its_deadline_nears(daemon):
    # No thread busy: no wedge to judge across nodes, so no ask every 2 s of the wait
    # from half its deadline; from ASK_AHEAD before it, for the verdict's first signal.
    rank = Rank(path="r", record=REC, state=State.SUSPECT,
                verdict=Verdict(State.SUSPECT, 60.0, 40.0, 40.0, 0.0, False, "r",
                                wedge_deadline=15.0))
    assert not daemon.jobs.probe_links([rank], 0.0)
    rank.verdict = dataclasses.replace(rank.verdict, seconds_in_wait=60.0 - ASK_AHEAD)
    assert daemon.jobs.probe_links([rank], 0.0)



# -- the incident ----------------------------------------------------------------------

def test_the_incident_names_a_remote_culprit_and_the_view_does_not_blur_the_wedge(tmp_path):
    path = publish(tmp_path, os.getpid(), os.getuid(), "j", hung=True, world_size=2)
    found = decide([local(0), remote(published(), "host-b", NOW)])
    assert found is not None
    verdict = Verdict(State.STALLED, 15.0, 18.0, 18.0, 1.0, True, "r", wedge_deadline=15.0,
                      wedge=found, seen=SPIN, seen_kind=FrameKind.WAITING)
    mine = Rank(str(path), read_path(str(path)), state=State.STALLED, verdict=verdict)
    inc = new_incident(wall=1.7e9, host="host-a", uid=os.getuid(), job="j", mode="enforce",
                       kill_scope="job", due=[mine], targets=[mine], local=[mine],
                       fenced=None)
    assert inc.cause == "collective_wedged" and inc.summary == found.note
    assert inc.culprit is not None
    assert (inc.culprit.host, inc.culprit.rank, inc.culprit.cause) == \
        ("host-b", 1, "collective_wedged")
    # The peers' view sees ranks in collectives a number apart: "unknown"; the wedge
    # stands (it saw the frames and the sockets). A view that finds a cause still wins.
    vague = PeerView.from_json({"cause": "unknown", "summary": "the evidence does not decide"})
    assert with_view(inc, vague) == inc
    stopped = PeerView.from_json({"cause": "peer_stopped", "summary": "rank 1 is stopped"})
    assert with_view(inc, stopped).cause == "peer_stopped"
    # The fence carries the culprit on the other host, with its cause and words.
    sent = fence_culprit(inc, vague)
    assert (sent.host, sent.rank, sent.cause, sent.summary) == \
        ("host-b", 1, "collective_wedged", found.note)
