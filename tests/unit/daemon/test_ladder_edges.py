"""The escalation ladder's edge table (act/ladder.py's `EDGES`, the data `advance` runs):
every edge it names is taken, none it does not name ever is (`advance` refuses one), and
no code but `Enforcer.advance` sets a ladder's step. Pure: the fakes' clock, signaller
and probe."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import watchdog
from tests.support.fakes import DIES_ON_KILL, DIES_ON_TERM, FakeSignaller, target
from tests.support.ladders import complete, drive, respond
from tests.unit.daemon.test_enforcer import GiB, _record, enforcer, incident
from watchdog import record
from watchdog.daemon.act.enforcer import Enforcer
from watchdog.daemon.act.ladder import EDGES, GIVE_UP, STEPS, Ladder, Step
from watchdog.daemon.store import pending

ANY = "any"  # the table's "any step" row: a loop giving up on its ladder


def documented() -> set[tuple[str, str]]:
    """(from, to) for every edge the table names, and the give-up edge from any step."""
    return {(source.name, to.name) for source, tos in EDGES.items() for to in tos} \
        | {(ANY, GIVE_UP.name)}


class Watched(Enforcer):
    """An enforcer that notes every edge its ladders take."""

    taken: set[tuple[str, str]]

    def advance(self, ladder: Ladder, unfinished: str = "") -> bool:
        before = ANY if unfinished else ladder.step.name
        moved = super().advance(ladder, unfinished)
        if moved:
            self.taken.add((before, ladder.step.name))
        return moved


def watched(state_dir: Path, fake: FakeSignaller, taken: set[tuple[str, str]],
            **kw) -> Watched:
    plain, clock = enforcer(state_dir, fake, **kw)
    enf = Watched(plain.live, fake, plain.probe, clock=clock.now, sleep=clock.sleep,
                  wall=clock.wall)
    enf.taken = taken
    return enf


def leaving(tmp_path: Path, pid: int):
    """A target whose record says it is leaving on its own error."""
    _record(tmp_path, pid, record.STATUS_ERROR)
    return dataclasses.replace(target(pid), record_path=str(tmp_path / f"{pid}.rec"))


def entry(enf: Enforcer, targets, baseline: int | None = None, **fields) -> pending.Entry:
    """What an earlier daemon left journaled: a fresh verdict, with `fields`."""
    said = dataclasses.replace(incident(targets=targets), time=enf.wall(), **fields)
    return pending.Entry(said, tuple(targets), baseline)


@pytest.mark.slow
def test_every_edge_the_table_names_is_taken_and_no_other(tmp_path: Path,
                                                          state_dir: Path) -> None:
    taken: set[tuple[str, str]] = set()

    def enf(*pids: int, **kw) -> Watched:
        return watched(state_dir, FakeSignaller({p: DIES_ON_TERM for p in pids}), taken,
                       **kw)

    # A verdict's: observed; ended to the settle (a survivor of the grace SIGKILLed);
    # without a baseline; a rank leaving on its own error; given up while held.
    respond(enf(mode="observe"), incident(targets=[target(1)]), [target(1)])
    stubborn = watched(state_dir, FakeSignaller({2: DIES_ON_KILL}), taken)
    respond(stubborn, incident(targets=[target(2)]), [target(2)], baseline=GiB)
    respond(enf(3), incident(targets=[target(3)]), [target(3)])
    own_error = leaving(tmp_path, 4)
    respond(enf(4), incident(targets=[own_error]), [own_error])
    held = enf(5)
    ladder = held.begin(incident(targets=[target(5)]), [target(5)], evidence=False,
                        term_at=held.clock() + 5.0)
    held.close_unfinished(ladder, "its worker never returned")
    # An earlier daemon's: closed but for its writes; one still ours, ended (with a
    # baseline, then without); one leaving on its own error; none left to end, ended by
    # it (settled) or found gone before its round (closed).
    complete(resumer := enf(), entry(resumer, [target(6)], closed_at=resumer.wall()))
    complete(resumer := enf(7), entry(resumer, [target(7)], GiB, action="ending"))
    complete(resumer := enf(8), entry(resumer, [target(8)], action="ending"))
    complete(resumer := enf(9), entry(resumer, [leaving(tmp_path, 9)], action="ended",
                                      ladder="begun"))
    complete(resumer := enf(), entry(resumer, [target(10)], GiB, action="ended",
                                     ladder="begun"))
    complete(resumer := enf(), entry(resumer, [target(11)], GiB, action="ending"))

    table = documented()
    assert len(table) == 18, table  # 18 edges today
    assert taken - table == set(), "edges taken that the table does not name"
    assert table - taken == set(), "edges the table names that no ladder took"
    assert {source for source, _ in table} == {s.name for s in Step} - {"DONE"} | {ANY}


class Sending(Enforcer):
    """An enforcer that notes the signals each step's handler sends."""

    sends: dict[str, set[str]]

    def advance(self, ladder: Ladder, unfinished: str = "") -> bool:
        before = ANY if unfinished else ladder.step.name
        fake = self.signaller
        assert isinstance(fake, FakeSignaller)
        count = len(fake.sent)
        moved = super().advance(ladder, unfinished)
        self.sends.setdefault(before, set()).update(fake.names()[count:])
        return moved


