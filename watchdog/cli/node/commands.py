"""`incidents`, `node` and `doctor`: what the watchdog did here, this node's reboot flag,
and what to fix in its setup."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from typing import Any

import click

from watchdog.cli.exits import SetupError
from watchdog.cli.options import STATE_ENV, dir_option, state_option
from watchdog.daemon.config import Settings
from watchdog.daemon.store import journal
from watchdog.status import Incident
from watchdog.text import printable


def _existing_state_dir(state_dir: str) -> None:
    if not os.path.isdir(state_dir):
        raise SetupError(f"state directory {state_dir} does not exist (set "
                                   f"--state-dir or {STATE_ENV}; the daemon creates it)")


@click.command()
@state_option
@click.option("--json", "as_json", is_flag=True, help="One JSON list of the incidents.")
@click.option("--last", type=click.IntRange(min=1), help="Only the last N incidents.")
def incidents(state_dir: str, as_json: bool, last: int | None) -> None:
    """The incident journal: what the watchdog found and did, and what `launch` did
    about it (restarts, refusals, give-ups)."""
    _existing_state_dir(state_dir)
    items, bad = journal.read_incidents(state_dir)
    items += _launch_events(state_dir)
    items.sort(key=lambda item: float(item.get("time") or 0)
               if isinstance(item.get("time"), (int, float)) else 0.0)
    if last:
        items = items[-last:]
    if bad:
        click.echo(f"warning: {bad} malformed lines skipped", err=True)
    if as_json:
        click.echo(json.dumps(items, indent=1))
        return
    items = [i for i in items if i.get("kind") != "launch" or i.get("event") in SHOWN_EVENTS]
    if not items:
        click.echo("no incidents")
        return
    for inc in items:
        if inc.get("kind") == "launch":
            _echo_launch_event(inc)
        else:
            _echo_incident(_incident(inc))


# The launcher's events shown among the incidents; "launch" and "ended" only with --json.
SHOWN_EVENTS = ("restart", "refused", "gave_up")


def _launch_events(state_dir: str) -> list[dict[str, Any]]:
    """The launcher's journal here, and this user's own when a launch by this user
    could not write here (launchlog.journal_dir)."""
    from watchdog.daemon.store import launchlog

    events = []
    for directory in dict.fromkeys((state_dir, launchlog.journal_dir(state_dir))):
        events += [{**event, "kind": "launch"} for event in launchlog.read(directory)[0]]
    return events


def _echo_launch_event(event: dict[str, Any]) -> None:
    when = datetime.fromtimestamp(float(event.get("time", 0))).strftime("%Y-%m-%d %H:%M:%S")
    what = {"restart": "relaunched as attempt", "refused": "refused attempt",
            "gave_up": "gave up after attempt"}[str(event["event"])]
    click.echo(printable(f"{when}  launch  job {event.get('job')}  {what} "
                         f"{event.get('attempt')}"))
    click.echo(printable(f"    {event.get('reason', '')}"))


def _incident(line: dict[str, Any]) -> Incident:
    """A journal line read through the contract; one without an id (edited by hand)
    is still shown."""
    return Incident.from_json(line if isinstance(line.get("id"), str)
                              else {**line, "id": str(line.get("id"))})


def _echo_incident(inc: Incident) -> None:
    when = datetime.fromtimestamp(inc.time).strftime("%Y-%m-%d %H:%M:%S")
    ranks = ",".join(str(r.rank) for r in inc.ranks)
    attempt = f" attempt {inc.attempt}" if inc.attempt is not None else ""
    lines = [f"{when}  {inc.id}  job {inc.job}{attempt}  {inc.verdict}  "
             f"ranks {ranks}  {inc.action or ''}"]
    if inc.cause:  # the line a person reads first
        lines.append(f"    {inc.cause}: {inc.summary or ''}")
    lines.append(f"    {inc.reason or ''}")
    if inc.culprit:
        c = inc.culprit
        lines.append(f"    culprit: rank {c.rank} pid {c.pid} on {c.host}: {c.reason}")
    outcome = ", ".join(f"{pid}:{res}" for pid, res in (inc.outcome or {}).items())
    if outcome:
        lines.append(f"    outcome: {outcome}")
    if inc.reboot_required:
        lines.append(f"    REBOOT REQUIRED: {inc.reboot_required}")
    lines += _native_hot_lines(list(inc.native_hot) if inc.native_hot else None)
    for line in lines:
        click.echo(printable(line))  # record strings are untrusted: one line each


def _native_hot_lines(hot: Any, threads: int = 4) -> list[str]:
    """The parsed native stacks (macOS `sample`): each rank's hottest threads."""
    from watchdog.daemon.probes.samplegraph import summary_line

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
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: the reboot flag, the daemon, wired memory.")
def node_status(state_dir: str, as_json: bool) -> None:
    """Is this node flagged for reboot?"""
    _existing_state_dir(state_dir)
    from watchdog.cli.look.sampling import daemon_status

    flag = journal.reboot_flag(state_dir)
    snap = daemon_status(state_dir)
    wired = snap.wired_bytes if snap else None
    baseline = snap.wired_baseline_bytes if snap else None
    info = {"reboot_required": flag is not None, "reboot": flag,
            "daemon_running": snap is not None, "wired_bytes": wired,
            "wired_baseline_bytes": baseline}
    if as_json:
        click.echo(json.dumps(info, indent=1))
    else:
        click.echo("reboot required: " + (f"YES ({flag.get('reason')})" if flag else "no"))
        click.echo(f"daemon: {'running' if snap else 'not running'}")
        if wired is not None:
            click.echo(f"wired memory: {wired / 2**20:.0f} MiB "
                       f"(baseline {(baseline or 0) / 2**20:.0f} MiB)")
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
        raise SetupError(f"permission denied in {state_dir} (run as root)") from None
    click.echo("reboot flag cleared" if cleared else "no reboot flag was set")



