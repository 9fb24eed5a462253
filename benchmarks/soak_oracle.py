"""The soak's oracle: every incident and every exit checked against what was injected.

Part of the chaos soak of benchmarks/soak.py (run that, not this). `oracle` reads a
finished soak (`Finished`: its jobs, their faults and exits, the strangers, the daemon's
`incidents.jsonl`) and returns the figures; `failed` says whether they hold a wrong
kill, a missed hang, a misnamed culprit, a healthy rank that did not exit 0 or a
successful attack of the second user; `report` puts them in words.
"""

from __future__ import annotations

import statistics
from typing import Any, Protocol

from benchmarks.soak_hostile import OTHER_UID, Hostile, Stranger, hostile_problems
from benchmarks.soak_jobs import Config, Job
from tests.support.ranks import DaemonProc

PEER_LOST = "connection to a peer was lost"


class Finished(Protocol):
    """What the oracle reads of a soak that has ended (benchmarks.soak.Soak)."""

    cfg: Config
    daemon: DaemonProc
    jobs: dict[str, Job]
    owner: dict[int, str]  # rank pid -> its job
    injected: dict[str, int]
    started_jobs: int
    strangers: dict[int, Stranger]
    hostile: Hostile


def oracle(soak: Finished) -> dict[str, Any]:
    """Every incident and every exit of the soak against what was injected: the figures."""
    cfg = soak.cfg
    incidents = soak.daemon.incidents()  # raises on a malformed line
    by_job: dict[str, list[dict[str, Any]]] = {}
    wrong: list[str] = []
    killed_by_watchdog: dict[int, dict[str, Any]] = {}
    strangers_ended: set[int] = set()
    for inc in incidents:
        # A job is (uid, job id): the stranger's incidents name a real job id
        # but may only ever hold the stranger's own processes.
        stranger = inc.get("uid") == OTHER_UID
        allowed = {**soak.strangers, **soak.hostile.hung} if stranger else soak.owner
        if not stranger:
            by_job.setdefault(inc["job"], []).append(inc)
        for pid_text, outcome in inc.get("outcome", {}).items():
            pid = int(pid_text)
            if outcome == "killed":
                killed_by_watchdog[pid] = inc
                if stranger and pid in soak.strangers:
                    strangers_ended.add(pid)
        for pid in inc["pids"]:
            if pid not in allowed:
                wrong.append(f"pid {pid} is not a {'stranger' if stranger else 'rank'} "
                             f"of the soak (incident {inc['id']} of uid {inc.get('uid')})")
    stranger_missed = [s.pid for s in soak.strangers.values()
                       if s.pid not in strangers_ended and s.cleanup]
    missed_strangers = len(stranger_missed)
    for pid, inc in killed_by_watchdog.items():
        job = soak.jobs.get(soak.owner.get(pid, ""))
        if job is None:
            continue
        fault = job.fatal()
        first = min((s["time"] for s in inc["signals"]), default=inc["time"])
        if fault is None or fault.wall > first:
            wrong.append(f"{job.name} pid {pid}: killed with no hang injected "
                         f"({inc['reason']})")

    caught = missed = 0
    blame_errors: list[str] = []
    slack: list[float] = []
    ended: list[float] = []
    bad_exits: list[str] = []
    wrong_results = 0
    peer_lost = {"mlx_error": 0, "other_exit": 0, "watchdog": 0, "not_ended": 0}
    short_ok = clean_jobs = 0
    for job in soak.jobs.values():
        for rank, p in enumerate(job.ring.procs):
            code = job.exits.get(p.pid, (None, 0.0))[0]
            if code == 3:
                wrong_results += 1
                bad_exits.append(f"{job.name} rank {rank}: wrong all_sum result")
        fault = job.fatal()
        if fault is None:
            if any(pid in job.cleanup for pid in job.ring.pids):
                continue  # still running when the soak ended: no verdict on it
            codes = [job.exits[pid][0] for pid in job.ring.pids]
            if codes != [0] * len(codes):
                bad_exits.append(f"{job.name}: healthy job exited {codes}")
                continue
            clean_jobs += 1
            short_ok += sum(f.kind == "short_pause" for f in job.faults)
            continue
        if fault.kind == "sigkill":
            survivors = [pid for pid in job.ring.pids if pid != fault.pid]
            for pid in survivors:
                if pid in killed_by_watchdog:
                    peer_lost["watchdog"] += 1
                elif pid in job.exits and pid not in job.cleanup:
                    rank = job.ring.pids.index(pid)
                    peer_lost["mlx_error" if PEER_LOST in job.ring.log(rank)
                              else "other_exit"] += 1
                else:
                    peer_lost["not_ended"] += 1
                    missed += 1
            continue
        # A hang: every rank must have been ended by the watchdog in time.
        incs = by_job.get(job.name, [])
        victims = {int(pid) for inc in incs for pid, outcome in inc["outcome"].items()
                   if outcome == "killed"}
        if not fault.located or not incs or set(job.ring.pids) - victims:
            missed += 1
            why = ("never reached its hung wait" if not fault.located
                   else f"not ended (killed {sorted(victims)} of {job.ring.pids})")
            bad_exits.append(f"{job.name}: {fault.kind} missed: {why}")
            continue
        inc = incs[0]
        deadline = cfg.blocked_deadline if inc["verdict"] == "blocked" else cfg.deadline
        term = min(s["time"] for s in inc["signals"] if s["signal"] == "SIGTERM")
        late = term - fault.wall - deadline
        if late > cfg.bound:
            missed += 1
            bad_exits.append(f"{job.name}: ended {late:.1f}s after its deadline")
            continue
        caught += 1
        slack.append(late)
        ended.append(max(job.exits[pid][1] for pid in job.ring.pids) - fault.wall)
        if fault.kind == "long_pause":
            culprit = inc.get("culprit") or {}
            if culprit.get("pid") != fault.pid:
                blame_errors.append(f"{job.name}: paused pid {fault.pid}, culprit {culprit}")

    def stat(values: list[float], how: Any) -> float | None:
        return round(how(values), 2) if values else None

    return {
        "seed": cfg.seed,
        "seconds": cfg.seconds,
        "deadline": cfg.deadline,
        "blocked_deadline": cfg.blocked_deadline,
        "interval": cfg.interval,
        "jobs_started": soak.started_jobs,
        "rank_processes": len(soak.owner),
        "faults_injected": {**soak.injected, "clean_exit": clean_jobs,
                            "new_job": soak.started_jobs},
        "clean_exits": clean_jobs,
        "short_pauses_survived": short_ok,
        "hangs_caught": caught,
        "hangs_missed": missed + missed_strangers,
        "strangers": {"uid": OTHER_UID, "started": len(soak.strangers),
                      "own_hang_ended": len(strangers_ended),
                      "own_hang_missed": missed_strangers},
        "wrong_kills": len(wrong),
        "culprit_errors": len(blame_errors),
        "bad_exits": len(bad_exits),
        "wrong_results": wrong_results,
        "peer_killed_survivors": peer_lost,
        "incidents": len(incidents),
        "slack_median_s": stat(slack, statistics.median),
        "slack_worst_s": stat(slack, max),
        "hang_to_end_median_s": stat(ended, statistics.median),
        "hang_to_end_worst_s": stat(ended, max),
        "problems": wrong + blame_errors + bad_exits
        + [f"stranger {pid}: its own hung record was never acted on"
           for pid in stranger_missed],
    }