def test_each_step_sends_only_the_signals_its_rung_names(tmp_path: Path,
                                                         state_dir: Path) -> None:
    """ladder.STEPS is the ladder read in one place: the signals a step's handler sends
    are the ones its row names (the evidence's dump signals are the capture's, left out
    here); given up on, a ladder sends only the thaw's SIGCONT."""
    sends: dict[str, set[str]] = {}

    def enf(fake: FakeSignaller, **kw) -> Sending:
        plain, clock = enforcer(state_dir, fake, **kw)
        made = Sending(plain.live, fake, plain.probe, clock=clock.now, sleep=clock.sleep,
                       wall=clock.wall)
        made.sends = sends
        return made

    stubborn = enf(FakeSignaller({2: DIES_ON_KILL}))
    respond(stubborn, incident(targets=[target(2)]), [target(2)], baseline=GiB,
            evidence=False)
    own_error = leaving(tmp_path, 4)
    respond(enf(FakeSignaller({4: DIES_ON_TERM, 3: DIES_ON_TERM})),
            incident(targets=[own_error, target(3)]), [own_error, target(3)],
            evidence=False)
    held = enf(FakeSignaller({5: DIES_ON_TERM}))
    ladder = held.begin(incident(targets=[target(5)]), [target(5)], evidence=False,
                        term_at=held.clock() + 5.0)
    held.close_unfinished(ladder, "its worker never returned")
    resumer = enf(FakeSignaller({7: DIES_ON_TERM}))
    complete(resumer, entry(resumer, [target(7)], GiB, action="ending"))
    assert {"BEGIN", "HOLD", "LEAVING", "TERM", "RESUME", ANY} <= set(sends)
    assert sends["TERM"] == {"SIGKILL"} and "SIGSTOP" in sends["BEGIN"]
    for step, sent in sends.items():
        allowed = {"SIGCONT"} if step == ANY else set(STEPS[Step[step]].sends)
        assert sent <= allowed, (step, sent)


def test_every_step_but_done_has_its_handler() -> None:
    assert set(Enforcer.HANDLERS) == set(Step) - {Step.DONE}
    assert all(handler.__name__ == f"_step_{step.name.lower()}"
               for step, handler in Enforcer.HANDLERS.items())
    assert set(EDGES) == set(Step) - {Step.DONE}  # every step but DONE goes somewhere


def test_advance_refuses_an_edge_the_table_does_not_name(state_dir: Path) -> None:
    """A handler that returns a step the table does not name from its own raises, and
    the ladder stays where it was (its response is then closed unfinished)."""

    class Astray(Enforcer):
        def _step_hold(self, ladder: Ladder, now: float) -> Step | None:
            return None if now < ladder.term_at else Step.SETTLE  # not in HOLD's row

    Astray.HANDLERS = {**Enforcer.HANDLERS, Step.HOLD: Astray._step_hold}
    fake = FakeSignaller({1: DIES_ON_TERM})
    plain, clock = enforcer(state_dir, fake)
    astray = Astray(plain.live, fake, plain.probe, clock=clock.now, sleep=clock.sleep,
                    wall=clock.wall)
    ladder = astray.begin(incident(targets=[target(1)]), [target(1)], evidence=False,
                          term_at=clock.now() + 5.0)
    assert ladder.step is Step.HOLD
    clock.advance(5.0)
    with pytest.raises(RuntimeError, match="no edge from HOLD to SETTLE"):
        astray.step(ladder)
    assert ladder.step is Step.HOLD
    outcome = astray.close_unfinished(ladder, "its step failed")
    assert ladder.step is Step.DONE and outcome.results == {1: "unknown"}
    assert fake.names() == ["SIGSTOP", "SIGCONT"]  # frozen, then thawed: never left stopped


def test_a_ladder_at_done_takes_no_step(state_dir: Path) -> None:
    enf, _ = enforcer(state_dir, FakeSignaller(), mode="observe")
    ladder = enf.begin(incident(targets=[target(1)]), [target(1)])
    assert ladder.step is Step.DONE and not enf.advance(ladder)
    assert drive(enf, ladder) is ladder.result


