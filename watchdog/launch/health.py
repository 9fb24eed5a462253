"""Is this node fit to start a job on? The one check behind `launch`'s relaunch gate
and `node wait-healthy`.

A node is not fit while it is flagged for reboot (its own `reboot-required`,
or a peer's `/status` saying so, when `peers` are configured), or while
wired memory is above its idle baseline by more than `wired_threshold` (a
killed job's memory not yet given back): the daemon's baseline, and for a
relaunch also what `launch` read before its first attempt. Waiting helps
with the second (memory comes back within the settle time, or the daemon
flags the node) and with the first only if an operator clears the flag.

Only our own uid's wired memory is held against the node: any user can wire
memory (`mlock` needs no privilege, an MLX job wires GPU memory), and another
user's must not keep our job from starting. On Linux the memory other users'
processes lock (their `VmLck`) is not counted; where it cannot be told apart
(macOS: GPU memory has no owner to read) and ranks of other users are live, the
wired check is not judged, and the gate says so.

A peer that does not answer fails the gate closed: its reboot flag is unknown,
and anyone can make a peer not answer (its HTTP slots are shared by every local
user). Only once it has not answered for `PEER_DOWN_AFTER` seconds of the wait
is it taken for down (a node that is down gets no ranks anyway) and passed over,
with a note.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from watchdog.daemon.config import Settings
from watchdog.daemon.store import journal
from watchdog.daemon.store.snapshot import daemon_status
from watchdog.net import cluster
from watchdog.procstat import locked_by_uid
from watchdog.states import ENDED
from watchdog.text import printable

ENDED_STATES = {s.value for s in ENDED}
PEER_DOWN_AFTER = 30.0  # seconds a peer may not answer before it is taken for down


@dataclass(frozen=True)
class Health:
    """One look at the node: `problem` is None when fit; `notes` say what was not checked."""

    problem: str | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reference:
    """What `launch` measured before its first attempt: the node's wired bytes then.

    The daemon's idle baseline follows wired memory whenever no rank is live, so
    memory a crashed rank left wired (no kill of the daemon's, no settle check)
    becomes its new baseline; the launcher's own reading does not move.
    `others_live` says whether ranks of other jobs run here now (they may hold
    wired memory legitimately: no verdict then, as the daemon's settle check).
    """

    wired: int
    others_live: Callable[[], bool]


def wired_now() -> int | None:
    """This node's wired bytes (the daemon's probe), or None when it cannot be read."""
    from watchdog.daemon.probes import ProbeError, probe

    try:
        return probe().wired_bytes()
    except ProbeError:
        return None


def locked_by_others(uid: int, proc: str = "/proc") -> int | None:
    """Bytes other uids' processes hold locked (their VmLck, Linux), or None where
    that cannot be read (no /proc: macOS)."""
    by_uid = locked_by_uid(proc)
    return None if by_uid is None else sum(n for owner, n in by_uid.items() if owner != uid)


def _excused(over: int, threshold: int, others_live: bool) -> str | None:
    """Why wired memory `over` the threshold is not held against the node (a note),
    or None: it is ours."""
    foreign = locked_by_others(os.getuid())
    if foreign is not None:
        if foreign and over - foreign <= threshold:
            return (f"{foreign / 2**20:.0f} MiB of wired memory is locked by other users' "
                    f"processes: not counted")
        return None
    if others_live:
        return ("ranks of other users run here and wired memory has no owner to read: "
                "the wired check is not judged")
    return None


def check(settings: Settings, reference: Reference | None = None,
          peers_down_ok: bool = False, timeout: float | None = None) -> Health:
    """One look. `peers_down_ok`: a peer that does not answer is passed over with a
    note (else it is the problem: its reboot flag is not known). The peers are
    waited for at most `timeout` seconds (at most peer_timeout)."""
    flag = journal.reboot_flag(settings.state_dir)
    if flag is not None:
        return Health(f"this node is flagged for reboot ({printable(str(flag.why))}; "
                      f"clear it with `mlx-watchdog node clear-reboot` after rebooting)")
    notes = []
    snap = daemon_status(settings.state_dir)
    if snap is None:
        notes.append("no daemon running here: wired memory not checked")
    else:
        wired, baseline = snap.wired_bytes, snap.wired_baseline_bytes
        strangers = any(r.uid not in (None, os.getuid()) and r.state not in ENDED_STATES
                        for r in snap.ranks)
        if wired is not None and baseline is not None:
            over = wired - baseline
            excused = (_excused(over, settings.wired_threshold, strangers)
                       if over > settings.wired_threshold else None)
            if excused:
                notes.append(excused)
            elif over > settings.wired_threshold:
                return Health(f"wired memory is {over / 2**20:.0f} MiB above its idle "
                              f"baseline (more than wired_threshold "
                              f"{settings.wired_threshold / 2**20:.0f} MiB)", tuple(notes))
    if reference is not None:
        now = wired_now()
        above = None if now is None else now - reference.wired
        excused = (_excused(above, settings.wired_threshold, False)
                   if above is not None and above > settings.wired_threshold else None)
        if excused:
            notes.append(excused)
        elif above is not None and above > settings.wired_threshold:
            if reference.others_live():
                notes.append("ranks of other jobs run here: wired memory against the first "
                             "attempt's not judged")
            else:
                return Health(f"wired memory is {above / 2**20:.0f} MiB above where it was "
                              f"before the first attempt (more than wired_threshold "
                              f"{settings.wired_threshold / 2**20:.0f} MiB)", tuple(notes))
    problem, unreachable = None, None
    wait = settings.peer_timeout if timeout is None else min(settings.peer_timeout, timeout)
    for node in cluster.gather(settings.peers, max(0.1, wait)):
        if not node.ok or node.status is None:
            notes.append(f"peer {node.peer} unreachable: its reboot flag not checked")
            unreachable = unreachable or (
                f"peer {node.peer} unreachable: its reboot flag not checked (passed "
                f"over once it has not answered for {PEER_DOWN_AFTER:g}s)")
            continue
        status = node.status
        if status.reboot_required and problem is None:
            reason = status.reboot.why if status.reboot is not None else None
            problem = (f"peer {node.peer} ({printable(str(status.host))}) is "
                       f"flagged for reboot ({printable(str(reason))})")
    if problem is None and unreachable is not None and not peers_down_ok:
        problem = unreachable
        notes = [n for n in notes if not unreachable.startswith(n)]
    return Health(problem, tuple(notes))


def wait_healthy(settings: Settings, timeout: float, *, reference: Reference | None = None,
                 poll: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep,
                 on_wait: Callable[[str], None] | None = None) -> Health:
    """Check until the node is fit or `timeout` seconds pass; the last look.

    `on_wait` hears the problem once, when the first look finds one (so a
    caller can say what it waits for).
    """
    began = clock()
    until = began + timeout
    health = check(settings, reference, timeout=timeout)
    told = False
    while health.problem is not None and clock() < until:
        if on_wait is not None and not told:
            on_wait(health.problem)
            told = True
        sleep(min(poll, max(0.0, until - clock())))
        health = check(settings, reference, peers_down_ok=clock() - began >= PEER_DOWN_AFTER,
                       timeout=until - clock())
    return health
