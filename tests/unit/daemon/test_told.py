"""Issue 38, item 4: the log tells how each response ended, in one line a person reads
(what became of each rank, how long it took, wired memory, the incident to read), the
verdict's line names its incident, and a fence is said in words, never a repr."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from watchdog.daemon.act.told import (
    end_line,
    fence_line,
    fence_missed,
    ranks_words,
    verdict_line,
)
from watchdog.status import FenceAnswer, FenceSent, Incident, IncidentRank, SignalSent

INC = Incident(id="20261203-103000-ab12", time=1000.0, job="j1", verdict="stalled",
               mode="enforce", reason="in all_sum for 31.0s, past the 30s deadline",
               cause="peer_stopped", summary="rank 1 on mac-2 (pid 12) is stopped",
               ranks=(IncidentRank(pid=11, rank=0), IncidentRank(pid=12, rank=1)),
               pids=(11, 12))


def sent(pid: int, name: str, result: str = "sent") -> SignalSent:
    return SignalSent(pid=pid, rank=pid - 11, signal=name, time=1001.0, result=result)


def ended(**fields: object) -> Incident:
    base = replace(INC, action="ended", closed_at=1004.25, outcome={"11": "killed",
                                                                    "12": "killed"},
                   signals=(sent(11, "SIGCONT"), sent(12, "SIGCONT"), sent(11, "SIGTERM"),
                            sent(12, "SIGTERM")),
                   wired_baseline=2 << 30, wired_after=(2 << 30) + (5 << 20),
                   wired_check="returned", reboot_required=False)
    return replace(base, **fields)


def test_the_verdict_line_names_its_incident_and_the_ranks_in_words():
    assert verdict_line(INC, True, [1, 0]) == (
        "incident 20261203-103000-ab12, job j1: in all_sum for 31.0s, past the 30s deadline; "
        "ending ranks 0, 1; cause peer_stopped: rank 1 on mac-2 (pid 12) is stopped")
    assert "; observing (mode observe: nothing is signalled) rank 0;" in verdict_line(
        INC, False, [0])
    assert ranks_words([None]) == "rank ?" and ranks_words([]) == "ranks "


def test_a_job_ended_by_sigterm_is_one_line_with_time_and_wired_memory():
    level, line = end_line(ended())
    assert level == logging.INFO
    assert line == ("incident 20261203-103000-ab12, job j1: ranks 0, 1 ended by SIGTERM in "
                    "4.2s; wired memory back (2.0 GiB, baseline 2.0 GiB); read it: "
                    "mlx-watchdog incidents")


def test_a_survivor_of_sigkill_flags_the_node_and_is_an_error():
    incident = ended(outcome={"11": "killed", "12": "unkillable"},
                     signals=(*ended().signals, sent(12, "SIGKILL")),
                     reboot_required="pids [12] survived SIGKILL for 10s")
    level, line = end_line(incident)
    assert level == logging.ERROR
    assert "rank 0 ended by SIGTERM; rank 1 survived SIGKILL in 4.2s" in line
    assert "NODE FLAGGED FOR REBOOT: pids [12] survived SIGKILL for 10s" in line
    leaked = ended(wired_after=(3 << 30), wired_check="leaked",
                   reboot_required="wired memory stayed above the baseline after the kill")
    level, line = end_line(leaked)
    assert level == logging.ERROR and "wired memory stayed 1.0 GiB above the baseline" in line


def test_an_end_that_needs_no_person_is_never_a_warning():
    # Gone on its own before any signal, or ending on its own error: nothing to do.
    level, line = end_line(ended(outcome={"11": "exited", "12": "gone"}, signals=()))
    assert level == logging.INFO
    assert "rank 0 ended on its own error (not signalled); rank 1 gone before a signal" \
        in line and "wired memory" not in line
    level, line = end_line(ended(outcome={"11": "unknown", "12": "killed"}))
    assert level == logging.WARNING and "rank 0 not known to be ended" in line
    level, line = end_line(replace(INC, action="observed (mode observe: nothing signalled)",
                                   closed_at=1000.5, outcome={}))
    assert level == logging.INFO and line.startswith(
        "incident 20261203-103000-ab12, job j1: observed in 0.5s, nothing signalled (mode "
        "observe); ranks 0, 1 left as they are")
    level, line = end_line(ended(verdict="fenced", outcome={"11": "killed"}))
    assert "rank 0 ended by SIGTERM in 4.2s (fenced)" in line


def test_a_fence_is_one_line_in_words_and_a_warning_only_when_a_peer_missed_it():
    answers = [FenceSent("mac-1:9753", FenceAnswer(job="j1", uid=501, ending=())),
               FenceSent("mac-2:9753", FenceAnswer(job="j1", uid=501, ending=(12,)))]
    level, line = fence_line("j1", 501, "stalled: in all_sum", answers)
    assert level == logging.INFO
    assert line == ("fenced job j1 of uid 501 (stalled: in all_sum): mac-1:9753 has no rank "
                    "of it left to end; mac-2:9753 ends 1 rank (pid 12)")
    level, line = fence_line("j1", 501, "why", [
        *answers, FenceSent("mac-3:9753", error="timed out"),
        FenceSent("mac-4:9753", FenceAnswer(error="bad signature"))])
    assert level == logging.WARNING
    assert ("mac-3:9753 did not answer the fence (timed out); mac-4:9753 answers but "
            "refuses this node's secret (bad signature)") in line
    assert "{" not in line and "FenceSent" not in line
    # The incident's `freeze` says it in the same words, never a dict's repr.
    assert fence_missed(FenceSent("mac-5:9753", FenceAnswer(error="fences are off"))) == \
        "mac-5:9753 refused the fence (fences are off)"


class Recording:
    """An executor that records what would be sent and runs nothing."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, ...]] = []

    def submit(self, fn, *args):
        from concurrent.futures import Future

        self.sent.append(args)
        return Future()


