"""A response's ladder as data: its steps, its edges, and what one response carries.

A response is a `Ladder` at a `Step`. `STEPS` is the ladder read in one place: for each
step, what it waits for, the signals its handler sends (steps.py, one handler a step, in
this order) and the steps it may go to, and why (`EDGES`). `Enforcer.advance`
(enforcer.py) is the one place a ladder's step is set, and it takes only those edges: a
handler returning any other is a bug: `advance` raises, and the response is closed
unfinished (journaled, thawed, never dropped). `[j]` in an edge's words marks a write of
the write-ahead journal (store/pending.py), the only ones there are.

Pure data: no clock, no signal, no file.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from watchdog.daemon.signaller import Target
from watchdog.states import End
from watchdog.status import Incident, SignalSent

# Seconds past the evidence timeout a capture may take to hand back its files (the
# prune, the copies): the time box from the verdict is the two together.
EVIDENCE_SLACK = 1.0


@dataclass(frozen=True)
class Outcome:
    """What one response to a hung job did, handed back to the daemon's loop."""

    incident: Incident  # as written to incidents.jsonl
    # pid -> how the ladder left it: KILLED, UNKILLABLE, EXITED, UNKNOWN, or what stopped
    # the ladder early (GONE, NOT_OURS, DENIED); empty when nothing was signalled
    # (observe mode, a hold)
    results: dict[int, End] = field(default_factory=dict)
    signals_sent: tuple[str, ...] = ()  # names of the signals that reached a rank
    held: str = ""  # not acted on: why (a rank of the job computes on another node)


class Step(enum.Enum):
    """Where a response's ladder stands (its value: what a log line says). Each step but
    the worker ones (`EVIDENCE`, `FRAMES`) and the two it starts at is a wait with a
    deadline, checked by `Enforcer.step` whenever it is called (each tick of the
    daemon's loop). What each waits for, sends and goes to is its row of `STEPS`."""

    BEGIN = "beginning"
    RESUME = "resuming"
    EVIDENCE = "gathering evidence"
    HOLD = "holding frozen"
    LEAVING = "leaving on its own error"
    TERM = "SIGTERM sent"
    KILL = "SIGKILL sent"
    FRAMES = "reading the native dumps"
    SETTLE = "settling"
    DONE = "done"


@dataclass(frozen=True)
class Rung:
    """One step of the ladder as its handler (steps.py) takes it: what it waits for
    before it acts, the signals it sends when it does, and where it goes, and why."""

    waits: str
    sends: tuple[str, ...]
    edges: dict[Step, str]


# The ladder, step by step.
STEPS: dict[Step, Rung] = {
    Step.BEGIN: Rung("nothing: taken at once, from a verdict (journaled, frozen, its "
                     "evidence under way)", ("SIGSTOP",), {
        Step.DONE: "observe mode: nothing is signalled, not even the dump signal; the "
                   "incident closed",
        Step.EVIDENCE: "[j] the verdict, before the first signal; SIGSTOP to every "
                       "target, [j] once sent; the stacks of frozen ranks on a worker",
    }),
    Step.RESUME: Rung("nothing: taken at once, from an earlier daemon's entry (resume.py)",
                      ("SIGCONT", "SIGTERM"), {
        Step.DONE: "it was closed, only its writes were missing (the incident line, the "
                   "flag); or no target is left to end and none was ended by us",
        Step.LEAVING: "as from HOLD: a target still ours and due goes down the rest of "
                      "the ladder, without evidence; one leaving on its own error first",
        Step.TERM: "as from HOLD: a target still ours and due goes down the rest of the "
                   "ladder (an interrupted SIGTERM must not leave it half-ended), "
                   "without evidence",
        Step.SETTLE: "as from a resumed KILL: no target is left to end, and one was "
                     "ended by us",
    }),
    Step.EVIDENCE: Rung("the dumps (a worker), or the time box from the verdict", (), {
        Step.HOLD: "with or without the dumps: the kill never waits past the time box",
    }),
    Step.HOLD: Rung("the moment the peers were told to end theirs (a fence's `term_at`)",
                    ("SIGTERM", "SIGCONT"), {
        Step.LEAVING: "[j] the round; a rank leaving on its own error gets the grace to "
                      "go, unsignalled",
        Step.TERM: "[j] the round; SIGTERM then SIGCONT to every target, back to back",
    }),
    Step.LEAVING: Rung("those leaving on their own error gone, or the grace",
                       ("SIGTERM", "SIGCONT"), {
        Step.TERM: "SIGTERM, SIGCONT to the rest; one gone meanwhile ended itself "
                   "(`exited`)",
    }),
    Step.TERM: Rung("every target gone, or the grace", ("SIGKILL",), {
        Step.KILL: "to those still there, if any, [j] the SIGTERMs and SIGCONTs, then "
                   "SIGKILL",
    }),
    Step.KILL: Rung("every target gone, or the kill timeout", (), {
        Step.FRAMES: "each target's outcome; the native dumps parsed on a worker, after "
                     "the kill, which must not wait on them",
        Step.SETTLE: "resumed, it has no dumps: settled as it ended something",
        Step.DONE: "resumed, it has no dumps, and ended nothing (or has no baseline)",
    }),
    Step.FRAMES: Rung("the parse (a worker), or the evidence time box", (), {
        Step.SETTLE: "[j] the outcome, before a settle of up to minutes",
        Step.DONE: "as SETTLE's end, without a wired baseline",
    }),
    Step.SETTLE: Rung("wired memory back, or the settle time", (), {
        Step.DONE: "the reboot flag if one is called for",
    }),
}
# The edge table: from each step, each step it may go to, and why.
EDGES: dict[Step, dict[Step, str]] = {step: rung.edges for step, rung in STEPS.items()}
# From any step, its loop giving up on it (`Enforcer.close_unfinished`): DONE, closed
# with what is known (thawed: SIGCONT to the frozen; every outcome not known `unknown`).
# DONE itself is reached through the close: [j] closed, then the incident line and the
# flag, each written or held in the backlog.
GIVE_UP = Step.DONE


