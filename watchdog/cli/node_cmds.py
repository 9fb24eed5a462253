"""`incidents` and `node`: what the watchdog did here, and this node's reboot flag."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from typing import Any

import click

from watchdog.cli.options import STATE_ENV, state_option
from watchdog.daemon import journal
from watchdog.text import printable


def _existing_state_dir(state_dir: str) -> None:
    if not os.path.isdir(state_dir):
        raise click.ClickException(f"state directory {state_dir} does not exist (set "
                                   f"--state-dir or {STATE_ENV}; the daemon creates it)")


@click.command()
@state_option
@click.option("--json", "as_json", is_flag=True)
@click.option("--last", type=click.IntRange(min=1), help="Only the last N incidents.")
def incidents(state_dir: str, as_json: bool, last: int | None) -> None:
    """The incident journal: what the watchdog found and did."""
    _existing_state_dir(state_dir)
    items, bad = journal.read_incidents(state_dir)
    if last:
        items = items[-last:]
    if bad:
        click.echo(f"warning: {bad} malformed lines skipped", err=True)
    if as_json:
        click.echo(json.dumps(items, indent=1))
        return
    if not items:
        click.echo("no incidents")
        return
    for inc in items:
        _echo_incident(inc)


def _echo_incident(inc: dict[str, Any]) -> None:
    when = datetime.fromtimestamp(float(inc.get("time", 0))).strftime("%Y-%m-%d %H:%M:%S")
    ranks = ",".join(str(r.get("rank")) for r in inc.get("ranks", []))
    lines = [f"{when}  {inc.get('id')}  job {inc.get('job')}  {inc.get('verdict')}  "
             f"ranks {ranks}  {inc.get('action', '')}", f"    {inc.get('reason', '')}"]
    if inc.get("culprit"):
        c = inc["culprit"]
        lines.append(f"    culprit: rank {c.get('rank')} pid {c.get('pid')} on {c.get('host')}: "
                     f"{c.get('reason')}")
    outcome = ", ".join(f"{pid}:{res}" for pid, res in (inc.get("outcome") or {}).items())
    if outcome:
        lines.append(f"    outcome: {outcome}")
    if inc.get("reboot_required"):
        lines.append(f"    REBOOT REQUIRED: {inc['reboot_required']}")
    lines += _native_hot_lines(inc.get("native_hot"))
    for line in lines:
        click.echo(printable(line))  # record strings are untrusted: one line each


def _native_hot_lines(hot: Any, threads: int = 4) -> list[str]:
    """The parsed native stacks (macOS `sample`): each rank's hottest threads."""
    from watchdog.daemon.samplegraph import summary_line

    lines = []
    for entry in hot if isinstance(hot, list) else []:
        if not isinstance(entry, dict):
            continue
        head = f"    native stacks, rank {entry.get('rank')} pid {entry.get('pid')}"
        if entry.get("error"):
            lines.append(f"{head}: {entry['error']}")
            continue
        lines.append(f"{head}:")
        for thread in (entry.get("threads") or [])[:threads]:
            try:
                lines.append(f"      {summary_line(thread)}")
            except (AttributeError, KeyError, TypeError):
                continue  # a hand-edited or foreign journal line: show the rest
    return lines


@click.group()
def node() -> None:
    """This node's reboot flag and wired memory."""


@node.command("status")
@state_option
@click.option("--json", "as_json", is_flag=True)
def node_status(state_dir: str, as_json: bool) -> None:
    """Is this node flagged for reboot?"""
    _existing_state_dir(state_dir)
    from watchdog.cli.sampling import daemon_status

    flag = journal.reboot_flag(state_dir)
    snap = daemon_status(state_dir) or {}
    info = {"reboot_required": flag is not None, "reboot": flag,
            "daemon_running": bool(snap), "wired_bytes": snap.get("wired_bytes"),
            "wired_baseline_bytes": snap.get("wired_baseline_bytes")}
    if as_json:
        click.echo(json.dumps(info, indent=1))
    else:
        click.echo("reboot required: " + (f"YES ({flag.get('reason')})" if flag else "no"))
        click.echo(f"daemon: {'running' if snap else 'not running'}")
        if snap.get("wired_bytes") is not None:
            click.echo(f"wired memory: {snap['wired_bytes'] / 2**20:.0f} MiB "
                       f"(baseline {(snap.get('wired_baseline_bytes') or 0) / 2**20:.0f} MiB)")
    if flag:
        sys.exit(1)


@node.command("clear-reboot")
@state_option
def clear_reboot(state_dir: str) -> None:
    """Clear the reboot flag (after rebooting the node)."""
    _existing_state_dir(state_dir)
    try:
        cleared = journal.clear_reboot_flag(state_dir)
    except PermissionError:
        raise click.ClickException(f"permission denied in {state_dir} (run as root)") from None
    click.echo("reboot flag cleared" if cleared else "no reboot flag was set")

