"""The relaunch decisions of `mlx-watchdog launch` (pure), its journal, the node health
check behind the gate, and how the daemon publishes attempts and launch events."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from watchdog.daemon.attempts import parse
from watchdog.daemon.config import Settings
from watchdog.daemon.store import journal, launchlog
from watchdog.launch import health, relaunch
from watchdog.launch.relaunch import Attempt, Ending
from watchdog.net.metrics import exposition
from watchdog.status import Incident, LaunchEvent, NodeStatus

# What mlx.launch 0.32.4 prints on stderr (colours included) for each rank that did not exit 0.
WARN = "\x1b[33m[WARN] Node with rank {} {} \x1b[0m"


def attempt(*lines: str, code: int = 0, **facts) -> Attempt:
    if isinstance(facts.get("incident"), dict):  # as the daemon journals it
        facts["incident"] = Incident.from_json(facts["incident"])
    a = Attempt(number=1, started=1000.0, launcher_code=code, **facts)
    for line in lines:
        a.see_line(line)
    return a


def exited(rank: int, code: int) -> str:
    return WARN.format(rank, f"exited with code {code}")


@pytest.mark.parametrize(("facts", "lines", "ending", "code", "restarted", "with_any"), [
    # mlx.launch exits 0 in every row: its code says nothing of the ranks.
    ({}, [], Ending.CLEAN, 0, False, False),
    # Ranks that all exited 0 while the watchdog was ending them (resumed by SIGCONT).
    ({"incident": {"id": "i0", "verdict": "stalled", "outcome": {"4": "gone"}}}, [],
     Ending.CLEAN, 0, False, False),
    # --backend mpi: no per-rank lines at all; the incident's outcome tells.
    ({"incident": {"id": "i3", "verdict": "stalled", "outcome": {"4": "killed"}}}, [],
     Ending.WATCHDOG, 11, True, True),
    ({}, [exited(1, 3), exited(0, -15)], Ending.FAILED, 10, False, True),
    ({}, [exited(1, -11), exited(0, -15)], Ending.CRASHED, 10, True, True),
    ({}, [exited(0, 1), exited(1, -6)], Ending.CRASHED, 10, True, True),  # SIGABRT, 2nd line
    ({}, [exited(0, -15), exited(1, -15)], Ending.FAILED, 10, False, True),  # a SIGTERM
    ({}, [exited(1, -9)], Ending.CRASHED, 10, True, True),
    ({}, [exited(0, -2)], Ending.FAILED, 10, False, True),  # a rank's own Ctrl-C
    ({}, [WARN.format(0, "was killed")], Ending.FAILED, 10, False, True),
    ({"incident": {"id": "i1", "verdict": "stalled", "reason": "r"}},
     [exited(1, -15), exited(0, -15)], Ending.WATCHDOG, 11, True, True),
    ({"incident": {"id": "i2", "verdict": "fenced", "reason": "r"}},
     [exited(0, 1)], Ending.FENCED, 11, True, True),
    ({"interrupted": signal.SIGINT}, [exited(0, 1)], Ending.INTERRUPTED, 130, False, False),
    ({"interrupted": signal.SIGTERM}, [], Ending.INTERRUPTED, 143, False, False),
])
def test_endings_exit_codes_and_restarts(facts, lines, ending, code, restarted, with_any):
    a = attempt(*lines, **facts)
    assert relaunch.ending_of(a) is ending
    assert relaunch.exit_code(ending, a.interrupted) == code
    assert relaunch.restartable(ending, "torn-down") is restarted
    assert relaunch.restartable(ending, "any") is with_any
    assert relaunch.describe(a, ending)


def test_mlx_launch_failing_itself_is_a_failure_not_a_clean_exit():
    a = attempt(code=2)
    assert relaunch.ending_of(a) is Ending.FAILED
    assert relaunch.describe(a, Ending.FAILED) == "mlx.launch exited with code 2"


def test_descriptions_name_the_rank_and_the_signal():
    a = attempt(exited(0, -15), exited(1, -11))  # in either order: the crash first
    assert relaunch.describe(a, relaunch.ending_of(a)) == (
        "rank 1 died of SIGSEGV, rank 0 died of SIGTERM")
    a = attempt(exited(1, 3), exited(0, 1))
    assert relaunch.describe(a, relaunch.ending_of(a)) == (
        "rank 0 exited with code 1, rank 1 exited with code 3")
    a = attempt(incident={"id": "x", "verdict": "blocked", "reason": "in eval for 9s"})
    assert relaunch.describe(a, Ending.WATCHDOG) == (
        "the watchdog ended it (incident x: in eval for 9s)")


def test_a_rank_line_split_or_in_the_middle_of_output_is_read():
    a = attempt("some rank output " + exited(1, 3), "[WARN] Node with rank 0 was killed")
    assert a.exits == [(1, 3), (0, None)]
    assert attempt("Node with rank 1 exited with code 3").exits == []  # not mlx.launch's


def test_progress_is_past_the_warm_up_or_a_step():
    a = Attempt(number=1, started=0.0)
    a.see_progress(10, 0)
    a.see_progress(4, 0)  # a later, smaller count (another rank) does not lower it
    assert a.waits == 10 and not relaunch.progressed(a, 10)
    a.see_progress(11, 0)
    assert relaunch.progressed(a, 10)
    b = Attempt(number=1, started=0.0)
    b.see_progress(1, 1)
    assert relaunch.progressed(b, 10)


def test_backoff_doubles_and_is_capped():
    assert [relaunch.backoff(3, n) for n in (1, 2, 3, 4, 5, 6)] == [3, 6, 12, 24, 48, 60]
    assert relaunch.backoff(0, 4) == 0


def incident_for(lines, *args, **kwargs):
    """relaunch.incident_for on journal lines, read as journal.read_incidents reads them."""
    return relaunch.incident_for([Incident.from_json(line) for line in lines], *args, **kwargs)


def test_the_incident_of_this_attempt_only():
    me = os.getuid()
    a = Attempt(number=2, started=1000.0, pids={11, 12})
    incidents = [
        {"id": "old", "job": "j", "time": 500.0, "pids": [11], "uid": me},  # an earlier attempt
        {"id": "other-job", "job": "k", "time": 1001.0, "pids": [11], "uid": me},
        {"id": "attempt-1", "job": "j", "time": 1001.0, "attempt": 1, "pids": [11], "uid": me},
        {"id": "other-ranks", "job": "j", "time": 1001.0, "pids": [99], "uid": me},
        {"id": "bad-time", "job": "j", "time": "soon", "uid": me},
    ]
    assert incident_for(incidents, "j", a) is None
    incidents.insert(2, {"id": "ours", "job": "j", "time": 1002.0, "attempt": 2, "pids": [12],
                         "uid": me})
    assert incident_for(incidents, "j", a).id == "ours"
    # An incident of a daemon that could not read the attempt counts by its pids.
    assert incident_for([{"id": "n", "job": "j", "time": 1000.5, "pids": [11],
                                   "uid": me}], "j", a).id == "n"


def test_another_users_incident_under_our_job_id_is_not_ours():
    """Issue 30, item 3: the job id is world-readable; another uid's hung process
    naming it gets an incident of that uid journaled under it, even after ours,
    with pids we never saw. Only our uid's incident counts."""
    a = Attempt(number=1, started=1000.0)  # no ranks seen yet: pids cannot tell
    theirs = {"id": "theirs", "job": "j", "time": 1001.0, "attempt": 1, "pids": [77],
              "uid": 65534}
    assert incident_for([theirs], "j", a, uid=0) is None
    assert incident_for([{**theirs, "uid": None}], "j", a, uid=0) is None
    ours = {**theirs, "id": "ours", "uid": 0}
    assert incident_for([ours, theirs], "j", a, uid=0).id == "ours"
    assert incident_for([theirs], "j", a, uid=65534).id == "theirs"


