"""The cluster view and job fences: several daemons on 127.0.0.1, one per simulated node."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.support.ranks import DaemonProc, RingJob, free_ports, wait_for
from watchdog.cli.look.cluster import render_text
from watchdog.daemon.judge import cluster as judge
from watchdog.net import fence
from watchdog.record import RecordWriter
from watchdog.status import ClusterView, NodeAnswer, NodeStatus, ReportedRank

SECRET = "correct horse battery staple"


def judge_job(job, ranks, unreachable):
    """judge.judge_job on ranks as a peer's JSON gives them; the view as JSON."""
    return judge.judge_job(job, [ReportedRank.from_json(r) for r in ranks],
                           unreachable).to_json()


def analyze(nodes):
    """judge.analyze on nodes' answers as JSON; the view as JSON."""
    return judge.analyze([NodeAnswer.from_json(n) for n in nodes]).to_json()


def rank(n, state="running", phase="wait", last=10, host="mac", pid=None, world=3):
    return {"rank": n, "state": state, "phase": phase, "host": f"{host}{n}", "job": "j",
            "pid": pid or 100 + n, "world_size": world, "progress": last,
            "last_collective": {"number": last, "op": "all_sum"}}


@pytest.mark.parametrize("ranks, culprit_rank, reason", [
    ([rank(0, "stalled"), rank(1, "stopped", last=9), rank(2, "stalled")], 1, "stopped"),
    ([rank(0, "stalled"), rank(1, "exited", "running", 9), rank(2, "suspect")], 1, "exited"),
    ([rank(0, "stalled"), rank(2, "stalled")], 1, "not reported"),
    ([rank(0, "blocked"), rank(1, "running", "running", 11), rank(2, "blocked")], 1,
     "outside a wait"),
    ([rank(0, "stalled", last=12), rank(1, "stalled", last=11), rank(2, "stalled", last=12)],
     1, "furthest behind"),
])
def test_judge_names_the_culprit(ranks, culprit_rank, reason):
    view = judge_job("j", ranks, [])
    assert view["state"] == "hung"
    assert view["culprit"]["rank"] == culprit_rank
    assert reason in view["culprit"]["reason"]
    assert "wait in all_sum" in view["evidence"] or "no rank waits" in view["evidence"]


@pytest.mark.parametrize("waits, past, state", [
    ({}, False, "suspect"),  # a Ctrl-Z, a debugger's pause: named, not paged
    ({"seconds_in_wait": 4.0, "deadline_seconds": 10.0}, False, "suspect"),
    ({"seconds_in_wait": 10.5, "deadline_seconds": 10.0}, True, "hung"),  # by its seconds
    ({"state": "blocked"}, True, "hung"),  # as its daemon judged it
])
def test_a_stopped_rank_is_hung_only_once_a_wait_is_past_its_deadline(waits, past, state):
    waiting = {**rank(0), **waits}
    view = judge_job("j", [waiting, rank(1, "stopped", last=9), rank(2)], [])
    assert view["state"] == state
    assert view["culprit"]["rank"] == 1 and "stopped" in view["culprit"]["reason"]
    assert view["straggler"] is None
    cli_view = ClusterView.from_json({"nodes": [], "jobs": [view]})
    assert ("SUSPECT" in render_text(cli_view)) is (not past)


def test_judge_healthy_job_has_no_culprit():
    view = judge_job("j", [rank(0), rank(1, phase="running"), rank(2, "idle", "idle")],
                             [])
    assert view["state"] == "healthy" and view["culprit"] is None


def test_analyze_groups_by_job_and_reports_unreachable_nodes():
    nodes = [{"peer": "a:1", "ok": True, "status": {"host": "a", "ranks": [rank(0)]}},
             {"peer": "b:1", "ok": False, "error": "timed out"},
             {"peer": "a:1", "ok": True, "status": {"host": "a", "ranks": [rank(0)]}}]
    view = analyze(nodes)
    assert [n["ok"] for n in view["nodes"]] == [True, False, True]
    assert len(view["jobs"]) == 1 and len(view["jobs"][0]["ranks"]) == 1  # deduplicated


