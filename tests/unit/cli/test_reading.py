"""Output a person reads: units on the status table's SINCE, DEADLINE and CPU; states in
colour on a terminal only (NO_COLOR honoured); counts with their plural; the cluster view
with a header over its ranks, a missing rank without "None" or "?", and this node's
daemon listed once; incident times with their zone and the evidence folder.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re

from click.testing import CliRunner

from watchdog.cli import colour
from watchdog.cli.commands import cli
from watchdog.cli.look.cluster import render_text
from watchdog.cli.look.status import table
from watchdog.daemon.judge import cluster
from watchdog.daemon.store import journal
from watchdog.status import (
    Culprit,
    Incident,
    IncidentRank,
    LastCollective,
    NodeAnswer,
    NodeStatus,
    RankStatus,
)
from watchdog.text import plural, who

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def rank(n: int, state: str = "stalled", **more: object) -> RankStatus:
    fields: dict = dict(job="j", pid=100 + n, host=f"h{n}", uid=0, rank=n, world_size=2,
                        state=state, phase="wait", progress=7, collectives=9,
                        seconds_since_progress=12.34, deadline_seconds=60.0,
                        busiest_thread_cpu=0.987, current_op="all_sum",
                        last_collective=LastCollective(8, "all_sum", 16))
    fields.update(more)
    return RankStatus(**fields)


def test_the_status_table_says_its_units():
    text = table([rank(0), rank(1, "running", seconds_since_progress=None,
                                deadline_seconds=None, busiest_thread_cpu=None)])
    head, first, second = text.splitlines()
    assert head.split() == ["PID", "JOB", "RANK", "STATE", "PHASE", "PROGRESS", "COLL",
                            "SINCE", "DEADLINE", "CPU", "OP"]
    assert first.split() == ["100", "j", "0/2", "stalled", "wait", "7", "9", "12.3s", "60s",
                             "99%", "all_sum"]
    assert second.split()[7:10] == ["-", "-", "-"]
    assert "\x1b[" not in text


def test_states_are_coloured_on_a_terminal_only_and_columns_stay_aligned():
    plain = table([rank(0), rank(1, "running")])
    coloured = table([rank(0), rank(1, "running")], colour=True)
    assert "\x1b[31mstalled" in coloured and "\x1b[32mrunning" in coloured
    assert ANSI.sub("", coloured) == plain

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert colour.wanted(Tty()) and not colour.wanted(io.StringIO())


def test_no_color_turns_colour_off(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour.wanted(Tty())


def test_plurals_and_who():
    assert plural(1, "rank") == "1 rank" and plural(2, "rank") == "2 ranks"
    assert plural(0, "file") == "0 files"
    assert who(1, "mac-02", 4242) == "rank 1 on mac-02 (pid 4242)"
    assert who(1, None, None) == "rank 1" and who(None, "h", None) == "a rank on h"


def test_the_cluster_view_has_a_header_over_its_ranks_and_no_none():
    view = cluster.analyze([NodeAnswer("a:1", True, NodeStatus(host="h0", ranks=(rank(0),))),
                            NodeAnswer("b:1", False, error="timed out")])
    text = render_text(view)
    assert "None" not in text and "?" not in text, text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines)
                  if line.split()[:3] == ["RANK", "HOST", "PID"])
    assert lines[header - 1].startswith("job j of uid 0 (2 ranks): ")
    assert lines[header + 1].split()[:4] == ["0", "h0", "100", "stalled"]
    assert lines[header + 2].split() == ["1", "(not", "reported)"]
    culprit = next(line for line in lines if line.startswith("  culprit: "))
    assert culprit.startswith("  culprit: rank 1: "), culprit  # no host, no pid known
    one = cluster.analyze([NodeAnswer("a:1", True, NodeStatus(
        host="h0", ranks=(rank(0, "running", world_size=1),)))])
    assert "(1 rank): HEALTHY" in render_text(one)
    assert "\x1b[32mHEALTHY" in render_text(one, colour=True)


def test_cluster_status_lists_this_nodes_daemon_once(monkeypatch, tmp_path):
    mine = NodeStatus(host="me", daemon_pid=4242, ranks=(rank(0, "running"),))
    monkeypatch.setattr("watchdog.net.cluster.gather", lambda peers, timeout, secret=None: [
        NodeAnswer(p, True, mine) for p in peers])
    monkeypatch.setattr("watchdog.daemon.store.snapshot.daemon_status", lambda state_dir: mine)
    done = CliRunner().invoke(cli, ["cluster", "status", "me:9753",
                                    "--state-dir", str(tmp_path)])
    nodes = [line for line in done.stdout.splitlines() if ": ok (" in line]
    assert nodes == ["node me:9753: ok (me)"], done.stdout
    other = NodeStatus(host="me", daemon_pid=1, ranks=())
    monkeypatch.setattr("watchdog.daemon.store.snapshot.daemon_status", lambda state_dir: other)
    done = CliRunner().invoke(cli, ["cluster", "status", "me:9753",
                                    "--state-dir", str(tmp_path)])
    assert "this node's daemon: ok (me)" in done.stdout, done.stdout


def test_incidents_show_their_zone_and_evidence_folder(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    inc = Incident(id="20260101T000000-abcdef", time=1767225600.0, host="h0", job="j",
                   verdict="stalled", action="ended", reason="in all_sum for 70s",
                   ranks=(IncidentRank(pid=100, rank=0, state="stalled"),),
                   culprit=Culprit(host="h1", rank=1, pid=None, reason="stopped"),
                   evidence=(str(state / "evidence" / "x" / "a.txt"),))
    (state / journal.INCIDENTS).write_text(json.dumps(inc.to_json()) + "\n")
    done = CliRunner().invoke(cli, ["incidents", "--state-dir", str(state)])
    assert done.exit_code == 0, done.output
    first, *rest = done.stdout.splitlines()
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+  20260101T000000-abcdef  job j  "
                    r"stalled  rank 0  ended$", first), first
    assert any(line.startswith(f"    evidence: {state}/evidence/20260101T000000-abcdef/ "
                               "(1 stack file)") for line in rest), rest
    assert "    culprit: rank 1 on h1: stopped" in rest
    assert "None" not in done.stdout


def test_with_no_daemon_an_exited_rank_ages_out_of_status(tmp_path):
    """A rank that died without closing its record is shown for the daemon's default
    retention after its record's last write, then left out with one line saying so."""
    import os
    import time

    from tests.unit.daemon.test_observation import reaped_pid, write
    from watchdog.cli.look.sampling import RETENTION, sample_ranks
    from watchdog.daemon.judge.deadlines import Rules

    recent, old = reaped_pid(), reaped_pid()
    write(tmp_path, "recent", pid=recent, start_ticks=0)
    write(tmp_path, "old", pid=old, start_ticks=0)
    long_ago = time.time() - RETENTION - 5
    os.utime(tmp_path / "old.rec", (long_ago, long_ago))
    ranks, invalid = sample_ranks(str(tmp_path), Rules(), pause=0.0)
    assert [(r.pid, r.state) for r in ranks] == [(recent, "exited")]
    assert list(invalid) == [str(tmp_path / "old.rec")]
    state = tmp_path / "state"
    state.mkdir()
    done = CliRunner().invoke(cli, ["status", "--dir", str(tmp_path), "--state-dir", str(state)])
    assert done.exit_code == 0, done.output
    assert str(old) not in done.stdout and str(recent) in done.stdout
    assert done.stderr.splitlines() == [
        f"(1 rank that exited over {RETENTION:g}s ago not shown; their records stay in "
        f"{tmp_path} until a daemon runs)",
        "(1 rank; sampled here: no daemon running)"], done.stderr


