"""Rank state without a daemon: read the records and sample the processes here.

Used by `status`, `inspect` and `watch` when no daemon publishes verdicts. It
judges with the same detector as the daemon, over a short sampling window,
and never signals anything.
"""

from __future__ import annotations

import time
from dataclasses import replace

from watchdog.daemon.attempts import attempt_of
from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.judge.detector import Detector, Verdict
from watchdog.daemon.judge.sighting import Sighting
from watchdog.daemon.observation import Presence, observe
from watchdog.daemon.probes import Probe, ProbeError, probe
from watchdog.daemon.recdir import read_dir, read_record
from watchdog.daemon.view import rank_status
from watchdog.record import Record
from watchdog.states import State
from watchdog.status import RankStatus

SAMPLES = 3  # the detector needs two CPU deltas to call a wait "spinning"
RETENTION = 60.0  # seconds an exited rank is shown, as the daemon's default `retention`
AGED = "exited over"  # the start of an aged-out rank's reason in `invalid`


def sample_ranks(directory: str, rules: Rules, pause: float = 0.2,
                 probe_: Probe | None = None, retention: float = RETENTION,
                 now: float | None = None) -> tuple[list[RankStatus], dict[str, str]]:
    """(ranks as `status --json` shows them, invalid files with the reason) for one
    directory. A rank that exited without closing its record is shown for `retention`
    seconds after its record's last write, as the daemon shows it; older, its record
    is left behind (no daemon removes it) and goes under `invalid`, as AGED."""
    wall = time.time() if now is None else now
    probe_ = probe_ or probe()
    detector = Detector(rules)
    found: list[tuple[Record, State, Verdict | None, str]] = []
    invalid: dict[str, str] = {}
    live: list[Record] = []
    paths: dict[int, str] = {}  # pid -> its record (not always <pid>.rec)
    for path, rec, why, st in read_dir(directory):
        if rec is None:
            invalid[path] = why
            continue
        look = observe(rec, probe_)
        if look.seen is Presence.UNKNOWN:
            invalid[path] = str(look.error)
        elif look.seen is Presence.GONE and st is not None and wall - st.st_mtime > retention:
            invalid[path] = (f"{AGED} {retention:g}s ago without closing its record (the "
                             "daemon removes such records)")
        elif look.seen is Presence.GONE:
            found.append((rec, State.EXITED, None, "exited without closing its record"))
        elif look.seen is Presence.NOT_OURS:
            invalid[path] = f"stale: pid {rec.pid} is now another process"
        elif look.seen is Presence.CLOSED:  # frozen words: reported, never judged
            found.append((rec, State.ABANDONED, None, "record closed while the process runs"))
        else:
            live.append(rec)
            paths[rec.pid] = path
    verdicts: dict[int, Verdict] = {}
    seen = Sighting(load=probe_.load_per_cpu())  # no stack sampled here: the load alone
    for round_ in range(SAMPLES):
        if round_:
            time.sleep(pause)
        for rec in live:
            try:
                sample = probe_.sample(rec.pid)
            except ProbeError:
                sample = None
            if sample is not None:
                verdicts[rec.pid] = detector.observe(_fresh(paths[rec.pid], rec), sample,
                                                     time.monotonic_ns(), seen)
    for rec in live:
        verdict = verdicts.get(rec.pid)
        state = verdict.state if verdict else State.EXITED
        found.append((_fresh(paths[rec.pid], rec), state, verdict, ""))
    found.sort(key=lambda f: (f[0].job, f[0].rank, f[0].pid))
    return [replace(rank_status(r, s, v, reason=why, attempt=attempt_of(r.pid)),
                    source="sampled") for r, s, v, why in found], invalid


def _fresh(path: str, rec: Record) -> Record:
    """The newest copy of a record (it changes while we sample)."""
    newer, _, _ = read_record(path)
    return newer if newer is not None and newer.start_time == rec.start_time else rec