def test_attempt_numbers_as_the_launcher_writes_them():
    assert [parse(v) for v in ("1", "12", None, "", "0", "-1", "x", "99999999")] == [
        1, 12, None, None, None, None, None, None]


# -- the journal ---------------------------------------------------------------------


def test_launch_journal_appends_reads_and_counts(state_dir):
    counts = launchlog.Counts(str(state_dir))
    assert counts.get() == {"restart": 0, "refused": 0, "gave_up": 0}
    for event in ("launch", "ended", "restart", "launch", "ended", "gave_up"):
        launchlog.append(str(state_dir), LaunchEvent(event=event, job="j", time=time.time()))
    with open(state_dir / launchlog.LAUNCHES, "a") as f:
        f.write("not json\n[1]\n")
    events, bad = launchlog.read(str(state_dir))
    assert [e.event for e in events] == ["launch", "ended", "restart", "launch", "ended",
                                             "gave_up"]
    assert bad == 2
    assert counts.get() == {"restart": 1, "refused": 0, "gave_up": 1}
    launchlog.append(str(state_dir), LaunchEvent(event="refused", job="j"))
    assert counts.get()["refused"] == 1  # re-read once the file changed


def test_a_launcher_that_may_not_write_the_state_dir_journals_in_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert launchlog.journal_dir(str(tmp_path / "missing")) == str(tmp_path / "xdg" /
                                                                   "mlx-watchdog")
    assert launchlog.journal_dir(str(tmp_path)) == str(tmp_path)