def test_a_rank_known_in_part_is_named_without_none_or_question_marks():
    from watchdog import cause

    partial = RankStatus(job="j", rank=1, last_collective=LastCollective(None, None, 0))
    assert cause.who(partial) == "rank 1"
    assert cause.where(partial) == "a collective (0 B)"
    assert cause.who(rank(0)) == "rank 0 on h0 (pid 100)"


def test_incidents_count_the_evidence_as_it_is_and_name_a_missing_python_stack(
        tmp_path, monkeypatch):
    """Stack files and notes counted apart, each rank without its Python stack named with
    its note; a reader who may not search root's 700 folder is told `sudo ls` (its
    parent is 700 too: to such a reader the folder is not even a directory)."""
    from watchdog.cli.node import commands

    folder = tmp_path / "evidence" / "i1"
    folder.mkdir(parents=True)
    stacks = [folder / "rank0-pid100-python.txt", folder / "rank0-pid100-native.txt",
              folder / "rank1-pid101-native.txt"]
    for f in [*stacks, folder / "rank1-pid101-python-missing.txt"]:
        f.write_text("x")
    inc = Incident(id="i1", ranks=(IncidentRank(pid=100, rank=0), IncidentRank(pid=101, rank=1)),
                   evidence=tuple(map(str, stacks)), action="ended")
    lines = commands._evidence_lines(inc, str(folder))
    assert lines == [f"    evidence: {folder}/ (3 stack files and 1 note)",
                     "    no Python stack of rank 1 (pid 101): why in "
                     "rank1-pid101-python-missing.txt"]
    real_stat = os.stat

    def searchless(path, *args, **kwargs):
        if str(path).startswith(str(tmp_path / "evidence")):
            raise PermissionError(13, "Permission denied")
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(commands.os, "stat", searchless)
    monkeypatch.setattr(commands.os, "geteuid", lambda: 1000)
    first, *rest = commands._evidence_lines(inc, str(folder))
    assert first == (f"    evidence: {folder}/ (3 stack files and 1 note); root only (it holds "
                     f"every rank's stacks): sudo ls {folder}"), first
    assert rest == ["    no Python stack of rank 1 (pid 101): why in "
                    "rank1-pid101-python-missing.txt"]


def test_a_rank_claimed_twice_is_warned_of_in_watch_and_cluster_status(tmp_path, monkeypatch):
    """Issue 56: `status` warned of two live ranks claiming one rank of one job; `watch`
    and `cluster status` showed the job without a word."""
    from watchdog.cli.look import status as look

    twice = [rank(0, "running"), dataclasses.replace(rank(0, "running"), pid=999, host="h1")]
    view = cluster.analyze([NodeAnswer("a:1", True, NodeStatus(host="h0", ranks=(twice[0],))),
                          NodeAnswer("b:1", True, NodeStatus(host="h1", ranks=(twice[1],)))])
    shown = render_text(view)
    assert "  warning: pids 100, 999 all claim rank 0 of job j" in shown, shown
    monkeypatch.setattr(look, "_ranks", lambda *args: (twice, "daemon"))
    done = CliRunner().invoke(cli, ["watch", "--count", "1", "--dir", str(tmp_path),
                                    "--state-dir", str(tmp_path)])
    assert "warning: pids 100, 999 all claim rank 0 of job j" in done.output, done.output
