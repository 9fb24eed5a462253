"""exo's teardown timing (docs/exo.md): which node of an exo job ends its runner first
and how much later every other node does, each adding its delay to the moment the fence
names (its hold grows by as much). Imports nothing from the project (the enforcer, the
responses and the fences read it)."""

from __future__ import annotations

# exo (b5375f8) notices a runner's end at its supervisor's next 5 s poll and marks it
# RunnerFailed; the other node then shuts its runner down and gives it 3 s to answer
# (`fail_after(3)`), after which it drops it unmarked. Both runners of an instance failed
# make each node shut its new runner down 0.1 s after starting it, and one not up within
# those 3 s leaves its id failed: exo loops on CreateRunner / Shutdown until it deletes
# the instance. One node's first, the others' after exo gave theirs up (5 + 3 s and a
# margin): only the first is failed. Less is not enough whatever the two supervisors' poll phases
# (set by when each node created its runner, seconds apart after a recovery).
EXO_STAGGER = 9.0


def peer_delay(job: str) -> float:
    """Seconds a second node's SIGTERMs come after the first's, for `job` (exo's:
    EXO_STAGGER; 0: one moment for every rank)."""
    return EXO_STAGGER if job.startswith("exo-") else 0.0


def delay_here(job: str, here: str, culprit_host: str | None, origin: str) -> float:
    """Seconds this node's SIGTERMs for `job` come after the moment the origin named:
    none on the node that goes first, EXO_STAGGER on every other (an exo job's; 0 for
    the rest). First is the culprit's node when a rank is named, else the origin: a
    frozen runner's node may be unable to give its runner up (exo's worker waits without
    bound for a task's acknowledgement from it), so its runner is the one exo reports
    failed, and every other node's worker, free, gives its own up first (docs/exo.md)."""
    first = culprit_host or origin
    return 0.0 if here == first else peer_delay(job)
