"""`status`, `watch` and `inspect`: the ranks of this node, from the daemon or sampled here."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from typing import Any

import click

from watchdog.cli import colour
from watchdog.cli.colour import state as colour_of
from watchdog.cli.exits import SetupError
from watchdog.cli.options import DIR_ENV, Duration, deadline_option, dir_option, state_option
from watchdog.states import ENDED, HUNG, Unjudged
from watchdog.status import RankStatus
from watchdog.text import plural, printable


def _rules(deadline: float | str | None) -> Any:
    """The rules a sampled rank is judged by: the node's config (its deadline and the
    rest, as its daemon would judge), the --deadline flag over its deadline."""
    import dataclasses

    from watchdog.cli.options import Node
    from watchdog.daemon.config import Settings, coerce

    node = click.get_current_context().find_object(Node)
    settings = node.settings if node is not None else Settings()
    if deadline is not None:
        settings = dataclasses.replace(settings, deadline=coerce("deadline", deadline))
    return settings.rules()


def _ranks(record_dir: str, state_dir: str, deadline: float | str | None = None
           ) -> tuple[list[RankStatus], str]:
    from watchdog.cli.look.sampling import AGED, RETENTION, sample_ranks
    from watchdog.daemon.store.snapshot import find_daemon

    snap = find_daemon(record_dir, state_dir)
    if snap is not None:
        return list(snap.ranks), "daemon"
    if not os.path.isdir(record_dir):
        raise SetupError(f"record directory {record_dir} does not exist "
                                   f"(set --dir or {DIR_ENV})")
    ranks, invalid = sample_ranks(record_dir, _rules(deadline))
    aged = [path for path, why in invalid.items() if why.startswith(AGED)]
    for path, why in invalid.items():
        if not why.startswith(AGED):
            click.echo(printable(f"skipped {path}: {why}"), err=True)  # names are anyone's
    if aged:  # one line for them all: with no daemon, such records pile up
        click.echo(printable(f"({plural(len(aged), 'rank')} that exited over {RETENTION:g}s ago "
                             f"not shown; their records stay in {record_dir} until a daemon "
                             "runs)"), err=True)
    return ranks, "sampled"


def _fmt(value: Any, spec: str = "", unit: str = "") -> str:
    if value is None:
        return "-"
    return (format(value, spec) if spec else str(value)) + unit


COLUMNS = ("PID", "JOB", "RANK", "STATE", "PHASE", "PROGRESS", "COLL", "SINCE", "DEADLINE",
           "CPU", "OP")
STATE_COLUMN = COLUMNS.index("STATE")


def table(ranks: list[RankStatus], colour: bool = False) -> str:
    """One line per rank under a header: SINCE (the last progress) and DEADLINE in
    seconds, CPU the busiest thread's share of a core; states coloured when `colour`."""
    rows: list[tuple[str, ...]] = [COLUMNS]
    for r in ranks:
        # The attempt of a relaunched job (`launch --restart`), when the daemon knows it.
        job = r.job if r.attempt is None else f"{r.job} #{r.attempt}"
        cpu = None if r.busiest_thread_cpu is None else r.busiest_thread_cpu * 100
        # A rank that ended has no time since progress, no CPU and no op: its last
        # figures would read as live ones.
        gone = r.state in ENDED
        cells = (_fmt(r.pid), job, f"{_fmt(r.rank)}/{_fmt(r.world_size)}", _fmt(r.state),
                 _fmt(r.phase), _fmt(r.progress), _fmt(r.collectives),
                 _fmt(None if gone else r.seconds_since_progress, ".1f", "s"),
                 _fmt(r.deadline_seconds, ".0f", "s"),
                 _fmt(None if gone else cpu, ".0f", "%"), "" if gone else r.current_op or "")
        rows.append(tuple(printable(cell) for cell in cells))  # record strings are untrusted
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for n, row in enumerate(rows):
        padded = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        if n:
            padded[STATE_COLUMN] = colour_of(padded[STATE_COLUMN], row[STATE_COLUMN], colour)
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def pace_line(r: RankStatus) -> str | None:
    """A rank's pace in words (judge/stragglers.py): its figures once known, why it
    is held back when it is the rank the others wait for, why it is not judged when it
    is not; None when the daemon has said nothing of it."""
    if r.state in ENDED:  # its pace is history: a job ended keeps no pace
        return None
    figures = []
    if r.pace is not None:
        figures.append(f"{r.pace:.2f} collectives/s")
    if r.wait_share is not None and r.pace_unjudged != Unjudged.USER_SPACE_WAIT:
        figures.append(f"waits on its peers {r.wait_share:.0%}")
    if r.pace_score is not None:
        figures.append(f"score {r.pace_score:.2f}")
    said = [", ".join(figures)] if figures else []
    said += [text for text in (r.pace_why, r.pace_note) if text]
    if not said:
        return None
    return printable(f"rank {_fmt(r.rank)} (pid {r.pid}) of {r.job}: " + "; ".join(said))


