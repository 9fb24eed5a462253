"""The demo's account of an incident: what was found, where it waits, what was done."""

from __future__ import annotations

import linecache
import os
import re

from watchdog.daemon.store import journal
from watchdog.states import PAST_DEADLINE
from watchdog.status import Incident
from watchdog.text import plural


def read_incidents(state_dir: str) -> list[Incident]:
    """The demo daemon's incidents, oldest first."""
    return journal.read_incidents(state_dir)[0]


def incident_lines(inc: Incident, state_dir: str, t0_wall: float) -> list[str]:
    """The incident as the demo tells it, one line each; times from the demo's start."""
    out: list[str] = []
    out.append("")
    out.append(f"Incident {inc.id} (from {state_dir}/incidents.jsonl)")
    # One figure for the hang, the ranks' own below it: the longest wait among them
    # (their time since progress can be a few scans shorter, and read as another).
    waits = [r.seconds_in_wait for r in inc.ranks if r.op and r.seconds_in_wait]
    longest = max(waits, default=inc.seconds_without_progress)
    out.append(f"  job {inc.job} on {inc.host}: verdict {inc.verdict}, "
               f"{longest:.1f}s in a wait without progress, busiest "
               f"thread got {inc.busiest_thread_cpu:.0%} of a core")
    if inc.cause:
        out.append(f"  cause: {inc.cause}: {inc.summary}")
    out.append(f"  reason: {inc.reason}")
    named = culprit(inc)
    if named:
        out.append(f"  culprit: {named}")
    for r in inc.ranks:
        wait = r.seconds_in_wait
        out.append(f"  rank {r.rank} pid {r.pid}: {r.state}, phase "
                   f"{r.phase}" + (f" in {r.op} for {wait:.1f}s" if r.op and wait else "")
                   + f", {r.collectives} collectives")
    for rank, tail in sorted(inc.flight_recorder_tail.items()):
        if tail:
            ops = ", ".join(f"{c.op} #{c.number}" for c in tail[-3:])
            out.append(f"  flight recorder of rank {rank} (last 3): {ops}")
    evidence = list(inc.evidence or ())
    out.append(f"  evidence: {plural(len(evidence), 'file')}")
    for path in evidence:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        out.append(f"    {os.path.relpath(path, state_dir)} ({size} bytes)")
    # The hung rank's own dump first: evidence is listed in the order it was captured.
    hung = [f"rank{r.rank}-pid{r.pid}-" for r in inc.ranks if r.state in PAST_DEADLINE]
    frames = stack_excerpt(sorted(evidence, key=lambda p: not any(
        os.path.basename(p).startswith(h) for h in hung)))
    if frames:
        out.append("  where the hung rank waits (its Python stack dump):")
        for frame in frames:
            out.append(f"    {frame}")
    out.append("  signals:")
    for sig in inc.signals or ():
        at = (sig.time if sig.time is not None else t0_wall) - t0_wall
        out.append(f"    [{at:4.1f}s] {str(sig.signal):<7} to rank {sig.rank} "
                   f"(pid {sig.pid}): {sig.result}")
    outcome = inc.outcome or {}
    if outcome:
        out.append("  outcome: " + ", ".join(f"pid {p} {o}" for p, o in outcome.items()))
    if inc.wired_check:
        out.append(f"  wired memory after the kill: {inc.wired_check}")
    out.append(f"  reboot required: {inc.reboot_required or 'no'}")
    out.append("")
    return out

def culprit(inc: Incident) -> str:
    """The incident's culprit in one line: the one it names, else the ranks past their deadline."""
    named = inc.culprit
    if named is not None:
        return f"rank {named.rank} pid {named.pid}: {named.reason}"
    hung = [r for r in inc.ranks if r.state in PAST_DEADLINE]
    described = []
    for r in hung:
        tail = inc.flight_recorder_tail.get(str(r.rank)) or ()
        last = f" after {tail[-1].op} #{tail[-1].number}" if tail else ""
        described.append(f"rank {r.rank} pid {r.pid}: {r.state} in "
                         f"{r.op or 'a wait'}{last}")
    return "; ".join(described)

def stack_excerpt(evidence: list[str]) -> list[str]:
    """The first frames of the hung rank's Python stack dump, with its line of code."""
    for path in evidence:
        if not path.endswith("-python.txt"):
            continue
        try:
            with open(path, errors="replace") as f:
                text = f.read(65536)
        except OSError:
            continue
        for block in text.split("\n\n"):
            lines = [ln.strip() for ln in block.splitlines() if ln.strip()]
            if not any("demo/rank.py" in ln for ln in lines):
                continue
            out = []
            for ln in lines[:4]:
                out.append(ln)
                frame = re.match(r'File "(.+demo/rank\.py)", line (\d+)', ln)
                if frame:  # the demo's own line of code: what it waits in
                    code = linecache.getline(frame.group(1), int(frame.group(2))).strip()
                    if code:
                        out.append(f"    {code}")
            return out
    return []

