"""The incident's cause and one line (daemon/act/incidents.py): from this node's ranks
alone, refined by the peers' view, carried by a fence; and `incidents` printing them."""

from __future__ import annotations

import dataclasses
import json
import os

from click.testing import CliRunner

from tests.support.users import publish
from watchdog import record
from watchdog.cli.commands import cli
from watchdog.daemon.act.incidents import (
    death_culprit,
    fence_culprit,
    new_incident,
    with_view,
)
from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.lifecycle import Rank
from watchdog.states import State
from watchdog.status import Culprit, Fence, PeerView


def a_rank(tmp_path, name: str, state: State, world_size: int = 1) -> Rank:
    """A real record of this process, in a wait, in `state`."""
    path = publish(tmp_path / name, os.getpid(), os.getuid(), "job-1", hung=True,
                   world_size=world_size)
    verdict = Verdict(state, deadline=0.5, seconds_in_wait=9.0, seconds_since_progress=9.0,
                      busiest_cpu=1.0 if state == State.STALLED else 0.0, act=True,
                      reason="in eval for 9.0s, past the 0.5s deadline", computing=False)
    return Rank(str(path), record.read_path(str(path)), state=state, verdict=verdict)


def incident_of(due: list[Rank], local: list[Rank], fenced: Fence | None = None):
    return new_incident(wall=1.7e9, host="node-a", uid=os.getuid(), job="job-1",
                        mode="enforce", kill_scope="job", due=due, targets=local,
                        local=local, fenced=fenced)


def test_this_node_alone_decides_what_its_ranks_show(tmp_path):
    (tmp_path / "a").mkdir()
    quiet = a_rank(tmp_path, "a", State.BLOCKED)
    found = incident_of([quiet], [quiet])
    assert found.cause == "local_blocked"
    assert found.summary.startswith(f"rank 0 on {quiet.record.host} (pid {os.getpid()}) "
                                    "waits quietly in ")
    # One rank of two, no peers asked: the other is reported by no one.
    (tmp_path / "b").mkdir()
    spinning = a_rank(tmp_path, "b", State.STALLED, world_size=2)
    assert incident_of([spinning], [spinning]).cause == "unknown"


def test_the_peers_view_refines_it_and_the_culprit_carries_it_to_a_fence(tmp_path):
    (tmp_path / "a").mkdir()
    spinning = a_rank(tmp_path, "a", State.STALLED, world_size=2)
    found = incident_of([spinning], [spinning])
    view = {"cause": "peer_stopped", "summary": "rank 1 on b (pid 7) is stopped at all_sum #3",
            "culprit": {"host": "b", "rank": 1, "pid": 7, "state": "stopped",
                        "reason": "stopped at all_sum #3 while its peers wait"}}
    typed = PeerView.from_json(view)  # as the peers' verdict is journaled and read back
    refined = with_view(found, typed)
    assert (refined.cause, refined.summary) == ("peer_stopped", view["summary"])
    assert refined.culprit is None  # no local culprit: the view's stays under `cluster`
    sent = fence_culprit(refined, typed)
    assert sent == Culprit("b", 1, 7, "stopped", view["culprit"]["reason"], "peer_stopped",
                           view["summary"])
    assert with_view(found, PeerView(error="timed out")) == found  # no view: its own stands
    # The fence's receiver says what the sender found, in its words.
    fenced = Fence(job="job-1", uid=os.getuid(), origin="node-b", reason="stalled: ...",
                   culprit=sent, nonce="n")
    theirs = incident_of([spinning], [spinning], fenced)
    assert theirs.verdict == "fenced" and theirs.cause == "peer_stopped"
    assert theirs.summary == f"fenced by node-b: {view['summary']}"
    assert theirs.culprit == sent
    # A fence that names no rank (no view) still carries the cause and its line.
    bare = fence_culprit(found, None)
    assert (bare.rank, bare.cause, bare.summary) == (None, found.cause, found.summary)
    bare_fence = dataclasses.replace(fenced, culprit=bare)
    theirs = incident_of([spinning], [spinning], bare_fence)
    assert theirs.culprit is None and theirs.cause == found.cause


def test_a_dead_rank_is_peer_dead_here_and_at_the_peers(tmp_path):
    (tmp_path / "a").mkdir()
    dead = a_rank(tmp_path, "a", State.EXITED, world_size=2)
    culprit = death_culprit("node-a", dead, "died without closing its record")
    assert culprit.cause == "peer_dead"
    assert culprit.summary.startswith(f"rank 0 on node-a (pid {os.getpid()}) died without "
                                      "closing its record at ")
    (tmp_path / "b").mkdir()
    alive = a_rank(tmp_path, "b", State.RUNNING, world_size=2)
    local = Fence(job="job-1", uid=os.getuid(), origin="node-a", reason="rank 0 died",
                  culprit=culprit, local=True)
    assert incident_of([alive], [alive], local).cause == "peer_dead"
    remote = dataclasses.replace(local, local=False)
    assert incident_of([alive], [alive], remote).summary == f"fenced by node-a: {culprit.summary}"


def test_incidents_prints_the_cause_and_its_line_first(tmp_path):
    (tmp_path / "a").mkdir()
    state = tmp_path / "state"
    state.mkdir()
    quiet = a_rank(tmp_path, "a", State.BLOCKED)
    found = incident_of([quiet], [quiet])
    (state / "incidents.jsonl").write_text(json.dumps(found.to_json()) + "\n")
    out = CliRunner().invoke(cli, ["incidents", "--state-dir", str(state)]).output
    lines = out.splitlines()
    assert lines[1] == f"    local_blocked: {found.summary}" and "waits quietly" in lines[1]
    assert lines[2].strip() == found.reason, out


def test_a_quiet_hang_names_its_rank_or_a_single_process_by_its_pid(tmp_path):
    (tmp_path / "a").mkdir()
    ranked = a_rank(tmp_path, "a", State.STALLED)
    what = "main thread waits in array::wait -> pthread_cond_wait; no thread busy"
    quiet = dataclasses.replace(ranked.verdict, quiet=what)
    ranked.verdict = quiet
    assert incident_of([ranked], [ranked]).summary == f"quiet hang: rank 0's {what}"
    # A single process (no group, world size 1): its record's rank is -1.
    alone = Rank(ranked.path, dataclasses.replace(ranked.record, rank=-1), state=State.STALLED,
                 verdict=quiet)
    found = incident_of([alone], [alone])
    assert found.cause == "quiet_hang"
    assert found.summary == f"quiet hang: pid {os.getpid()}'s {what}", found.summary