def may_go(source: Step, to: Step, unfinished: bool = False) -> bool:
    """The edge from `source` to `to` is in the table (`unfinished`: given up on)."""
    return to is GIVE_UP if unfinished else to in EDGES.get(source, {})


@dataclass(frozen=True)
class Asked:
    """What `Enforcer.begin` was asked, for its BEGIN step: the stack dumps taken (a
    fenced job's are not), when the verdict was (monotonic; None: when the step is
    taken), and the evidence done by (monotonic: a fence's window)."""

    gather: bool = True
    verdict_at: float | None = None
    evidence_by: float | None = None


@dataclass
class Round:
    """Where each target stands in the teardown: teardown.py's state, written by it
    alone (each list in the targets' order, which the signals keep)."""

    frozen: list[Target] = field(default_factory=list)  # SIGSTOPped, not yet SIGTERMed
    ending: list[Target] = field(default_factory=list)  # leaving on their own error
    live: list[Target] = field(default_factory=list)  # down the signal ladder
    left: list[Target] = field(default_factory=list)  # not known to be gone yet


@dataclass(eq=False)
class Ladder:
    """One response to a hung job under way: what it has done and the step it is at.

    Made by `Enforcer.begin` (a verdict) or `Enforcer.resume` (an earlier daemon's
    unfinished response), advanced by `Enforcer.step` until it hands back its
    `Outcome`. Only the daemon's loop thread touches it; its worker steps run a
    `Future` and read nothing else of it. What it was given (the first four, `resumed`
    and `asked`) is never changed; what it has done is `incident`, `sent`, `outcome`,
    the teardown's `round` and, once closed, `result`; the step it is at, `step` and
    the deadline and worker of its wait (`until`, `next_probe`, `work`), and `term_at`.
    """

    incident: Incident
    targets: list[Target]
    baseline: int | None
    others_live: Callable[[], bool]
    step: Step = Step.BEGIN  # set by `Enforcer.advance` alone
    until: float = 0.0  # monotonic deadline of the current wait (or worker step)
    work: Future[Any] | None = None  # the current worker step's
    resumed: bool = False  # an earlier daemon's: no evidence, settled only after a kill
    sent: list[SignalSent] = field(default_factory=list)
    outcome: dict[int, End] = field(default_factory=dict)
    round: Round = field(default_factory=Round)
    next_probe: float = 0.0  # of wired memory, while settling
    result: Outcome | None = None
    term_at: float = 0.0  # monotonic: no SIGTERM before (the moment the peers were told)
    asked: Asked = Asked()
    # Wired memory live processes held with the node at rest (None: not read): the
    # settle takes off only what they locked since (wired.py), never the node's own.
    held_before: int | None = None

    @property
    def working(self) -> bool:
        """A worker step is under way (what may get stuck: a sampler, a filesystem)."""
        return self.work is not None and not self.work.done()