@pytest.mark.slow
def test_only_advance_sets_a_ladders_step() -> None:
    """Every write of an attribute named `step` in the package is in
    `Enforcer.advance`: no handler or helper moves a ladder beside the table."""
    package = Path(watchdog.__file__).parent
    writes = []
    advance = None
    for path in package.rglob("*.py"):
        if "rank" in path.relative_to(package).parts[:1]:
            continue  # the rank side's `step` is the user's (`hb.step()`), bound once
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "advance" \
                    and path.name == "enforcer.py":
                advance = (node.lineno, node.end_lineno)
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                       else [])
            for target_node in targets:
                for leaf in ast.walk(target_node):
                    if isinstance(leaf, ast.Attribute) and leaf.attr == "step":
                        writes.append((path.name, node.lineno))
    assert advance is not None and advance[1] is not None
    assert writes, "the scan found no write of a step at all: it is broken"
    assert all(name == "enforcer.py" and advance[0] <= line <= advance[1]
               for name, line in writes), writes


class Journaled(Enforcer):
    """An enforcer that keeps its journal entry as it stood at each step the ladder
    rested at (`BEGIN`: its first write, the verdict alone)."""

    entries: dict[str, pending.Entry]

    def write_ahead(self, ladder: Ladder) -> None:
        super().write_ahead(ladder)
        if "BEGIN" not in self.entries:
            (self.entries["BEGIN"],) = pending.unfinished(self.settings.state_dir)

    def advance(self, ladder: Ladder, unfinished: str = "") -> bool:
        moved = super().advance(ladder, unfinished)
        found = pending.unfinished(self.settings.state_dir)
        if moved and found:
            (self.entries[ladder.step.name],) = found
        return moved


# What resume.py's table says a restarted daemon makes of an entry left at
# each step: a target gone counts killed once the round began; one SIGSTOPped and not
# yet SIGTERMed (as far as the entry says) is thawed when its verdict is stale.
ENDED_BY_US = {"TERM", "KILL", "FRAMES", "SETTLE"}
FROZEN_STILL = {"EVIDENCE", "HOLD", "TERM"}


@pytest.mark.slow
def test_what_resume_infers_from_an_entry_left_at_each_step(tmp_path: Path) -> None:
    """A daemon dies at each step of a ladder whose rank ignores SIGTERM; the next
    daemon, given the entry as it stood, finds the rank still there (its verdict fresh,
    or stale) or gone, and does what resume.py's table says."""
    first = tmp_path / "first"
    fake = FakeSignaller({21: DIES_ON_KILL})
    plain, clock = enforcer(first, fake)
    dying = Journaled(plain.live, fake, plain.probe, clock=clock.now, sleep=clock.sleep,
                      wall=clock.wall)
    dying.entries = {}
    said = dataclasses.replace(incident(targets=[target(21)]), time=clock.wall())
    respond(dying, said, [target(21)], baseline=GiB)
    assert set(dying.entries) == {"BEGIN", "EVIDENCE", "HOLD", "TERM", "KILL", "FRAMES",
                                  "SETTLE"}
    for step, entry in dying.entries.items():
        for case in ("fresh", "stale", "gone"):
            fake = FakeSignaller({} if case == "gone" else {21: DIES_ON_TERM})
            later, later_clock = enforcer(tmp_path / f"{step}-{case}", fake)
            later_clock.t = clock.t + (10_000.0 if case == "stale" else 1.0)
            outcome = complete(later, entry)
            where = f"died at {step}, the rank {case}"
            if case == "fresh":  # down the ladder from HOLD's round
                assert fake.names() == ["SIGTERM", "SIGCONT"], where
                assert outcome.results == {21: "killed"}, where
            elif case == "stale":  # left to the scan; thawed if frozen still
                assert fake.names() == (["SIGCONT"] if step in FROZEN_STILL else []), where
                assert outcome.results == {21: "unknown"}, where
            else:
                assert fake.names() == [], where
                assert outcome.results == {21: "killed" if step in ENDED_BY_US else "gone"}, \
                    where


# The ladder's rooms, from the ground up: each imports only rooms before it (no circle,
# no arrow up), the pure ones (ladder, wired, resume) none that signals or writes.
LADDER_ROOMS = ("exo", "ladder", "wired", "resume", "workers", "evidence", "writes",
                "teardown", "acting", "steps", "enforcer")
PURE = {"exo", "ladder", "wired", "resume"}


def test_the_ladders_rooms_import_only_those_before_them() -> None:
    from tests.unit.test_rooms import PACKAGE, imports

    act = "watchdog.daemon.act."
    wrong = []
    for at, name in enumerate(LADDER_ROOMS):
        used = {t.removeprefix(act).split(".")[0]
                for t in imports(PACKAGE / "daemon" / "act" / f"{name}.py")
                if t.startswith(act) or t == act.rstrip(".")}
        wrong += [f"{name} imports {u}" for u in used - set(LADDER_ROOMS[:at])]
        if name in PURE:
            wrong += [f"{name}, pure, imports {u}" for u in used]
    assert wrong == []
    assert "act.resume" in next(
        t for t in imports(PACKAGE / "daemon" / "act" / "steps.py") if "resume" in t)