def straggler_lines(record_dir: str, state_dir: str) -> list[str]:
    """A line per job the daemon finds held back by one rank (judge/stragglers.py)."""
    from watchdog.daemon.store.snapshot import find_daemon

    snap = find_daemon(record_dir, state_dir)
    # One clause after another, never one parenthesis after another; the score said
    # for what it is beside the job's loss (0.55 is not 1 / 1.61).
    return [f"job {printable(s.job)}: {printable(s.summary)}; the job would run "
            f"{s.slowdown or 1:.2f}x faster at the others' pace"
            + (f" (its score {s.score:.2f}: the others' share of time working over its own)"
               if s.score is not None else "")
            for s in (snap.stragglers if snap is not None else ())]


def clash_lines(ranks: list[RankStatus]) -> list[str]:
    """The daemon's warning for live ranks that all claim one rank of one job, under the
    table that shows them (two rank-0 rows are not one group)."""
    from watchdog.daemon.table import clash_words
    from watchdog.states import ENDED

    claims: dict[tuple[object, str, int], list[RankStatus]] = {}
    for r in ranks:
        if r.rank is not None and r.rank >= 0 and r.state not in ENDED:
            claims.setdefault((r.uid, r.job, r.rank), []).append(r)
    return [printable("warning: " + clash_words(sorted(c.pid or 0 for c in claim), rank, job,
                                                claim[0].world_size))
            for (_, job, rank), claim in sorted(claims.items(), key=lambda kv: str(kv[0]))
            if len(claim) > 1]


@click.command()
@dir_option
@state_option
@click.option("--json", "as_json", is_flag=True, help="One JSON list, one object per rank.")
@click.option("--check", is_flag=True, help="Exit 1 if any rank is stalled, blocked or "
              "unkillable.")
@deadline_option
def status(record_dir: str, state_dir: str, as_json: bool, check: bool,
           deadline: float | str | None) -> None:
    """The ranks on this node and their state (works with no daemon running)."""
    ranks, source = _ranks(record_dir, state_dir, deadline)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in ranks], indent=1))
    elif ranks:
        click.echo(table(ranks, colour=colour.wanted()))
        click.echo(f"({plural(len(ranks), 'rank')}; " + (
            "verdicts from the daemon)" if source == "daemon"
            else "sampled here: no daemon running)"), err=True)
    else:
        click.echo(printable(f"no ranks in {record_dir}"))
    if not as_json and source == "daemon":
        paces = [line for r in ranks if (line := pace_line(r)) is not None]
        if paces:
            click.echo("pace (the last 30 s; 1 is the job's pace):")
            click.echo("\n".join(f"  {line}" for line in paces))
        for line in straggler_lines(record_dir, state_dir):
            click.echo(line)
    if not as_json:
        for line in clash_lines(ranks):
            click.echo(line, err=True)
    if check and any(r.state in HUNG for r in ranks):
        sys.exit(1)


@click.command()
@dir_option
@state_option
@click.option("--interval", type=Duration(0.1), default=1.0, show_default=True,
              help="The time between refreshes (seconds, or 500ms, 2s).")
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many refreshes.")
@deadline_option
def watch(record_dir: str, state_dir: str, interval: float, count: int | None,
          deadline: float | str | None) -> None:
    """A live view of the ranks, refreshed in place (Ctrl-C to quit)."""
    shown = 0
    try:
        while count is None or shown < count:
            ranks, source = _ranks(record_dir, state_dir, deadline)
            stamp = datetime.now().strftime("%H:%M:%S")
            body = (table(ranks, colour=colour.wanted()) if ranks
                    else printable(f"no ranks in {record_dir}"))
            warned = "".join(f"\n{line}" for line in clash_lines(ranks))  # as `status` warns
            click.echo(f"\x1b[H\x1b[2J{stamp}  mlx-watchdog  ({source})\n\n{body}{warned}")
            shown += 1
            if count is None or shown < count:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass


@click.command()
@click.argument("pid", type=click.IntRange(min=1))
@dir_option
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: threads, counters, flight recorder.")
def inspect(pid: int, record_dir: str, as_json: bool) -> None:
    """One rank in depth: threads, counters, expect window, flight recorder."""
    from watchdog.cli.look.inspect import NotThisProcess, describe, record_of, render_text

    try:
        found = record_of(record_dir, pid)
    except NotThisProcess as err:
        raise SetupError(str(err)) from None
    if found is None:
        import psutil

        if not psutil.pid_exists(pid):  # ended (killed, or exited): its record went with it
            raise SetupError(f"pid {pid} is not running: a rank's record is removed when it "
                             "ends; what happened to it: mlx-watchdog incidents")
        raise SetupError(f"no record for pid {pid} in {record_dir}"
                         " (is it a rank started with MLX_WATCHDOG=1, publishing here? "
                         f"`mlx-watchdog status --dir {record_dir}` lists the ranks)")
    info = describe(*found)
    click.echo(json.dumps(info.to_json(), indent=1) if as_json else render_text(info))