@node.command("wait-healthy")
@state_option
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Seconds to wait for a fit node before refusing [the config's "
                   "health_timeout, 120].")
@click.option("--quiet", "-q", is_flag=True, help="Say nothing when the node is fit.")
@click.pass_obj
def wait_healthy_cmd(node_: Any, state_dir: str, timeout: float | None, quiet: bool) -> None:
    """Wait until this node is fit to start a job on, else exit 12.

    Fit: no reboot flag here or on a configured peer, and wired memory back
    near the daemon's idle baseline. For a launchd `KeepAlive` or systemd
    `Restart=always` service, as its first step (`ExecStartPre=`), so a crash
    loop never starts a server into a node that needs a reboot.
    """
    import dataclasses

    from watchdog.cli.launch.relaunch import EXIT_REFUSED
    from watchdog.cli.node.health import wait_healthy

    _existing_state_dir(state_dir)  # no daemon has ever run here: not known to be fit
    settings = dataclasses.replace(node_.settings, state_dir=state_dir)
    health = wait_healthy(settings, settings.health_timeout if timeout is None else timeout,
                          on_wait=lambda problem: click.echo(
                              f"mlx-watchdog: waiting for a fit node: {problem}", err=True))
    for note in health.notes:
        if not quiet:
            click.echo(f"mlx-watchdog: note: {note}", err=True)
    if health.problem is not None:
        click.echo(f"mlx-watchdog: node not fit: {health.problem}", err=True)
        sys.exit(EXIT_REFUSED)
    if not quiet:
        click.echo("node fit to start a job", err=True)


@click.command()
@dir_option
@state_option
@click.option("--listen", default=Settings().listen, show_default=True,
              help="Where the daemon serves /healthz (its listen setting).")
def doctor(record_dir: str, state_dir: str, listen: str) -> None:
    """Check this node's setup and say what to fix."""
    from watchdog.cli.node.doctor import run_checks

    worst = 0
    for level, message in run_checks(record_dir, state_dir, listen):
        worst = max(worst, {"ok": 0, "warn": 1, "fail": 2}[level])
        click.echo(f"[{level.upper():4}] {message}")
    sys.exit(1 if worst == 2 else 0)