def _nodes(tmp_path, count, **options):
    """`count` daemons, each with its own record directory, all peers of each other."""
    ports = free_ports(count)
    peers = [f"127.0.0.1:{p}" for p in ports]
    daemons = []
    for i, port in enumerate(ports):
        args = [arg for peer in peers if peer != peers[i] for arg in ("--peers", peer)]
        d = DaemonProc(tmp_path / f"node{i}" / "records", tmp_path / f"node{i}" / "state",
                       *args, listen=f"127.0.0.1:{port}", **options)
        d.record_dir.mkdir(parents=True)
        daemons.append(d.start())
    return daemons, peers


def _stop(daemons):
    for d in daemons:
        d.stop()


@pytest.mark.slow
def test_cluster_status_names_the_frozen_rank_and_incidents_agree(tmp_path):
    daemons, peers = _nodes(tmp_path, 3, deadline=2, mode="observe")
    try:
        with RingJob(tmp_path, [d.record_dir for d in daemons], 3, "loop") as job:
            job.wait_running()
            job.signal(1, signal.SIGSTOP)
            incident = wait_for(daemons[0].incidents, 30, what="node 0's incident")[-1]
            cli = subprocess.run([sys.executable, "-m", "watchdog.cli", "cluster", "status",
                                  *peers, "--json"], capture_output=True, text=True, timeout=60)
            assert cli.returncode == 1, cli.stderr
            view = json.loads(cli.stdout)
            (hung,) = [j for j in view["jobs"] if j["state"] == "hung"]
            assert hung["culprit"]["rank"] == 1 and hung["culprit"]["state"] == "stopped"
            assert hung["culprit"]["pid"] == job.procs[1].pid
            assert "rank 1 is stopped" in hung["evidence"]
            # Node 0 sees only rank 0, yet its incident names rank 1 on the other node,
            # with its host and pid, from the peers' view.
            assert incident["cluster"]["culprit"]["rank"] == 1
            assert (incident["culprit"]["rank"], incident["culprit"]["pid"],
                    incident["culprit"]["state"]) == (1, job.procs[1].pid, "stopped")
            assert incident["culprit"]["host"] == incident["cluster"]["culprit"]["host"]
            text = subprocess.run([sys.executable, "-m", "watchdog.cli", "cluster", "status",
                                   *peers], capture_output=True, text=True, timeout=60)
            assert "culprit: rank 1" in text.stdout and text.returncode == 1
    finally:
        _stop(daemons)


@pytest.mark.slow
def test_a_stopped_then_resumed_rank_is_never_hung_before_the_deadline(tmp_path):
    """Ctrl-Z on a rank of a job making collectives by the second, `cluster status`
    polled 20 times (the real CLI, the real daemons): `suspect`, its culprit named, exit
    0; `hung` (exit 1) only with a waiting rank past its deadline as its daemon judges
    it. Resumed, the job is healthy again and no incident was made."""
    from click.testing import CliRunner

    from watchdog.cli.commands import cli

    deadline = 8.0
    daemons, peers = _nodes(tmp_path, 2, deadline=deadline, mode="observe")
    argv = ["cluster", "status", *peers, "--json", "--state-dir", str(tmp_path / "none")]

    def poll():
        result = CliRunner().invoke(cli, argv)
        jobs = json.loads(result.output)["jobs"]
        return result.exit_code, (jobs[0] if len(jobs) == 1 else None)

    try:
        with RingJob(tmp_path, [d.record_dir for d in daemons], 2, "loop") as job:
            job.wait_running()
            job.signal(1, signal.SIGSTOP)
            stopped_at = time.monotonic()
            polls = []
            while len(polls) < 20:
                code, seen = poll()
                if seen is not None and seen["culprit"] is not None:  # its daemon saw it
                    polls.append((code, seen, time.monotonic() - stopped_at))
                assert time.monotonic() - stopped_at < 60, polls
            job.signal(1, signal.SIGCONT)
            for code, seen, after in polls:
                past = [r for r in seen["ranks"] if r["state"] in ("stalled", "blocked")
                        or (r["seconds_in_wait"] or 0) >= deadline]
                if seen["state"] == "hung":  # only ever with a wait past its deadline
                    assert past and code == 1, (after, seen)
                else:
                    assert (seen["state"], code) == ("suspect", 0), (after, seen)
                    assert seen["culprit"]["rank"] == 1, seen
                    assert "stopped" in seen["culprit"]["reason"], seen
            suspect = [after for _, seen, after in polls if seen["state"] == "suspect"]
            assert suspect, [(after, seen["state"]) for _, seen, after in polls]
            wait_for(lambda: (poll()[1] or {}).get("state") == "healthy", 30,
                     what="the job resumed")
            assert poll()[0] == 0
            if max(after for *_, after in polls) < deadline / 2:  # never near a verdict
                assert not daemons[0].incidents() and not daemons[1].incidents()
    finally:
        _stop(daemons)


