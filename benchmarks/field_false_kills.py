"""The field's false kills at the daemon's default settings (issue 55): what a job under
each look-alike of a hang gets, and how fast a real hang beside it is still ended.

Scenarios (each a fresh daemon at its defaults: only the directories and the address
given; ring ranks of tests/support/rank_prog.py on 127.0.0.1):

- `debugger`: 3 ranks in `soak` (checked rounds, 0.05 s apart) until their deadline is
  learned; a person's gdb (no descendant of the daemon) holds rank 1 for `--hold` s
  (150); then the incidents, the status it showed, and whether the job ran on after the
  detach; then the same rank SIGSTOPped with no tracer, timed to its job ended.
- `bringup`: two 2-rank rings at once: one whose rank 1 starts `--late` s (120) after
  rank 0 entered init (held: it forms and runs), one whose rank 1 never starts (ended
  at the bring-up bound, 600 s, cause `peer_never_joined`).
- `coldstep`: 2 ranks in `prefill`: a first step of `--first` s (120) on every rank
  (rank 1 half as long again), nothing learned: 0 incidents.
- `starved`: 2 ranks in `loop`, both pinned to one core shared with two CPU burners of
  another user (uid 65534) for `--starve` s (120): 0 incidents.

    python -m benchmarks.field_false_kills debugger bringup
    python -m benchmarks.field_false_kills coldstep starved
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.support.lm_server import DefaultDaemon
from tests.support.ranks import RingJob, wait_for


def tracer_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("TracerPid:")).split()[1])


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def debugger(work: Path, hold: float) -> None:
    with DefaultDaemon(work / "rec", work / "state") as daemon, \
            RingJob(work / "dbg", work / "rec", 3, "soak", args=("3600", "0.05")) as job:
        job.wait_running(timeout=120)
        wait_for(lambda: all((r := daemon.ranks().get(p)) and r["deadline_seconds"] < 600
                             for p in job.pids), 300, what="the learned deadline")
        target = job.procs[1].pid
        print(f"[debugger] learned deadline {daemon.ranks()[target]['deadline_seconds']}s; "
              f"{load()}", flush=True)
        subprocess.run(["sh", "-c", shlex.join(["gdb", "-q", "-nx", "-batch", "-p",
                                                str(target), "-ex", f"shell sleep {hold}"])
                        + " >/dev/null 2>&1 &"], check=True)
        attach = time.monotonic()
        tracer = wait_for(lambda: tracer_of(target), 60, what="gdb attached")
        seen = wait_for(lambda: (r := daemon.ranks().get(target)) and r["state"] == "traced"
                        and r, 30, what="traced shown")
        print(f"[debugger] attached in {time.monotonic() - attach:.1f}s, status: "
              f"{seen['state']} tracer_pid={seen.get('tracer_pid')} (gdb pid {tracer}) "
              f"tracer={seen.get('tracer')!r}: {seen['reason']}", flush=True)
        wait_for(lambda: not tracer_of(target), hold + 120, interval=0.5, what="detach")
        traced_for = time.monotonic() - attach
        before = daemon.ranks()[job.pids[0]]["progress"]
        time.sleep(70)  # past the learned deadline (60 s floor) from the detach
        after = daemon.ranks()[job.pids[0]]["progress"]
        alive = all(p.poll() is None for p in job.procs)
        print(f"[debugger] traced {traced_for:.0f}s; incidents: {len(daemon.incidents())}; "
              f"70 s after the detach: alive={alive}, rank 0 progress {before} -> {after}; "
              f"{load()}", flush=True)
        job.signal(1, 19)  # SIGSTOP
        stopped = time.monotonic()
        wait_for(lambda: all(p.poll() is not None for p in job.procs), 300, interval=0.1,
                 what="the stopped rank's job ended")
        took = time.monotonic() - stopped
        print(f"[debugger] SIGSTOP, no tracer: every rank ended {took:.1f}s after it",
              flush=True)
        inc = wait_for(daemon.incidents, 30, what="the incident")[-1]
        first = min(s["time"] for s in inc["signals"]) - inc["time"] if inc["signals"] else None
        print(f"[debugger] the incident: cause {inc['cause']}, reason {inc['reason']!r}: "
              f"{inc['summary']}; its first signal {first}s after its verdict; {load()}",
              flush=True)


def bringup(work: Path, late_by: float) -> None:
    with DefaultDaemon(work / "rec2", work / "state2") as daemon:
        late = RingJob(work / "late", work / "rec2", 2, "soak",
                       args=("3600", "0.05")).start(ranks=1)
        never = RingJob(work / "never", work / "rec2", 2, "soak",
                        args=("3600", "0.05")).start(ranks=1)
        began = time.monotonic()
        try:
            time.sleep(late_by)
            row = daemon.ranks().get(late.procs[0].pid, {})
            print(f"[bringup] at {late_by:.0f}s rank 0: {row.get('state')}: "
                  f"{row.get('reason')}; {load()}", flush=True)
            late.start_rank(1)
            late.wait_running(timeout=120)
            print(f"[bringup] late peer joined, job runs; incidents on it: "
                  f"{[i for i in daemon.incidents() if late.procs[0].pid in i['pids']]}",
                  flush=True)
            wait_for(lambda: never.procs[0].poll() is not None, 1200, interval=0.5,
                     what="the lone rank 0 ended")
            took = time.monotonic() - began
            inc = [i for i in daemon.incidents() if never.procs[0].pid in i["pids"]][-1]
            alive = all(p.poll() is None for p in late.procs)
            print(f"[bringup] never-coming peer: rank 0 ended {took:.0f}s after entering "
                  f"init, cause {inc['cause']}: {inc['summary']}; the late job alive: "
                  f"{alive}, incidents in all: {len(daemon.incidents())}; {load()}",
                  flush=True)
        finally:
            late.stop()
            never.stop()


def coldstep(work: Path, first: float) -> None:
    with DefaultDaemon(work / "rec3", work / "state3") as daemon, \
            RingJob(work / "cold", work / "rec3", 2, "prefill",
                    args=(str(first), "5", "1")) as job:
        # The step is timed on an idle core: a loaded machine stretches it several times.
        wait_for(lambda: all(p.poll() is not None for p in job.procs), first * 10 + 300,
                 interval=1, what="the prefill job done")
        print(f"[coldstep] first step ~{first:.0f}s (rank 1 x1.5): exits "
              f"{[p.returncode for p in job.procs]}, incidents {len(daemon.incidents())}; "
              f"{job.log(0).splitlines()[-3:]}; {load()}", flush=True)


def starved(work: Path, seconds: float) -> None:
    burn = "while True: pass"
    with DefaultDaemon(work / "rec4", work / "state4") as daemon, \
            RingJob(work / "starved", work / "rec4", 2, "loop") as job:
        job.wait_running(timeout=120)
        for p in job.procs:
            os.sched_setaffinity(p.pid, {0})
        burners = [subprocess.Popen(["taskset", "-c", "0", "setpriv", "--reuid=65534",
                                     "--regid=65534", "--clear-groups", sys.executable,
                                     "-c", burn]) for _ in range(2)]
        try:
            before = daemon.ranks()[job.pids[0]]["progress"]
            time.sleep(seconds)
            after = daemon.ranks()[job.pids[0]]["progress"]
        finally:
            for b in burners:
                b.kill()
                b.wait()
        print(f"[starved] {seconds:.0f}s on one core with 2 burners of uid 65534: incidents "
              f"{len(daemon.incidents())}, alive {all(p.poll() is None for p in job.procs)}, "
              f"rank 0 progress {before} -> {after}; {load()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="+",
                        choices=["debugger", "bringup", "coldstep", "starved"])
    parser.add_argument("--hold", type=float, default=150.0)
    parser.add_argument("--late", type=float, default=120.0)
    parser.add_argument("--first", type=float, default=120.0)
    parser.add_argument("--starve", type=float, default=120.0)
    args = parser.parse_args()
    runs = {"debugger": lambda w: debugger(w, args.hold),
            "bringup": lambda w: bringup(w, args.late),
            "coldstep": lambda w: coldstep(w, args.first),
            "starved": lambda w: starved(w, args.starve)}
    with tempfile.TemporaryDirectory() as tmp:
        threads = []
        for name in args.scenarios:  # at once: each its own daemon and directories
            work = Path(tmp) / name
            work.mkdir()
            for sub in ("rec", "rec2", "rec3", "rec4"):
                (work / sub).mkdir()
            threads.append(threading.Thread(target=runs[name], args=(work,), name=name))
            threads[-1].start()
        for t in threads:
            t.join()


if __name__ == "__main__":
    main()
