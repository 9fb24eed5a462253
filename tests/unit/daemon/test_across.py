"""A job whose ranks sit one per node, judged by a daemon from its rank and the peers'
published figures (daemon/judge/across.py, daemon/paces.py's `_job_across`): pure."""

from __future__ import annotations

from watchdog.daemon.judge.across import SUSTAIN, Across
from watchdog.daemon.paces import _job_across
from watchdog.status import NodeAnswer, NodeStatus, RankStatus


def rank(n: int, wait: float, **fields: object) -> RankStatus:
    shown: dict = {"job": "j", "uid": 0, "rank": n, "world_size": 2, "host": f"h{n}",
                   "pid": 100 + n, "state": "running", "wait_share": wait, "pace": 3.0,
                   "run_queue": 0.0, "active_share": 1.0, "pace_unjudged": "alone",
                   "pace_why": ""}
    return RankStatus(**{**shown, **fields})


def test_a_slow_rank_is_named_once_clear_for_the_sustain_then_cleared():
    across = Across()
    slow = [rank(0, 0.6), rank(1, 0.05, pace_why="run queue 40% (CPU contention)")]
    first = across.judge("k", "j", 0, slow, 100.0)
    assert first.straggler is None and first.forming  # clear, not named yet
    assert first.scores[("h1", 101)] < 0.5 and first.scores[("h0", 100)] == 1.0
    named = across.judge("k", "j", 0, slow, 100.0 + SUSTAIN).straggler
    assert named is not None and (named.rank, named.host, named.pid) == (1, "h1", 101)
    assert named.slowdown is not None and named.slowdown >= 2.0
    assert named.summary.startswith("rank 1 on h1 is the straggler: the others wait 55%")
    assert named.why == "run queue 40% (CPU contention)"
    # Under the naming threshold but over the clearing one: still named (hysteresis).
    held = across.judge("k", "j", 0, [rank(0, 0.2), rank(1, 0.05)], 120.0)
    assert held.straggler is not None
    assert across.judge("k", "j", 0, [rank(0, 0.12), rank(1, 0.05)], 121.0).straggler is None
    # Cleared: naming again takes the sustain anew.
    assert across.judge("k", "j", 0, slow, 122.0).straggler is None


def test_a_healthy_job_or_a_brief_straggler_is_never_named():
    across = Across()
    for t in range(30):  # ordinary imbalance: 5% more waiting on one side
        assert across.judge("k", "j", 0, [rank(0, 0.15), rank(1, 0.10)], float(t)).straggler \
            is None
    assert across.judge("k", "j", 0, [rank(0, 0.6), rank(1, 0.05)], 40.0).forming
    assert across.judge("k", "j", 0, [rank(0, 0.1), rank(1, 0.1)], 41.0).straggler is None
    assert across.judge("k", "j", 0, [rank(0, 0.6), rank(1, 0.05)], 42.0).straggler is None
    # A rank its node does not judge yet: no score for anyone, no name.
    early = across.judge("k", "j", 0, [rank(0, 0.6), rank(1, 0.05,
                                                     pace_unjudged="too_few_seconds")], 99.0)
    assert early.scores == {} and early.straggler is None


def test_a_job_is_judged_only_with_every_rank_reported():
    mine = rank(0, 0.6)

    def answer(*ranks: RankStatus, ok: bool = True) -> list[NodeAnswer]:
        return [NodeAnswer("h1:9753", ok, NodeStatus(host="h1", ranks=ranks) if ok else None,
                           None if ok else "timed out")]
    assert "not asked" in str(_job_across(mine, 0, "j", None))
    assert "no answer from h1:9753" in str(_job_across(mine, 0, "j", answer(ok=False)))
    assert "1 of its 2 ranks" in str(_job_across(mine, 0, "j", answer()))
    # Another owner's rank naming the job id is not its rank; an ended one is gone.
    assert "1 of its 2" in str(_job_across(mine, 0, "j", answer(rank(1, 0.1, uid=7))))
    assert "1 of its 2" in str(_job_across(mine, 0, "j", answer(rank(1, 0.1, state="killed"))))
    # A node listed twice (or this node among its peers): each rank once.
    twice = answer(rank(1, 0.1)) + answer(rank(1, 0.1), mine)
    got = _job_across(mine, 0, "j", twice)
    assert isinstance(got, list) and [r.rank for r in got] == [0, 1]


def test_a_name_outlives_a_gap_in_the_figures_for_its_hold_only():
    """A rank counting a few seconds short, or one late answer, must not drop the series
    the alert's `for: 10m` waits on; a gap longer than the hold does."""
    across = Across(sustain=0.0, hold=30.0)
    slow = [rank(0, 0.6), rank(1, 0.05)]
    assert across.judge("k", "j", 0, slow, 0.0).straggler is not None
    unripe = [rank(0, 0.6), rank(1, 0.05, pace_unjudged="too_few_seconds")]
    gap = across.judge("k", "j", 0, unripe, 10.0).straggler
    assert gap is not None and gap.rank == 1
    assert across.held("k", 29.0) is not None  # the job not judged at all (a peer late)
    assert across.judge("k", "j", 0, slow, 29.5).straggler is not None  # confirmed again
    assert across.held("k", 59.0) is not None and across.held("k", 60.0) is None
    # Cleared by a judgement under the clearing slowdown: no hold then.
    assert across.judge("k", "j", 0, slow, 61.0).straggler is not None
    assert across.judge("k", "j", 0, [rank(0, 0.1), rank(1, 0.1)], 62.0).straggler is None
    assert across.held("k", 63.0) is None