def test_metrics_show_attempts_and_launch_events():
    snap = {"ranks": [{"job": "j", "rank": 0, "state": "running", "attempt": 3, "progress": 1},
                      {"job": "j", "rank": 1, "state": "running", "attempt": None}],
            "launches": {"restart": 2, "refused": 1, "gave_up": 0}}
    text = exposition(lambda: NodeStatus.from_json(snap)).decode()
    assert 'mlx_watchdog_rank_attempt{mlx_job="j",rank="0",uid=""} 3.0' in text
    assert 'mlx_watchdog_rank_attempt{mlx_job="j",rank="1",uid=""}' not in text
    assert 'mlx_watchdog_launch_events_total{event="restart"} 2.0' in text
    assert 'mlx_watchdog_launch_events_total{event="refused"} 1.0' in text


# -- the health check ----------------------------------------------------------------


def publish_status(state_dir, wired: int, baseline: int) -> None:
    """status.json as a live daemon (this process) that just scanned would write it."""
    journal.write_json_atomic(str(state_dir / journal.STATUS), {
        "daemon_pid": os.getpid(), "interval": 1, "scan_monotonic": time.monotonic(),
        "wired_bytes": wired, "wired_baseline_bytes": baseline, "ranks": []})


def test_health_refuses_a_flagged_node_and_unsettled_wired_memory(state_dir):
    settings = Settings(state_dir=str(state_dir), wired_threshold=1 << 20)
    fit = health.check(settings)
    assert fit.problem is None and fit.notes == (
        "no daemon running here: wired memory not checked",)
    publish_status(state_dir, wired=(5 << 20), baseline=(1 << 20))
    assert "4 MiB above its idle baseline" in health.check(settings).problem
    publish_status(state_dir, wired=(2 << 20), baseline=(1 << 20))
    assert health.check(settings) == health.Health(None)
    journal.set_reboot_flag(str(state_dir), "rank 3 survived SIGKILL")
    problem = health.check(settings).problem
    assert problem.startswith("this node is flagged for reboot (rank 3 survived SIGKILL")


