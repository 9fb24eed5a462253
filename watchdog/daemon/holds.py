"""A slow peer is not a hang: due ranks of a job that has a rank still computing, still
making progress, or busy in a wait of its own they wait for (a checkpoint being written:
judge/ownwait.py) are held instead of acted on."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.judge.detector import hold_reason
from watchdog.daemon.ranks import Edge, Rank, transition
from watchdog.states import FINAL

log = logging.getLogger(__name__)

Jobs = dict[tuple[int, str], list[Rank]]  # (uid, job) -> its due ranks


def hold(due: Jobs, ranks: Iterable[Rank], rules: Rules, now: float) -> Jobs:
    """The due ranks to act on; the others are held (state `suspect`, with why). Each one
    kept is escalated by the caller, with the wait it is acted on for (ranks.py)."""
    table = list(ranks)
    kept: Jobs = {}
    for (uid, job), found in due.items():
        for rank in found:
            rec = rank.record
            assert rank.verdict is not None
            if rank.held_until > now:  # a peer node said a rank of the job computes
                transition(rank, Edge.HELD, now, rank.held_reason)
                continue
            # Only ranks of the same owner may speak for the job (a job is its owner's).
            mates = [(r.record.rank, r.verdict) for r in table
                     if r.record.job == job and r.record.uid == rec.uid
                     and r.state not in FINAL and r.verdict is not None]
            why = hold_reason(rank.verdict, mates, rules, rec.rank)
            if why:
                if rank.hold_note != why:  # logged once per change, not every scan
                    log.info("job %s rank %s: %s; %s", job, rec.rank, rank.verdict.reason, why)
                transition(rank, Edge.HELD, now, f"{rank.verdict.reason}; {why}", note=why)
                continue
            kept.setdefault((uid, job), []).append(rank)  # escalated: loop._escalate
    return kept