@pytest.mark.slow
def test_fence_ends_the_peers_ranks_at_once(tmp_path):
    daemons, _ = _nodes(tmp_path, 3, deadline=60, blocked_deadline=60, secret=SECRET,
                        interval=0.1)
    try:
        with RingJob(tmp_path, [d.record_dir for d in daemons], 3, "idle") as job:
            wait_for(lambda: all(len(d.ranks()) == 1 for d in daemons), 60,
                     what="each node watching its rank")
            killed_at = time.monotonic()
            job.signal(1, signal.SIGKILL)
            wait_for(lambda: job.procs[0].poll() is not None and job.procs[2].poll() is not None,
                     20, interval=0.01, what="the fence to end ranks 0 and 2")
            took = time.monotonic() - killed_at
            assert took < 10, f"fence took {took:.2f}s"  # their own deadline is 60 s
            for node in (0, 2):
                inc = wait_for(daemons[node].incidents, 10)[-1]
                assert inc["verdict"] == "fenced"
                assert inc["culprit"]["rank"] == 1
                assert inc["outcome"] == {str(job.procs[node].pid): "killed"}
    finally:
        _stop(daemons)


@pytest.mark.slow
def test_a_forged_crash_record_fences_no_one(tmp_path):
    """Anyone may write a record naming a dead pid, a real job and "open" (a crash).
    Its pid was never seen alive, so it proves nothing: no peer may be fenced."""
    daemons, _ = _nodes(tmp_path, 2, deadline=60, blocked_deadline=60, secret=SECRET,
                        interval=0.1)
    try:
        with RingJob(tmp_path, [d.record_dir for d in daemons], 2, "idle") as job:
            wait_for(lambda: all(len(d.ranks()) == 1 for d in daemons), 60,
                     what="each node watching its rank")
            (real,) = daemons[0].ranks().values()
            gone = subprocess.Popen(["true"])
            gone.wait()
            forged = daemons[0].record_dir / "forged.rec"
            RecordWriter(str(forged), pid=gone.pid, start_time=time.time() - 5,
                         uid=os.getuid(), host="h", job=real["job"], rank=1, world_size=2,
                         backend="ring", dump_signal=0)  # left open: a "crash"
            copy = daemons[0].record_dir / "copy.rec"
            staged = daemons[0].record_dir / "copy.staged"  # whole when it gets its name
            staged.write_bytes(next(daemons[0].record_dir.glob(f"{real['pid']}*.rec"))
                               .read_bytes())
            staged.rename(copy)
            wait_for(lambda: gone.pid in daemons[0].ranks(), 10, what="the forged record seen")
            wait_for(lambda: str(copy) in daemons[0].status()["invalid_records"], 10,
                     what="the copy reported")
            time.sleep(1)  # ten scans on each node
            assert all(p.poll() is None for p in job.procs), "a rank was fenced"
            assert daemons[0].ranks()[gone.pid]["state"] == "exited"
            assert "fencing" not in daemons[0].log()
            assert daemons[1].incidents() == [] and daemons[0].incidents() == []
            assert "a copy of the record of pid" in daemons[0].status()["invalid_records"][
                str(copy)]
    finally:
        _stop(daemons)