def test_a_rank_exiting_of_a_fence_this_node_sent_is_not_fenced_again(tmp_path, monkeypatch):
    """Issue 38, item 4: rank 0 ending on the error its job's fence caused was fenced a
    second time (every peer logged it again); a relaunch's rank that dies is fenced."""
    import threading

    from watchdog.daemon.act.peers import Peers
    from watchdog.daemon.config import Settings
    from watchdog.daemon.fences import Fences
    from watchdog.daemon.lifecycle import Rank
    from watchdog.daemon.table import Death
    from watchdog.record import Record
    from watchdog.states import Phase

    settings = Settings(state_dir=str(tmp_path), peers=("mac-2:9753",), secret="s" * 24)
    from watchdog.net import fence

    sent: list[tuple[object, ...]] = []
    monkeypatch.setattr(fence, "send", lambda *args: sent.append(args) or [])
    peers = Peers(settings, "mac-1", Recording(), started=0.0)  # type: ignore[arg-type]
    fences = Fences(settings, "mac-1", peers, None, threading.RLock(),  # type: ignore[arg-type]
                    threading.Event())
    peers.fence(501, "j1", "stalled: in all_sum", None)  # the verdict's fence
    assert len(sent) == 1 and peers.fenced_since(501, "j1") is not None

    def death(start_time: float) -> Death:
        rec = Record(pid=11, start_time=start_time, uid=501, rank=0, world_size=2,
                     dump_signal=0, status=0, host="mac-1", job="j1", backend="ring", seq=0,
                     collectives=0, waits_entered=0, waits_completed=0, steps=0,
                     phase=Phase.RUNNING, op="", phase_since_ns=0, wait_since_ns=0,
                     last_progress_ns=0, last_wait_ns=0, max_wait_ns=0, expect_seconds=0.0,
                     expect_since_ns=0, expect_reason="", flight=())
        return Death(Rank("/d/11.rec", rec), "exited on an uncaught exception", frozenset())

    fences.died(death(start_time=1.0), now=5.0)  # one of the job fenced: no news
    assert len(sent) == 1
    fences.died(death(start_time=time.time() + 60), now=6.0)  # a relaunch's rank
    assert len(sent) == 2


def test_what_became_of_several_ranks_is_said_in_the_plural():
    """Issue 49, item 10: `ranks 0, 1 gone before a signal reached them`, not `it`."""
    level, line = end_line(ended(outcome={"11": "gone", "12": "gone"}, signals=()))
    assert "ranks 0, 1 gone before a signal reached them in 4.2s" in line, line
    level, line = end_line(ended(outcome={"11": "exited", "12": "exited"}, signals=()))
    assert "ranks 0, 1 ended on their own errors (not signalled)" in line, line
