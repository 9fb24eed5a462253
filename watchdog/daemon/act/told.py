"""A response as the log tells it: the verdict's line (naming its incident) and, once
the response is done, one line saying how it ended: what became of each rank, how long
it took, wired memory, and the incident to read. Pure: an `Incident` in, words out.

The levels follow who must act: ERROR for a node flagged for reboot (a rank survived
SIGKILL, wired memory leaked) and for the verdict itself; WARNING for an end that needs
a look (a rank that could not be identified or signalled); INFO for the rest, an
observed hang included (the verdict's line said it at ERROR already).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from watchdog.cause import REFUSED
from watchdog.daemon.signaller import Result
from watchdog.states import End, Fenced
from watchdog.status import ABSENT, FenceSent, Incident

# What became of a rank, as a person reads it (the signaller's words are a program's).
BECAME: dict[str, str] = {
    End.KILLED: "ended",
    End.EXITED: "ended on its own error (not signalled)",
    End.GONE: "gone before a signal reached it",
    End.NOT_OURS: "left alone (its pid is another process now)",
    End.DENIED: "left alone (signalling it was denied)",
    End.UNKNOWN: "not known to be ended (it could not be identified; judged again)",
    End.UNKILLABLE: "survived SIGKILL",
}
NEEDS_A_LOOK = (End.DENIED, End.UNKNOWN)


# What became of several ranks: BECAME's words in the plural.
_PLURAL = (("reached it", "reached them"), ("on its own error", "on their own errors"),
           ("its pid is another process", "their pids are other processes"),
           ("signalling it was", "signalling them was"), ("it could not be", "they could not be"))


def _agreed(became: str, count: int) -> str:
    """`ranks 0, 1 gone before a signal reached them`, not `... reached it`."""
    if count > 1:
        for one, many in _PLURAL:
            became = became.replace(one, many)
    return became


def ranks_words(numbers: Iterable[int | None]) -> str:
    """`rank 0`, `ranks 0, 1` (a rank without a number shown as `?`: never a repr)."""
    given = list(numbers)
    words = [str(n) for n in sorted(n for n in given if n is not None)]
    words += ["?"] * given.count(None)
    return f"rank{'s' if len(words) != 1 else ''} {', '.join(words)}"


def size(n: int) -> str:
    """Bytes as a person reads them: `1.5 GiB`, `312 MiB`."""
    return f"{n / 2**30:.1f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


def verdict_line(incident: Incident, ending: bool, ranks: Iterable[int | None]) -> str:
    """The verdict, once it is known it will not hold: its incident, what is found and
    what is done about it."""
    doing = "ending" if ending else "observing (mode observe: nothing is signalled)"
    return (f"incident {incident.id}, job {incident.job}: {incident.reason}; {doing} "
            f"{ranks_words(ranks)}; cause {incident.cause}: {incident.summary}")


def _wired(incident: Incident) -> str:
    check = incident.wired_check
    after = None if incident.wired_after is ABSENT else incident.wired_after
    baseline = None if incident.wired_baseline is ABSENT else incident.wired_baseline
    if check == "returned" and after is not None and baseline is not None:
        return f"wired memory back ({size(after)}, baseline {size(baseline)})"
    if check == "leaked" and after is not None and baseline is not None:
        return f"wired memory stayed {size(after - baseline)} above the baseline"
    if check == "held by live processes" and after is not None and baseline is not None:
        return (f"wired memory {size(after - baseline)} above the baseline, held by live "
                "processes (theirs, not a leak)")
    if check and check.startswith("skipped"):
        return "wired memory not judged (other ranks are live)"
    if check == "probe failed":
        return "wired memory unknown (its probe failed)"
    return "wired memory not judged (no baseline yet)"


def end_line(incident: Incident) -> tuple[int, str]:
    """How a response ended, one line, and its level."""
    head = f"incident {incident.id}, job {incident.job}"
    took = (f" in {max(0.0, incident.closed_at - incident.time):.1f}s"
            if incident.closed_at is not None and incident.time else "")
    read = "; read it: mlx-watchdog incidents"
    if incident.action and incident.action.startswith("observed"):
        return logging.INFO, (f"{head}: observed{took}, nothing signalled (mode observe); "
                              f"{ranks_words(r.rank for r in incident.ranks)} left as they "
                              f"are{read}")
    number = {r.pid: r.rank for r in incident.ranks if r.pid is not None}
    last: dict[int | None, str] = {}  # pid -> the last ending signal that reached it
    for s in incident.signals or ():
        if s.result == Result.SENT and s.signal in ("SIGTERM", "SIGKILL"):
            last[s.pid] = s.signal
    said: dict[str, list[int | None]] = {}  # what became of them -> their ranks
    results = set()
    for text, result in (incident.outcome or {}).items():
        pid = int(text) if text.isdigit() else None
        results.add(result)
        became = BECAME.get(result, result)
        if result == End.KILLED and pid in last:
            became += f" by {last[pid]}"
        said.setdefault(became, []).append(number.get(pid) if pid is not None else None)
    parts = [f"{ranks_words(ranks)} {_agreed(became, len(ranks))}" for became, ranks in
             sorted(said.items(), key=lambda item: not item[0].startswith("ended by"))]
    what = "; ".join(parts) or "nothing to end"
    fenced = incident.verdict in tuple(Fenced)
    line = f"{head}: {what}{took}{' (fenced)' if fenced else ''}"
    if results & {End.KILLED, End.UNKILLABLE}:
        line += f"; {_wired(incident)}"
    level = logging.INFO
    if incident.reboot_required:
        line += f"; NODE FLAGGED FOR REBOOT: {incident.reboot_required}"
        level = logging.ERROR
    elif results & set(NEEDS_A_LOOK):
        level = logging.WARNING
    if incident.evidence_error:
        line += f"; evidence: {incident.evidence_error}"
    return level, line + read


def fence_missed(sent: FenceSent) -> str:
    """Why a peer did not take a fence, in words (an incident's `freeze`, the log):
    `10.0.0.2:9753 answers but refuses this node's secret (bad signature)`."""
    answer = sent.answer
    if answer is None:
        return f"{sent.peer} did not answer the fence ({sent.error})"
    if answer.error == "bad signature":
        return f"{sent.peer} {REFUSED}"
    return f"{sent.peer} refused the fence ({answer.error})"


def fence_line(job: str, uid: int, reason: str, answers: Iterable[FenceSent]
               ) -> tuple[int, str]:
    """A fence sent, and what each peer answered, in one line; WARNING when a peer did
    not get it (its ranks of the job are then ended by its own verdict, later)."""
    said, missed = [], False
    for sent in answers:
        answer = sent.answer
        if answer is None or answer.error:
            said.append(fence_missed(sent))
            missed = True
        elif answer.ending:
            pids = sorted(answer.ending)
            said.append(f"{sent.peer} ends {len(pids)} rank{'s' if len(pids) != 1 else ''} "
                        f"(pid{'s' if len(pids) != 1 else ''} {', '.join(map(str, pids))})")
        else:
            said.append(f"{sent.peer} has no rank of it left to end")
    line = f"fenced job {job} of uid {uid} ({reason}): {'; '.join(said) or 'no peer'}"
    if missed:
        line += "; a peer that did not take it ends its ranks on its own verdict"
    return (logging.WARNING if missed else logging.INFO), line