def failed(figures: dict[str, Any]) -> bool:
    """Whether the figures hold anything the watchdog must never do or miss."""
    return bool(figures["wrong_kills"] or figures["hangs_missed"] or figures["culprit_errors"]
                or figures["bad_exits"] or figures["wrong_results"]
                or (figures.get("hostile") and hostile_problems(figures["hostile"])))


def report(figures: dict[str, Any]) -> str:
    """The figures in words, one line a measure, then a line a problem."""
    f = figures
    lines = [
        f"soak: seed {f['seed']}, {f['seconds']:g}s of injection ({f['wall_seconds']}s in all), "
        f"deadline {f['deadline']:g}s (blocked {f['blocked_deadline']:g}s), "
        f"interval {f['interval']:g}s",
        f"jobs started        {f['jobs_started']} ({f['rank_processes']} rank processes)",
        "faults injected     " + ", ".join(f"{k} {v}" for k, v in f["faults_injected"].items()),
        f"clean job exits     {f['clean_exits']} (short pauses survived: "
        f"{f['short_pauses_survived']})",
        f"hangs caught        {f['hangs_caught']}",
        f"hangs missed        {f['hangs_missed']}",
        f"wrong kills         {f['wrong_kills']}",
        f"culprit errors      {f['culprit_errors']}",
        f"bad exits           {f['bad_exits']} (wrong all_sum results: {f['wrong_results']})",
        "peer SIGKILLed      survivors ended by MLX error "
        f"{f['peer_killed_survivors']['mlx_error']}, otherwise "
        f"{f['peer_killed_survivors']['other_exit']}, by the watchdog "
        f"{f['peer_killed_survivors']['watchdog']}, not ended "
        f"{f['peer_killed_survivors']['not_ended']}",
        f"detection slack     median {f['slack_median_s']}s, worst {f['slack_worst_s']}s "
        "(first SIGTERM - fault - deadline)",
        f"hang to job gone    median {f['hang_to_end_median_s']}s, "
        f"worst {f['hang_to_end_worst_s']}s",
        f"second user         uid {f['strangers']['uid']}: {f['strangers']['started']} "
        "processes publishing hung, forged and huge records naming real jobs; their own "
        f"hangs ended {f['strangers']['own_hang_ended']}, missed "
        f"{f['strangers']['own_hang_missed']}",
        f"incidents           {f['incidents']}; daemon alive at the end: {f['daemon_alive']}",
    ]
    if f.get("hostile"):
        h = f["hostile"]
        lines.append(
            f"hostile user        crowd {h['crowd']} (ended {h['crowd_ended']}), 64 slow HTTP "
            f"connections, daemon at 256 descriptors (EMFILE {h['too_many_open_files']}); "
            f"largest dump {h['largest_dump_bytes']} B, state free "
            f"{h['state_free_bytes'] >> 20} MiB ({h['state_disk']}); pending "
            f"{h['pending_left']}, unwritten {h['unwritten']}; learned kinds "
            f"{h['learned_kinds_of_user']}")
        lines.append(
            f"hung crowd          {h['hung']} one-process jobs ignoring the dump signal: "
            f"ended {h['hung_ended']}, not ended {h['hung_missed']}, ended unjournaled "
            f"{h['hung_unjournaled']}; huge request heads under way the whole soak")
    lines += [f"PROBLEM: {p}" for p in f["problems"]]
    if f.get("kept"):
        lines.append(f"logs kept in {f['kept']} (daemon-*.log, jobs/*/rank*.log)")
    return "\n".join(lines)
