"""The demo's account of an incident: what was found, where it waits, what was done."""

from __future__ import annotations

import linecache
import os
import re
from typing import Any

from watchdog.states import PAST_DEADLINE


def incident_lines(inc: dict[str, Any], state_dir: str, t0_wall: float) -> list[str]:
    """The incident as the demo tells it, one line each; times from the demo's start."""
    out: list[str] = []
    out.append("")
    out.append(f"Incident {inc.get('id')} (from {state_dir}/incidents.jsonl)")
    out.append(f"  job {inc.get('job')} on {inc.get('host')}: verdict {inc.get('verdict')}, "
               f"{inc.get('seconds_without_progress', 0):.1f}s without progress, busiest "
               f"thread {inc.get('busiest_thread_cpu', 0):.0%} CPU")
    out.append(f"  reason: {inc.get('reason')}")
    named = culprit(inc)
    if named:
        out.append(f"  culprit: {named}")
    for r in inc.get("ranks", []):
        wait = r.get("seconds_in_wait")
        out.append(f"  rank {r.get('rank')} pid {r.get('pid')}: {r.get('state')}, phase "
                   f"{r.get('phase')}" + (f" in {r.get('op')} for {wait:.1f}s"
                                         if r.get("op") and wait else "")
                  + f", {r.get('collectives')} collectives")
    for rank, tail in sorted((inc.get("flight_recorder_tail") or {}).items()):
        if tail:
            ops = ", ".join(f"{c.get('op')} #{c.get('number')}" for c in tail[-3:])
            out.append(f"  flight recorder of rank {rank} (last 3): {ops}")
    evidence = inc.get("evidence") or []
    out.append(f"  evidence: {len(evidence)} file(s)")
    for path in evidence:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        out.append(f"    {os.path.relpath(path, state_dir)} ({size} bytes)")
    # The hung rank's own dump first: evidence is listed in the order it was captured.
    hung = [f"rank{r.get('rank')}-pid{r.get('pid')}-" for r in inc.get("ranks", [])
            if r.get("state") in PAST_DEADLINE]
    frames = stack_excerpt(sorted(evidence, key=lambda p: not any(
        os.path.basename(p).startswith(h) for h in hung)))
    if frames:
        out.append("  where the hung rank waits (its Python stack dump):")
        for frame in frames:
            out.append(f"    {frame}")
    out.append("  signals:")
    for sig in inc.get("signals", []):
        at = float(sig.get("time", t0_wall)) - t0_wall
        out.append(f"    [{at:4.1f}s] {sig.get('signal'):<7} to rank {sig.get('rank')} "
                   f"(pid {sig.get('pid')}): {sig.get('result')}")
    outcome = inc.get("outcome") or {}
    if outcome:
        out.append("  outcome: " + ", ".join(f"pid {p} {o}" for p, o in outcome.items()))
    if inc.get("wired_check"):
        out.append(f"  wired memory after the kill: {inc['wired_check']}")
    out.append(f"  reboot required: {inc.get('reboot_required') or 'no'}")
    out.append("")
    return out

def culprit(inc: dict[str, Any]) -> str:
    named = inc.get("culprit")
    if isinstance(named, dict):
        return (f"rank {named.get('rank')} pid {named.get('pid')}: "
                f"{named.get('reason')}")
    hung = [r for r in inc.get("ranks", []) if r.get("state") in PAST_DEADLINE]
    tails = inc.get("flight_recorder_tail") or {}
    described = []
    for r in hung:
        tail = tails.get(str(r.get("rank"))) or []
        last = f" after {tail[-1].get('op')} #{tail[-1].get('number')}" if tail else ""
        described.append(f"rank {r.get('rank')} pid {r.get('pid')}: {r.get('state')} in "
                         f"{r.get('op') or 'a wait'}{last}")
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

