"""One rank as users see it (`status.RankStatus`: an object of `status --json` and `/status`),
built from its record, the detector's verdict and what else the scan found of it (`Shown`)."""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.daemon.judge.detector import Verdict
from watchdog.daemon.judge.pacing import Pace
from watchdog.daemon.judge.sighting import Sockets
from watchdog.record import Record
from watchdog.states import Phase, State
from watchdog.status import Expect, LastCollective, RankStatus


@dataclass
class Shown:
    """What one rank shows beside its lifecycle, as the last scan found it; shown (in
    /status, the metrics and the incident), never judged by."""

    # Its peers' data path as last probed while it waited long (probes/datalink.py).
    data_link: str | None = None
    # While its sockets are tracked (probes/stacksampler.py), as the scan saw them
    # (judge/sighting.py), published for a peer's wedge (judge/wedge.py).
    sockets: Sockets | None = None
    # Its last minute's figures and its score against the job's other ranks
    # (judge/stragglers.py); why it is slow; why it is not judged, in words and as a code.
    pace: Pace | None = None
    pace_score: float | None = None
    pace_why: str | None = None
    pace_note: str | None = None
    pace_unjudged: str | None = None


def current_op(record: Record) -> str:
    """What the rank waits on: the blocking call, and the last collective issued."""
    if record.phase not in (Phase.WAIT, Phase.INIT):
        return ""
    last = record.flight[-1] if record.flight else None
    if record.phase == Phase.INIT or last is None:
        return record.op
    return f"{record.op} ({last.op} #{last.number})"


NOTHING = Shown()  # a rank nothing was found of yet (never written)


def rank_status(record: Record, state: State, verdict: Verdict | None,
                shown: Shown = NOTHING, *, reason: str = "", attempt: int | None = None,
                cause: str | None = None) -> RankStatus:
    """The rank as the daemon shows it: its record, state and verdict (its `reason` said
    instead of the verdict's when given), what else the scan found of it (`shown`), the
    launch it belongs to (`attempt`) and the cause of the incident acting on it."""
    sockets, pace = shown.sockets, shown.pace
    return RankStatus(
        pid=record.pid, host=record.host, job=record.job, uid=record.uid, rank=record.rank,
        world_size=record.world_size, attempt=attempt, backend=record.backend,
        state=state.value, phase=record.phase.label, progress=record.waits_completed,
        collectives=record.collectives, steps=record.steps,
        seconds_since_progress=round(verdict.seconds_since_progress, 3) if verdict else None,
        seconds_in_wait=round(verdict.seconds_in_wait, 3) if verdict else None,
        deadline_seconds=round(verdict.deadline, 3) if verdict else None,
        busiest_thread_cpu=round(verdict.busiest_cpu, 3) if verdict else None,
        computing=verdict.computing if verdict else None,
        current_op=current_op(record),
        last_collective=(LastCollective(record.flight[-1].number, record.flight[-1].op,
                                    record.flight[-1].nbytes) if record.flight else None),
        expect=(Expect(record.expect_seconds, record.expect_reason)
                if record.expect_seconds > 0 else None),
        reason=reason or (verdict.reason if verdict else ""),
        source="daemon", data_link=shown.data_link, cause=cause,
        frames=(verdict.seen or None) if verdict else None,
        frames_kind=(verdict.seen_kind or None) if verdict else None,
        quiet_seconds=round(sockets.still, 3) if sockets else None,
        unread_bytes=sockets.unread if sockets else None,
        quiet_exact=sockets.exact if sockets else None,
        holding=(verdict.own.holding() or None) if verdict and verdict.own else None,
        wait_share=round(pace.wait_share, 3) if pace and pace.wait_known else None,
        pace=round(pace.pace, 3) if pace else None,
        pace_score=round(shown.pace_score, 3) if shown.pace_score is not None else None,
        run_queue=round(pace.run_queue, 3) if pace else None, pace_why=shown.pace_why,
        active_share=round(pace.active, 3) if pace else None,
        pace_note=shown.pace_note, pace_unjudged=shown.pace_unjudged,
        tracer_pid=(verdict.tracer or None) if verdict else None,
        tracer=(verdict.tracer_name or None) if verdict and verdict.tracer else None,
        since_traced=(round(verdict.since_traced, 3)
                      if verdict and verdict.since_traced is not None else None),
        awaiting=verdict.awaiting if verdict else None,
        waits_behind=(verdict.behind or None) if verdict else None)
