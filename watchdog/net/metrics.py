"""Prometheus metrics: the collector, and the table of every family it exports.

`SnapshotCollector` builds every family from the daemon's latest snapshot on
each scrape, so ranks that go away disappear; nothing is registered at import
time. What it exports is `FAMILIES`, walked in order: each row names a family,
gives its help and type and labels, and reads its samples off the scrape (the
snapshot, and its ranks one per label pair). A new metric is one new row; a value
the snapshot does not carry yet is also a field of `NodeStatus` (watchdog/status/node.py) that
the daemon's publish fills. The HTTP endpoint that serves `/metrics` is http.py.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from watchdog.cause import CAUSES, Cause
from watchdog.states import ENDED, Mode, State
from watchdog.status import NodeStatus, RankStatus, split_job_key, stall_key
from watchdog.text import printable

PREFIX = "mlx_watchdog_"
Snapshot = Callable[[], NodeStatus]

# The MLX job's label. Not `job`: that one (and `instance`) is the scrape target's, and an
# exporter that sets it forces `honor_labels` on every scrape config. `job_label = "job"`
# in the config keeps the old name for one release (docs/operations.md, Upgrading).
JOB_LABEL = "mlx_job"
MODES = tuple(m.value for m in Mode)


def _uid(r: RankStatus) -> str:
    return "" if r.uid is None else str(r.uid)


def _one_per_label(ranks: tuple[RankStatus, ...]) -> list[RankStatus]:
    """One rank per (job, uid, rank) labels: a relaunch within the retention (same
    hostfile, same job id) must not emit duplicate series. Prefer an unkillable
    rank, then a live one, then an ended one; of two alike, the later attempt of a job
    `mlx-watchdog launch` relaunched. The owner is in the labels: job ids are anyone's
    to name, and another user's rank naming the job never stands for its owner's."""
    def weight(r: RankStatus) -> tuple[int, int]:
        return (2 if r.state == State.UNKILLABLE else 0 if r.state in ENDED else 1,
                r.attempt or 0)

    best: dict[tuple[str, str, str], RankStatus] = {}
    for r in ranks:
        key = (str(r.job), _uid(r), str(r.rank))
        if key not in best or weight(r) > weight(best[key]):
            best[key] = r
    return list(best.values())


# -- the table's parts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Scrape:
    """What one scrape reads: the snapshot, and its ranks one per (job, uid, rank)."""

    snap: NodeStatus
    ranks: list[RankStatus]


Samples = Iterable[tuple[tuple[str, ...], float]]  # (label values, value) of each series
JOB = "{job}"  # in a row's labels: the MLX job's label, as configured (`job_label`)
RANK = (JOB, "uid", "rank")  # a rank's own series: its job, its owner, its rank
GAUGE = GaugeMetricFamily
COUNTER = CounterMetricFamily


@dataclass(frozen=True)
class Family:
    """A gauge or a counter: its name after `PREFIX` (a counter's without `_total`),
    help, type and labels, and its samples read off the scrape (None: not exported
    on this scrape; an empty iterable: the family, with no series)."""

    name: str
    help: str
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily]
    labels: tuple[str, ...]
    samples: Callable[[Scrape], Samples | None]

    def build(self, scrape: Scrape, job_label: str) -> Metric | None:
        """The family with this scrape's samples, None when the snapshot has no value."""
        samples = self.samples(scrape)
        if samples is None:
            return None
        family = self.kind(PREFIX + self.name, self.help,
                           labels=[job_label if label == JOB else label
                                   for label in self.labels])
        for values, value in samples:  # label values are users' words: escaped
            family.add_metric([printable(v) for v in values], value)
        return family


@dataclass(frozen=True)
class Histogram:
    """A histogram: its cumulative buckets (bound, count) and sum read off the scrape
    (None: not exported on this scrape)."""

    name: str
    help: str
    buckets: Callable[[Scrape], tuple[list[tuple[str, float]], float] | None]

    def build(self, scrape: Scrape, job_label: str) -> Metric | None:
        """The histogram from this scrape's buckets, None when the snapshot has none."""
        read = self.buckets(scrape)
        if read is None:
            return None
        buckets, total = read
        return HistogramMetricFamily(PREFIX + self.name, self.help, buckets=buckets,
                                     sum_value=total)


def per_rank(field: str) -> Callable[[Scrape], Samples]:
    """Each rank's `field` (of `RankStatus`); a rank without a value has no series."""
    def samples(scrape: Scrape) -> Samples:
        for r in scrape.ranks:
            value = getattr(r, field)
            if value is not None:
                yield (str(r.job), _uid(r), str(r.rank)), float(value)
    return samples


def counts(read: Callable[[NodeStatus], Mapping[str, int]]) -> Callable[[Scrape], Samples]:
    """One series per key of a count the snapshot keeps (its one label: the key)."""
    return lambda scrape: (((key,), n) for key, n in read(scrape.snap).items())


def scalar(read: Callable[[NodeStatus], float | None]) -> Callable[[Scrape], Samples | None]:
    """One unlabelled series; none (the family left out) while `read` gives None."""
    def samples(scrape: Scrape) -> Samples | None:
        value = read(scrape.snap)
        return None if value is None else [((), value)]
    return samples


# -- the families whose samples take more than a field -------------------------------------


def _rank_states(scrape: Scrape) -> Samples:
    """One series per rank and state, 1 for the rank's current one."""
    for r in scrape.ranks:
        for s in State:
            yield (str(r.job), _uid(r), str(r.rank), s.value), \
                1.0 if r.state == s.value else 0.0


def _stalls(scrape: Scrape) -> Samples:
    """Every (verdict, cause) pair, from 0."""
    counters = scrape.snap.counters
    for verdict, total in counters.stalls.items():
        by_cause = {c.value: counters.stall_causes.get(stall_key(verdict, c), 0) for c in CAUSES}
        # Hangs counted without a cause (a daemon before causes) are `unknown`.
        by_cause[Cause.UNKNOWN] += max(0, total - sum(by_cause.values()))
        for cause, n in by_cause.items():
            yield (verdict, cause), n


def _job_kills(scrape: Scrape) -> Samples:
    """Per job and owner (the counter's keys are `job_key`s)."""
    for key, n in scrape.snap.counters.job_kills.items():
        uid, job = split_job_key(key)
        yield (job, uid), n


def _scan_buckets(scrape: Scrape) -> tuple[list[tuple[str, float]], float] | None:
    bounds = scrape.snap.scan_bucket_bounds
    if not bounds:
        return None
    counters = scrape.snap.counters
    cumulative = 0
    buckets: list[tuple[str, float]] = []
    for bound, n in zip([*map(str, bounds), "+Inf"], counters.scan_buckets, strict=False):
        cumulative += n
        buckets.append((bound, cumulative))
    return buckets, counters.scan_sum


def _last_scan(snap: NodeStatus) -> float | None:
    # Until the first scan completes, the start time: a daemon that never
    # completes one still ages into the "not scanning" alert.
    return snap.time or snap.started or None


def _slowdowns(scrape: Scrape) -> Samples:
    """Each job held back by one rank here (named, with hysteresis): its slowdown,
    labelled with its owner and that rank. A straggler on another node (a job judged
    across nodes: daemon/judge/across.py) is exported by that node alone, so the alert's
    instance is the slow rank's."""
    here = {(r.host or scrape.snap.host, r.pid) for r in scrape.snap.ranks}
    for s in scrape.snap.stragglers:
        if s.slowdown is not None and (s.host or scrape.snap.host, s.pid) in here:
            yield (str(s.job), "" if s.uid is None else str(s.uid), str(s.rank)), \
                float(s.slowdown)


def _unjudged(scrape: Scrape) -> Samples:
    """Each rank whose pace is not judged against its job's ranks, with why as a code
    (its words in `status` and /status's `pace_note`)."""
    for r in scrape.ranks:
        if r.pace_unjudged:
            yield (str(r.job), _uid(r), str(r.rank), str(r.pace_unjudged)), 1.0


def _traced(scrape: Scrape) -> Samples:
    """Each rank a person traces (state `traced`): 1, labelled with its tracer."""
    for r in scrape.ranks:
        if r.tracer_pid:
            yield (str(r.job), _uid(r), str(r.rank), str(r.tracer_pid), str(r.tracer or "")), 1.0


def _build_info(scrape: Scrape) -> Samples:
    return [((str(scrape.snap.version or ""), platform.python_version()), 1.0)]


def _mode(scrape: Scrape) -> Samples | None:
    if scrape.snap.mode is None:  # an alert on a node left in observe mode
        return None
    return [((name,), 1.0 if scrape.snap.mode == name else 0.0) for name in MODES]


def _unwritten(snap: NodeStatus) -> float:
    return float(len(snap.unwritten.incidents_unwritten)
                 + len(snap.unwritten.reboot_flags_unwritten))


# -- every family /metrics exports, in the order it exports them (docs/metrics.md) ---------

FAMILIES: tuple[Family | Histogram, ...] = (
    Family("rank_state", "1 for the rank's current state", GAUGE, (*RANK, "state"), _rank_states),
    Family("rank_progress", "Completed waits", COUNTER, RANK, per_rank("progress")),
    Family("rank_collectives", "Collectives issued", COUNTER, RANK, per_rank("collectives")),
    Family("rank_steps", "User steps (hb.step)", COUNTER, RANK, per_rank("steps")),
    Family("rank_seconds_since_progress", "Seconds since a wait last returned", GAUGE, RANK,
           per_rank("seconds_since_progress")),
    Family("rank_deadline_seconds", "Deadline of the rank's current wait", GAUGE, RANK,
           per_rank("deadline_seconds")),
    Family("rank_busiest_thread_cpu_ratio",
           "Share of one core used by the rank's busiest thread", GAUGE, RANK,
           per_rank("busiest_thread_cpu")),
    Family("rank_wait_share", "Share of the rank's last minute of work spent waiting on its "
           "peers (ring: polling them)", GAUGE, RANK, per_rank("wait_share")),
    Family("rank_pace_score", "The job's pace over the rank's own over the last minute "
           "(1: the job's pace, lower: slower)", GAUGE, RANK, per_rank("pace_score")),
    Family("rank_pace_collectives_per_second", "Collectives the rank issued per second "
           "over the last minute at its usual pace", GAUGE, RANK, per_rank("pace")),
    Family("rank_pace_unjudged", "1 while the rank's pace is not judged against its job's "
           "(reason: user_space_wait, sleeps, idle, no_collectives, too_few_seconds, "
           "peer_unjudged, alone)", GAUGE, (*RANK, "reason"), _unjudged),
    Family("job_slowdown_ratio", "How much faster the job would run if its straggler (the "
           "rank label) kept the others' pace; only while one is named", GAUGE, RANK,
           _slowdowns),
    Family("rank_traced", "1 while a tracer other than the daemon's stack sampler (a "
           "debugger, a profiler) holds the rank: its job is held", GAUGE,
           (*RANK, "tracer_pid", "tracer"), _traced),
    Family("rank_attempt", "Which launch of its job the rank belongs to "
           "(mlx-watchdog launch numbers them from 1)", GAUGE, RANK, per_rank("attempt")),
    Family("stalls", "Hangs acted on, by verdict and cause", COUNTER, ("verdict", "cause"),
           _stalls),
    Family("kills", "Signals sent to end ranks", COUNTER, ("signal",),
           counts(lambda snap: snap.counters.kills)),
    Family("job_kills", "Ranks of a job the watchdog ended", COUNTER, (JOB, "uid"),
           _job_kills),
    Family("launch_events", "What mlx-watchdog launch did with torn-down jobs "
           "(restart, refused, gave_up), from launches.jsonl", COUNTER, ("event",),
           counts(lambda snap: snap.launches)),
    Family("node_reboot_required", "1 when the node must be rebooted (wired memory leak or "
           "an unkillable rank)", GAUGE, (),
           scalar(lambda snap: 1.0 if snap.reboot_required else 0.0)),
    Family("wired_memory_bytes", "System wired memory", GAUGE, (),
           scalar(lambda snap: None if snap.wired_bytes is None else float(snap.wired_bytes))),
    Family("record_dir_full", "1 while the record directory is below the room kept for "
           "ranks and nothing in it can be freed (new ranks cannot publish: unwatched)",
           GAUGE, (), scalar(lambda snap: 1.0 if snap.record_dir_full else 0.0)),
    Family("invalid_records", "Unusable files seen in the record directory", COUNTER, (),
           scalar(lambda snap: snap.counters.invalid_records)),
    Family("probe_errors", "Failed process or memory probes", COUNTER, (),
           scalar(lambda snap: snap.counters.probe_errors)),
    Family("loop_errors", "Scans that failed with an error", COUNTER, (),
           scalar(lambda snap: snap.counters.loop_errors)),
    Family("unwritten_records", "Incidents and reboot flags held in memory because writing "
           "them failed (retried each scan)", GAUGE, (), scalar(_unwritten)),
    Family("state_write_failures", "Failed writes of incidents, reboot flags and their "
           "write-ahead entries", COUNTER, (),
           scalar(lambda snap: snap.unwritten.write_failures)),
    Histogram("scan_duration_seconds", "Time one scan took", _scan_buckets),
    Family("last_scan_timestamp_seconds", "Unix time of the last completed scan", GAUGE, (),
           scalar(_last_scan)),
    Family("build_info", "mlx-watchdog's version and the Python it runs on", GAUGE,
           ("version", "python"), _build_info),
    Family("mode", "1 for the daemon's mode: enforce (ends hung ranks) or observe "
           "(reports only)", GAUGE, ("mode",), _mode),
)


class SnapshotCollector:
    """Every family of `families` (the table above) from the snapshot, on each scrape."""

    def __init__(self, snapshot: Snapshot, job_label: str = JOB_LABEL,
                 families: tuple[Family | Histogram, ...] = FAMILIES) -> None:
        self._snapshot = snapshot
        self._job_label = job_label
        self._families = families

    def collect(self) -> Iterator[Metric]:
        """Every family, built from the latest snapshot at this scrape."""
        snap = self._snapshot()
        scrape = Scrape(snap, _one_per_label(snap.ranks))
        for family in self._families:
            metric = family.build(scrape, self._job_label)
            if metric is not None:
                yield metric


def exposition(snapshot: Snapshot, job_label: str = JOB_LABEL) -> bytes:
    """One scrape: the snapshot's families and the standard `process_*` ones (this
    daemon's CPU, memory, descriptors and start; Linux's /proc, nothing elsewhere)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, job_label))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    return generate_latest(registry)
