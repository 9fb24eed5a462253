"""Why a job hangs, in words an operator acts on: the cause vocabulary and its decision.

Pure, like `daemon/judge/`: the ranks of one job as the reachable nodes report them
(`status.RankStatus`, each with its node's data-link probe), the ranks no node
reports, and the nodes that did not answer, in; a `Finding` (cause, culprit, one-line
summary) out. It sits with the contracts, not under `daemon/`, because the cluster
view (`daemon/judge/cluster.py`, run by `cluster status` too) decides with it; the daemon
decides with the same function, so an incident and `cluster status` agree.

The decision table, first match wins (docs/operations.md has one section per cause):

| cause               | the evidence                                                        |
| ------------------- | ------------------------------------------------------------------- |
| `peer_stopped`      | a rank of the job is stopped or traced (here or on a peer node)     |
| `peer_dead`         | a rank of the job is gone while another waits                       |
| `secret_refused`    | a rank no node reports, and a node answers but refuses this node's  |
|                     | secret (bad signature): the secrets differ; `doctor` says which     |
| `node_unreachable`  | a rank no node reports, and a node did not answer                   |
| `peer_never_joined` | a rank waits at bring-up (mx.distributed.init) while ranks of its   |
|                     | job are reported by no node: they never started (or never joined)   |
| `data_link_down`    | every node answers, but a rank's probe of its peers' data path fails |
| `mismatch`          | a rank waits while a peer is idle, or outside a wait and not computing, |
|                     | or two ranks wait at the same collective number in different ops    |
| `local_blocked`     | a rank waits past (half) its deadline and no thread of it spins     |
| `unknown`           | a rank no node reports although every node answered; ranks waiting  |
|                     | in different collectives; anything else                             |
| `collective_wedged` | every rank of the job present, waiting in the same collective,      |
|                     | spinning, every node and data link answering                        |
| `quiet_hang`        | never from the table: a node's own (below)                          |

A stopped or gone rank is a fact and wins over what is inferred from silence; a
quiet rank among spinning peers is the culprit (the others spin waiting on it).

Two causes are a node's own, decided before the table from what only the node sees
(`own`): `collective_wedged` from its ranks' native frames and sockets (judge/wedge.py:
the wedge, with its note), and `quiet_hang` from a rank past its deadline with no
thread busy, its threads asleep in a wait, nothing read, written or sent
(judge/detector.py), unless a rank is stopped. An incident takes its cause from
`own`, else from the table; the cluster view's cause (this table, on every node's
facts) then replaces it unless the node saw more (`replaces`: `OWN_OVER`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from watchdog import text
from watchdog.states import ENDED, HUNG, WAITING_PHASES, Link, Phase, State, Word
from watchdog.status import RankStatus


class Cause(Word):
    """Why a job hangs (the table above; an incident's and a metric's `cause`)."""

    PEER_STOPPED = "peer_stopped"
    PEER_DEAD = "peer_dead"
    NODE_UNREACHABLE = "node_unreachable"
    DATA_LINK_DOWN = "data_link_down"
    COLLECTIVE_WEDGED = "collective_wedged"
    MISMATCH = "mismatch"
    LOCAL_BLOCKED = "local_blocked"
    UNKNOWN = "unknown"
    QUIET_HANG = "quiet_hang"  # the node's own judgement (detector), never the table's
    SECRET_REFUSED = "secret_refused"  # a node answers, signed with another secret
    PEER_NEVER_JOINED = "peer_never_joined"


# What a node that answers, but not signed with this node's secret, is said to do: the
# secrets differ (or it has none). A node's failed answer with these words (net/cluster.py)
# is told from one that does not answer: cause `secret_refused`, whose fix is `doctor`.
REFUSED = "answers but refuses this node's secret (bad signature)"


def refused(error: str | None) -> bool:
    """Whether a node's failed answer is one signed with another secret (or none)."""
    return error == REFUSED


# In the vocabulary's order, not the table's (`decide`'s branches are): the metrics list
# them so, and a new cause goes last, so that no series moves.
CAUSES = tuple(Cause)

# A node's own cause (`own`) against a cluster view's: the view's causes that say less
# than what the node saw (its frames, sockets and bytes) and so leave it standing.
OWN_OVER: Mapping[Cause, frozenset[Cause]] = {
    Cause.COLLECTIVE_WEDGED: frozenset({Cause.UNKNOWN, Cause.COLLECTIVE_WEDGED}),
    Cause.QUIET_HANG: frozenset({Cause.UNKNOWN, Cause.LOCAL_BLOCKED, Cause.COLLECTIVE_WEDGED,
                                 Cause.QUIET_HANG}),
}