def test_wait_healthy_waits_for_the_flag_to_go_then_times_out(state_dir):
    settings = Settings(state_dir=str(state_dir))
    journal.set_reboot_flag(str(state_dir), "leak")
    now = [0.0]
    told = []

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= 2:
            journal.clear_reboot_flag(str(state_dir))

    fit = health.wait_healthy(settings, 10, poll=0.5, clock=lambda: now[0], sleep=sleep,
                              on_wait=told.append)
    assert fit.problem is None and now[0] == 2.0 and len(told) == 1
    journal.set_reboot_flag(str(state_dir), "leak")
    gave = health.wait_healthy(settings, 3, poll=0.5, clock=lambda: now[0],
                               sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert gave.problem is not None and now[0] == 5.0


def test_incidents_lists_restarts_refusals_and_give_ups(state_dir, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from watchdog.cli.commands import cli

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    journal.append_incident(str(state_dir), {"id": "i1", "time": 100.0, "job": "j",
                                             "attempt": 1, "verdict": "stalled", "ranks": []})
    for when, event, number in ((90.0, "launch", 1), (101.0, "restart", 2),
                                (102.0, "refused", 2)):
        launchlog.append(str(state_dir), LaunchEvent(time=when, event=event, job="j",
                                                     attempt=number, reason=f"{event} why"))
    out = CliRunner().invoke(cli, ["incidents", "--state-dir", str(state_dir)]).output
    lines = [line for line in out.splitlines() if not line.startswith("    ")]
    assert "job j attempt 1  stalled" in lines[0]
    assert "launch  job j  relaunched as attempt 2" in lines[1]
    assert "launch  job j  refused attempt 2" in lines[2]
    assert len(lines) == 3  # "launch" events only with --json
    items = json.loads(CliRunner().invoke(cli, ["incidents", "--state-dir", str(state_dir),
                                                "--json"]).output)
    assert [i.get("event", i.get("id")) for i in items] == ["launch", "i1", "restart",
                                                             "refused"]


def test_incidents_last_counts_incidents_not_the_launchers_lines(state_dir, tmp_path,
                                                                  monkeypatch):
    """Issue 38, item 2: a `launch --restart` run with two incidents writes more launch
    lines than incidents; `--last N` counts incidents, and what launch did after the
    first of them is kept."""
    from click.testing import CliRunner

    from watchdog.cli.commands import cli

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    for number, when in ((1, 100.0), (2, 200.0)):
        journal.append_incident(str(state_dir), {"id": f"i{number}", "time": when,
                                                 "job": "j", "attempt": number,
                                                 "verdict": "stalled", "ranks": []})
    for when, event, number in ((90.0, "launch", 1), (101.0, "ended", 1),
                                (102.0, "restart", 2), (103.0, "launch", 2),
                                (201.0, "ended", 2), (202.0, "gave_up", 2)):
        launchlog.append(str(state_dir), LaunchEvent(time=when, event=event, job="j",
                                                     attempt=number, reason=f"{event} why"))

    def incidents(*args: str) -> str:
        result = CliRunner().invoke(cli, ["incidents", "--state-dir", str(state_dir), *args])
        assert result.exit_code == 0, result.output
        return result.output

    def heads(out: str) -> list[str]:
        return [line for line in out.splitlines() if not line.startswith("    ")]

    one = heads(incidents("--last", "1"))
    assert "i2  job j attempt 2  stalled" in one[0], one
    assert "gave up after attempt 2" in one[1] and len(one) == 2, one
    two = heads(incidents("--last", "2"))
    assert ["i1" in two[0], "relaunched as attempt 2" in two[1], "i2" in two[2]] == [True] * 3
    assert len(heads(incidents("--last", "5"))) == len(heads(incidents())) == 4
    last = json.loads(incidents("--json", "--last", "1"))
    assert last[0]["id"] == "i2" and "kind" not in last[0]
    assert [i.get("event") for i in last[1:]] == ["ended", "gave_up"]
    assert [i.get("id") for i in json.loads(incidents("--json", "--last", "2"))
            if "kind" not in i] == ["i1", "i2"]


def test_health_against_the_first_attempts_wired_memory(state_dir, monkeypatch):
    """The daemon's baseline follows wired memory while no rank is live; the launcher's
    reading from before attempt 1 does not, unless other jobs' ranks hold memory now."""
    settings = Settings(state_dir=str(state_dir), wired_threshold=1 << 20)
    monkeypatch.setattr(health, "wired_now", lambda: 10 << 20)
    publish_status(state_dir, wired=10 << 20, baseline=10 << 20)  # the daemon: fit
    alone = health.Reference(wired=2 << 20, others_live=lambda: False)
    assert health.check(settings, alone).problem == (
        "wired memory is 8 MiB above where it was before the first attempt (more than "
        "wired_threshold 1 MiB)")
    shared = health.Reference(wired=2 << 20, others_live=lambda: True)
    fit = health.check(settings, shared)
    assert fit.problem is None and "ranks of other jobs run here" in fit.notes[0]
    assert health.check(settings, health.Reference(9 << 20, lambda: False)).problem is None


def test_a_rank_line_split_by_a_ranks_own_text_is_still_read():
    """Seen in CI: the ring rank's stderr shares mlx.launch's pipe, and its text landed
    between mlx.launch's "[WARN] " and the rest of the line; the SIGKILL was then missed
    and the crash was told as rank 0's own failure (not relaunched)."""
    a = attempt("\x1b[33m[WARN][ring] Socket 4 was closed by the peer",
                "[ring] Socket 4  Node with rank 1 exited with code -9 \x1b[0m",
                "\x1b[33m[WARN] Node with rank 0 exited with code 1 \x1b[0m")
    assert sorted(a.exits) == [(0, 1), (1, -9)]


def test_the_ranks_are_given_the_nodes_record_directory():
    """`launch` gives every rank the config's `dir` (--env, which reaches the remote
    ranks too): ranks publishing elsewhere would run unwatched. A directory the user
    named with --env is left as given."""
    from watchdog.daemon.config import Settings
    from watchdog.launch.supervisor import Plan, Supervisor

    plan = Plan(mlx_launch="mlx.launch", args=["train.py"], job="j1", job_given=False,
                record_dir="/srv/mlx-records", settings=Settings(dir="/srv/mlx-records"))
    argv = Supervisor(plan).argv(1)
    assert argv[:5] == ["mlx.launch", "--env", "MLX_WATCHDOG_JOB=j1", "--env",
                        "MLX_WATCHDOG_DIR=/srv/mlx-records"], argv
    assert argv[-1] == "train.py"
    mine = Plan(mlx_launch="mlx.launch", args=["--env", "MLX_WATCHDOG_DIR=/d", "train.py"],
                job="j1", job_given=False, record_dir="/d", settings=Settings(),
                dir_given=True)
    assert [a for a in Supervisor(mine).argv(1) if a.startswith("MLX_WATCHDOG_DIR=")] == [
        "MLX_WATCHDOG_DIR=/d"]


def test_an_interrupt_is_said_in_words_without_a_parenthesis_before_the_exit():
    """`interrupted by SIGINT; exit 130`: never "interrupted (SIGINT) (exit 130)"."""
    import signal

    a = relaunch.Attempt(number=1, started=0.0)
    a.interrupted = signal.SIGINT
    assert relaunch.describe(a, relaunch.Ending.INTERRUPTED) == "interrupted by SIGINT"