def _post(url, body, headers):
    request = urllib.request.Request(url + "/fence", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.slow
def test_fence_requests_are_authenticated(tmp_path):
    from click.testing import CliRunner

    from watchdog.cli.commands import cli

    daemons, _ = _nodes(tmp_path, 1, deadline=60, secret=SECRET)
    open_daemon = DaemonProc(tmp_path / "open" / "records", tmp_path / "open" / "state",
                             deadline=60)
    open_daemon.record_dir.mkdir(parents=True)
    open_daemon.start()
    try:
        with RingJob(tmp_path, daemons[0].record_dir, 2, "idle") as job:
            wait_for(lambda: len(daemons[0].ranks()) == 2, 60)
            url = daemons[0].url()
            job_id = next(iter(daemons[0].ranks().values()))["job"]
            body, headers = fence.make(SECRET, job_id, "attacker", "test", None)
            unsigned = {"Content-Type": "application/json"}
            assert _post(url, body, unsigned)[0] == 401
            bad = dict(headers, **{fence.SIGNATURE: "00" * 32})
            assert _post(url, body, bad)[0] == 401
            old_body, old_headers = fence.make(SECRET, job_id, "x", "old", None,
                                               now=time.time() - 3600)
            assert _post(url, old_body, old_headers)[0] == 401
            wrong_key_body, wrong_key = fence.make("another secret, long enough", job_id,
                                                   "mac2", "test", None)
            assert _post(url, wrong_key_body, wrong_key)[0] == 401
            # The receiver's log names the sender and the cause, with the fix.
            wait_for(lambda: "refused a fence from 127.0.0.1 (which says it is mac2): bad "
                     "signature: the sender's secret differs from this node's"
                     in daemons[0].log(), 10, what="the refusal's log line")
            # An empty POST is told what a fence is (not 413).
            empty = urllib.request.Request(url + "/fence", data=b"", method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(empty, timeout=5)
            assert refused.value.code == 400
            assert b"a fence is a signed JSON body" in refused.value.read()
            # doctor proves the secret to each peer: the other secret fails, naming the
            # cause; the same one passes; a peer without one has fences off.
            peer = url.removeprefix("http://")
            for secret, open_peer, level, said in (
                    ("another secret, long enough", False, "fail", "its secret differs"),
                    (SECRET, False, "ok", "the secrets match"),
                    (SECRET, True, "fail", "has fences off")):
                target = open_daemon.url().removeprefix("http://") if open_peer else peer
                config = tmp_path / "doctor.toml"
                config.write_text(f'peers = ["{target}"]\nsecret = "{secret}"\n')
                config.chmod(0o600)
                result = CliRunner().invoke(cli, ["--config", str(config), "doctor", "--json",
                                                  "--listen", peer])
                proofs = [c for c in json.loads(result.output)["checks"]
                          if c["check"] == "peers" and "fence" in c["message"]]
                assert [c["level"] for c in proofs] == [level], proofs
                assert said in proofs[0]["message"], proofs
                assert result.exit_code == (1 if level == "fail" else 0) or level == "ok"
            # Without a secret the endpoint refuses every POST.
            assert _post(open_daemon.url(), body, headers)[0] == 405
            time.sleep(0.5)
            assert all(p.poll() is None for p in job.procs), "a refused fence changed state"
            # A valid fence ends the ranks; replaying it is refused.
            code, answer = _post(url, body, headers)
            assert code == 202 and sorted(answer["ending"]) == sorted(job.pids)
            assert _post(url, body, headers)[0] == 401
            wait_for(lambda: all(p.poll() is not None for p in job.procs), 20)
    finally:
        _stop(daemons)
        open_daemon.stop()


@pytest.mark.slow
def test_an_unreachable_peer_never_blocks_a_local_kill(tmp_path, record_dir, state_dir):
    # A peer that accepts connections and never answers: every request to it times out.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    peer = f"127.0.0.1:{silent.getsockname()[1]}"
    try:
        with DaemonProc(record_dir, state_dir, "--peers", peer, deadline=2, peer_timeout=1,
                        secret=SECRET) as daemon, \
                RingJob(tmp_path, record_dir, 2, "loop") as job:
            job.wait_running()
            job.signal(1, signal.SIGSTOP)
            froze = time.monotonic()
            wait_for(lambda: all(p.poll() is not None for p in job.procs), 40)
            # deadline 2 + confirm + peer timeout 1 + evidence 2 + grace 1, and slack
            assert time.monotonic() - froze < 20
            inc = wait_for(daemon.incidents, 10)[-1]
            assert peer in inc["cluster"]["unreachable"]
            assert inc["culprit"]["rank"] == 1
    finally:
        silent.close()


# -- never healthy while it cannot be checked; what happened to an ended job ----------


def test_a_rank_behind_an_unreachable_node_while_another_waits_is_unknown():
    view = judge_job("j", [rank(0, "running", world=2)], ["b:9753"])
    assert view["state"] == "unknown" and view["missing_ranks"] == [1]
    assert view["culprit"]["rank"] == 1 and "unreachable: b:9753" in view["culprit"]["reason"]
    assert "rank 1 is not reported" in view["evidence"]
    # Nothing waits: the job runs on, with a node out of sight (the node line says so).
    running = judge_job("j", [rank(0, phase="running", world=2)], ["b:9753"])
    assert running["state"] == "healthy"
    # Every node answered and a rank is missing: that rank exited and was forgotten.
    assert judge_job("j", [rank(0, world=2)], [])["state"] == "healthy"


def test_a_job_the_watchdog_ended_says_so():
    killed = dict(rank(0, "killed", "wait", world=2), reason="ended by the watchdog "
                  "(incident 20260101T000000-abc123)")
    exited = dict(rank(1, "exited", "wait", world=2), reason="exited on an uncaught exception")
    view = judge_job("j", [killed, exited], [])
    assert view["state"] == "ended" and view["culprit"] is None
    assert "rank 0 on mac0: killed, ended by the watchdog (incident" in view["evidence"]
    assert "rank 1 on mac1: exited on an uncaught exception" in view["evidence"]  # once
    # Ranks that share a fate are said once, without nested brackets.
    both = judge_job("j", [killed, dict(killed, rank=1, host="mac1", pid=7)], [])
    assert both["evidence"] == ("ranks 0, 1 on mac0, mac1: killed, ended by the watchdog "
                                "(incident 20260101T000000-abc123)"), both["evidence"]
    # One rank killed, its peer behind an unreachable node: that peer is not known to
    # have ended (the fence may not have reached it), so the job is not known over.
    behind = judge_job("j", [killed], ["b:9753"])
    assert behind["state"] == "unknown" and behind["culprit"]["rank"] == 1, behind
    assert "unreachable: b:9753" in behind["culprit"]["reason"]
    assert "rank 0 on mac0: killed, ended by the watchdog (incident" in behind["evidence"]
    # A clean end: every rank exited.
    done = judge_job("j", [rank(0, "exited", "running", world=2),
                                   rank(1, "exited", "running", world=2)], [])
    assert done["state"] == "ended"
    # Its peer ended, a stopped rank left behind (outside a wait): hung, and named.
    left = judge_job("j", [killed, rank(1, "stopped", "running", world=2)], [])
    assert left["state"] == "hung" and left["culprit"]["state"] == "stopped"
    text = render_text(ClusterView(jobs=(judge.judge_job(
        "j", [ReportedRank.from_json(r) for r in (killed, exited)], []),)))
    assert "ENDED" in text and "evidence: rank 0 on mac0: killed" in text


def test_peers_are_asked_ahead_of_a_verdict_and_the_answer_is_used(monkeypatch):
    """An unreachable peer found by the background ask is not waited on again at the
    verdict; a peer that answers is asked again (its answer must be current)."""
    from concurrent.futures import ThreadPoolExecutor

    from watchdog.daemon.act import peers as peers_mod
    from watchdog.daemon.config import Settings

    asked: list[tuple[float, tuple[str, ...]]] = []
    now = [100.0]

    def gather(peer_list, timeout, secret=None):
        asked.append((now[0], tuple(peer_list)))
        return [NodeAnswer(p, False, error="timed out") if p == "b:9753" else
                NodeAnswer(p, True, NodeStatus(host="c"))
                for p in peer_list]

    monkeypatch.setattr(peers_mod.cluster, "gather", gather)
    with ThreadPoolExecutor(1) as pool:
        peers = peers_mod.Peers(Settings(peers=("b:9753", "c:9753")), "a", pool, 0.0,
                                clock=lambda: now[0])
        peers.prefetch()
        pool.submit(lambda: None).result()  # the background ask has run
        assert asked == [(100.0, ("b:9753", "c:9753"))]
        peers.prefetch()  # an answer is recent: not asked again
        pool.submit(lambda: None).result()
        assert len(asked) == 1
        now[0] += peers_mod.PREFETCH_EVERY - 0.1
        local = NodeStatus.from_json(
            {"host": "a", "ranks": [dict(rank(0, "stalled", world=2), uid=0)]})
        view = peers.view(0, "j", local)  # the verdict
        assert asked[1:] == [(now[0], ("c:9753",))]  # only the peer that answers
        assert view is not None and view.unreachable == ("b:9753",)
        now[0] += peers_mod.FRESH  # too old to stand in: every peer asked at the verdict
        peers.view(0, "j", local)
        assert asked[-1] == (now[0], ("b:9753", "c:9753"))