# A wait's busiest thread demanding at least this much of a core spins (the detector's
# spin ratio is a setting; this only reads what a node published: stalled or blocked
# says it first, the figure only when no verdict was given yet).
SPIN = 0.5


@dataclass(frozen=True)
class Finding:
    """A hung job's cause, the rank it names, and the one line that says so."""

    cause: Cause
    culprit: RankStatus | None  # None: a rank no node reports, or no one rank
    summary: str  # who (rank, host, pid), where (op, collective, bytes), why


def own(wedge: str | None, quiet: Sequence[str], stopped: bool) -> tuple[Cause, str] | None:
    """A node's own cause and its one line, or None (the table decides): `wedge` is the
    job's wedge in words (judge/wedge.py), `quiet` each quiet rank's words
    (judge/detector.py), `stopped` whether a rank of the job is stopped (a pause
    explains a quiet wait: the table's `peer_stopped` then)."""
    if wedge is not None:
        return Cause.COLLECTIVE_WEDGED, wedge
    if quiet and not stopped:
        return Cause.QUIET_HANG, "quiet hang: " + "; ".join(quiet)
    return None


def replaces(view: str | None, cause: str | None) -> bool:
    """Does the cluster view's cause replace an incident's? Always, but where the
    incident's is the node's own and the view's says less (OWN_OVER)."""
    if not view:
        return False
    for mine, weaker in OWN_OVER.items():
        if cause == mine:
            return view not in weaker
    return True


def size(nbytes: int | None) -> str:
    """A byte count as a person reads it (`16 MiB`, `512 B`); "" when unknown."""
    if nbytes is None:
        return ""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def where(rank: RankStatus) -> str:
    """Its op and collective number, with the bytes: `all_sum #18231 (16 MiB)`."""
    last = rank.last_collective
    if last is None:
        return "init" if rank.phase == Phase.INIT.label else "no collective yet"
    nbytes = size(last.bytes)
    return (f"{last.op or 'a collective'}"
            + (f" #{last.number}" if last.number is not None else "")
            + (f" ({nbytes})" if nbytes else ""))


def who(rank: RankStatus) -> str:
    """The rank named as a person reads it: rank, host and pid."""
    return text.who(rank.rank, rank.host, rank.pid)


def _names(ranks: Sequence[RankStatus]) -> str:
    return ", ".join(str(r.rank) for r in ranks)


def _wait_note(waiting: Sequence[RankStatus], verb: str = "wait", tail: str = "") -> str:
    """`rank 0 on h0 (pid 5) waits for it in all_sum #3 (16 B)`, `ranks 0, 2 wait ...`."""
    if not waiting:
        return "no rank waits"
    if len(waiting) == 1:
        return f"{who(waiting[0])} {verb}s{tail} in {where(waiting[0])}"
    return f"ranks {_names(waiting)} {verb}{tail} in {where(waiting[0])}"


def spinning(rank: RankStatus) -> bool | None:
    """Whether its wait spins: its state says so once judged, else its thread's demand."""
    if rank.state == State.STALLED:
        return True
    if rank.state == State.BLOCKED:
        return False
    if rank.busiest_thread_cpu is None:
        return None
    return rank.busiest_thread_cpu >= SPIN


def decide(ranks: Sequence[RankStatus], missing: Sequence[int] = (),
           unreachable: Sequence[str] = (), refused: Sequence[str] = ()) -> Finding:
    """The cause of a hung job: `ranks` as the nodes that answered report them,
    `missing` the rank numbers no node reports, `unreachable` the nodes that did not
    answer (by address), `refused` those of them that answer but refuse this node's
    secret (bad signature)."""
    ranks = sorted(ranks, key=lambda r: (r.rank if r.rank is not None else -1, r.pid or 0))
    waiting = [r for r in ranks if r.phase in WAITING_PHASES and r.state not in ENDED
               and r.state != State.STOPPED]
    stopped = [r for r in ranks if r.state == State.STOPPED]
    gone = [r for r in ranks if r.state in ENDED]
    if stopped:
        r = stopped[0]
        return Finding(Cause.PEER_STOPPED, r, f"{who(r)} is stopped at {where(r)}"
                       + (f"; {_wait_note(waiting, tail=' for it')}" if waiting else ""))
    if gone and waiting:
        r = gone[0]
        how = f"{r.state}: {r.reason}" if r.reason else r.state
        return Finding(Cause.PEER_DEAD, r, f"{who(r)} is gone ({how}) at {where(r)}; "
                                           + _wait_note(waiting, tail=" for it"))
    refusing = [n for n in refused if n in unreachable] if unreachable else list(refused)
    if missing and refusing:
        return Finding(Cause.SECRET_REFUSED, None,
                       f"{', '.join(refusing)} answers but refuses this node's secret (bad "
                       f"signature), so rank {missing[0]} behind it is not seen; "
                       + _wait_note(waiting))
    if missing and unreachable:
        nodes = ", ".join(unreachable)
        return Finding(Cause.NODE_UNREACHABLE, None,
                       f"rank {missing[0]} is behind unreachable node {nodes} (no answer); "
                       + _wait_note(waiting))
    starting = [w for w in waiting if w.phase == Phase.INIT.label]
    if starting and missing:
        r = starting[0]
        lasted = (f" for {r.seconds_in_wait:.0f}s" if r.seconds_in_wait is not None else "")
        names = ", ".join(str(m) for m in missing)
        return Finding(Cause.PEER_NEVER_JOINED, None,
                       f"rank{'s' if len(missing) > 1 else ''} {names} never joined the "
                       f"group: {who(r)} waited for {'them' if len(missing) > 1 else 'it'} "
                       f"at bring-up (mx.distributed.init){lasted}")
    down = [r for r in ranks if Link.is_down(r.data_link)]
    if down:
        r = down[0]
        return Finding(Cause.DATA_LINK_DOWN, r,
                       f"{who(r)} cannot reach its peer over the ranks' own connection "
                       f"({r.data_link}) while every node's daemon answers; "
                       + _wait_note(waiting))
    placed = {id(r) for r in waiting} | {id(r) for r in gone}  # by identity: linear
    outside = [r for r in ranks if id(r) not in placed
               and (r.phase == Phase.IDLE.label or r.computing is not True)]
    if waiting and outside:
        r, w = outside[0], waiting[0]
        doing = ("idle (hb.idle)" if r.phase == Phase.IDLE.label
                 else "outside any wait, not computing")
        return Finding(Cause.MISMATCH, r, f"{who(w)} waits in {where(w)} while {who(r)} is "
                                          f"{doing}: a collective skipped or reordered")
    by_number: dict[int, RankStatus] = {}
    for w in waiting:
        last = w.last_collective
        if last is None or last.number is None:
            continue
        other = by_number.setdefault(last.number, w)
        if other.last_collective and other.last_collective.op != last.op:
            return Finding(Cause.MISMATCH, w, f"{who(other)} waits in {where(other)} while "
                                              f"{who(w)} waits in {where(w)}: the ranks "
                                              "issued different collectives")
    # Past its deadline (or half of it: a peer node's scan may lag the verdict here).
    quiet = [w for w in waiting if w.state in HUNG | {State.SUSPECT}
             and spinning(w) is False]
    if quiet:
        r = quiet[0]
        spin = [w for w in waiting if spinning(w)]
        return Finding(Cause.LOCAL_BLOCKED, r,
                       f"{who(r)} waits quietly in {where(r)}, no thread spinning "
                       "(a wedged GPU or a broken group)"
                       + (f"; {_wait_note(spin, 'spin')} waiting on it" if spin else ""))
    if missing:
        return Finding(Cause.UNKNOWN, None, f"{_wait_note(waiting)}; rank {missing[0]} is "
                                            "not reported by any node, though every node "
                                            "answered")
    numbers = {w.last_collective.number if w.last_collective else None for w in waiting}
    if waiting and len(waiting) == len(ranks) and len(numbers) == 1 \
            and all(spinning(w) for w in waiting):
        return Finding(Cause.COLLECTIVE_WEDGED, None,
                       f"{_wait_note(waiting, 'spin')}, every node and link answering: "
                       "the backend itself is stuck")
    if len(numbers) > 1:
        behind = min(waiting, key=lambda w: (w.last_collective.number or 0)
                     if w.last_collective else 0)
        return Finding(Cause.UNKNOWN, behind, f"ranks wait in different collectives; "
                                              f"{who(behind)} is furthest behind, in "
                                              f"{where(behind)}")
    return Finding(Cause.UNKNOWN, waiting[0] if waiting else None,
                   f"{_wait_note(waiting)}; the evidence does not decide")
