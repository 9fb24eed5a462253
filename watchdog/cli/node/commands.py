"""`incidents`, `node` and `doctor`: what the watchdog did here, this node's reboot flag,
and what to fix in its setup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click

from watchdog.cli.exits import SetupError
from watchdog.cli.options import (
    STATE_ENV,
    Commands,
    Duration,
    lenient_dir_option,
    lenient_state_option,
    state_option,
)
from watchdog.daemon.config import Settings
from watchdog.daemon.store import journal
from watchdog.status import ABSENT, Incident, LaunchEvent, NativeHot
from watchdog.text import plural, printable, who


def _existing_state_dir(state_dir: str) -> None:
    if not os.path.isdir(state_dir):
        raise SetupError(f"state directory {state_dir} does not exist (set "
                                   f"--state-dir or {STATE_ENV}; the daemon creates it)")


@click.command()
@state_option
@click.option("--json", "as_json", is_flag=True, help="One JSON list of the incidents.")
@click.option("--last", type=click.IntRange(min=1),
              help="Only the last N incidents (and what `launch` did from the first of "
                   "them on).")
def incidents(state_dir: str, as_json: bool, last: int | None) -> None:
    """The incident journal: what the watchdog found and did, and what `launch` did
    about it (restarts, refusals, give-ups)."""
    _existing_state_dir(state_dir)
    if as_json:  # the journals' lines as written, with the launcher's events
        lines, bad = journal.read_lines(os.path.join(state_dir, journal.INCIDENTS))
        items = sorted(lines + _launch_lines(state_dir),
                       key=lambda item: float(item.get("time") or 0)
                       if isinstance(item.get("time"), (int, float)) else 0.0)
        _warn(bad)
        click.echo(json.dumps(_last(items, last, lambda item: item.get("kind") != "launch"),
                              indent=1))
        return
    found, bad = journal.read_incidents(state_dir)
    shown: list[Incident | LaunchEvent] = sorted(
        [*found, *_launch_events(state_dir)], key=_when)
    _warn(bad)
    shown = [i for i in _last(shown, last, lambda item: isinstance(item, Incident))
             if isinstance(i, Incident) or i.event in SHOWN_EVENTS]
    if not shown:
        click.echo("no incidents")
        return
    for item in shown:
        if isinstance(item, Incident):
            _echo_incident(item, state_dir)
        else:
            _echo_launch_event(item)


def _last(items: list[Any], last: int | None, is_incident: Callable[[Any], bool]) -> list[Any]:
    """`--last N` of a list in time order: from the N-th incident from the end on (the
    launcher's events among them and after them kept; none counted)."""
    if not last:
        return items
    at = [i for i, item in enumerate(items) if is_incident(item)]
    return items[at[-last]:] if len(at) >= last else items[at[0]:] if at else []


def _when(item: Incident | LaunchEvent) -> float:
    return item.time if isinstance(item.time, (int, float)) else 0.0


def _warn(bad: int) -> None:
    if bad:
        click.echo(f"warning: {bad} malformed lines skipped", err=True)


# The launcher's events shown among the incidents; "launch" and "ended" only with --json.
SHOWN_EVENTS = ("restart", "refused", "gave_up")


def _journal_dirs(state_dir: str) -> tuple[str, ...]:
    """The launcher's journals: here, and this user's own when a launch by this user
    could not write here (launchlog.journal_dir)."""
    from watchdog.daemon.store import launchlog

    return tuple(dict.fromkeys((state_dir, launchlog.journal_dir(state_dir))))


def _launch_events(state_dir: str) -> list[LaunchEvent]:
    from watchdog.daemon.store import launchlog

    return [event for directory in _journal_dirs(state_dir)
            for event in launchlog.read(directory)[0]]


def _launch_lines(state_dir: str) -> list[dict[str, Any]]:
    """The launcher's events as written, each marked as one (`incidents --json`)."""
    from watchdog.daemon.store import launchlog

    return [{**line, "kind": "launch"} for directory in _journal_dirs(state_dir)
            for line in launchlog.read_lines(directory)[0]]


def _said(value: object, absent: object = "") -> object:
    """A fact of an event as shown: `absent` when the event does not carry it."""
    return absent if value is ABSENT else value


def _local_time(when: float) -> str:
    """A time as a person reads it: local, with its zone."""
    return datetime.fromtimestamp(when).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _echo_launch_event(event: LaunchEvent) -> None:
    when = _local_time(_when(event))
    what = {"restart": "relaunched as attempt", "refused": "refused attempt",
            "gave_up": "gave up after attempt"}[event.event]
    job, attempt = _said(event.job, None), _said(event.attempt, None)
    click.echo(printable(f"{when}  launch" + (f"  job {job}" if job is not None else "")
                         + f"  {what}" + (f" {attempt}" if attempt is not None else "")))
    click.echo(printable(f"    {_said(event.reason)}"))


def _echo_incident(inc: Incident, state_dir: str) -> None:
    when = _local_time(inc.time)
    ranks = ",".join(str(r.rank) for r in inc.ranks)
    attempt = f" attempt {inc.attempt}" if inc.attempt is not None else ""
    label = "rank" if len(inc.ranks) == 1 else "ranks"
    lines = [f"{when}  {inc.id}  job {inc.job}{attempt}  {inc.verdict}  "
             f"{label} {ranks}  {inc.action or ''}".rstrip()]
    if inc.cause:  # the line a person reads first
        lines.append(f"    {inc.cause}: {inc.summary or ''}")
    lines.append(f"    {inc.reason or ''}")
    if inc.culprit:
        c = inc.culprit
        lines.append(f"    culprit: {who(c.rank, c.host, c.pid)}: {c.reason or c.state or ''}")
    outcome = ", ".join(f"{pid}:{res}" for pid, res in (inc.outcome or {}).items())
    if outcome:
        lines.append(f"    outcome: {outcome}")
    if inc.reboot_required:
        lines.append(f"    REBOOT REQUIRED: {inc.reboot_required}")
    if inc.evidence:
        folder = os.path.join(state_dir, "evidence", inc.id)
        # Root's (mode 700): a job's owner is told how to read it, not shown a path
        # that answers "Permission denied".
        private = os.path.isdir(folder) and not os.access(folder, os.R_OK | os.X_OK)
        lines.append(f"    evidence: {folder}/ ({plural(len(inc.evidence), 'file')})"
                     + (f"; root only (it holds every rank's stacks): sudo ls {folder}"
                        if private else ""))
    lines += _native_hot_lines(inc.native_hot)
    for line in lines:
        click.echo(printable(line))  # record strings are untrusted: one line each


def _native_hot_lines(hot: tuple[NativeHot, ...] | None, threads: int = 4) -> list[str]:
    """The parsed native stacks (macOS `sample`): each rank's hottest threads."""
    from watchdog.daemon.probes.samplegraph import summary_line

    lines = []
    for entry in hot or ():
        head = f"    native stacks, rank {entry.rank} pid {entry.pid}"
        if entry.error:
            lines.append(f"{head}: {entry.error}")
            continue
        lines.append(f"{head}:")
        lines += [f"      {summary_line(thread)}" for thread in (entry.threads or ())[:threads]]
    return lines


@click.group(cls=Commands)
def node() -> None:
    """This node's reboot flag and wired memory."""


@node.command("status")
@state_option
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: the reboot flag, the daemon, wired memory.")
def node_status(state_dir: str, as_json: bool) -> None:
    """Is this node flagged for reboot?"""
    _existing_state_dir(state_dir)
    from watchdog.daemon.store.snapshot import daemon_status

    flag = journal.reboot_flag(state_dir)
    snap = daemon_status(state_dir)
    wired = snap.wired_bytes if snap else None
    baseline = snap.wired_baseline_bytes if snap else None
    info = {"reboot_required": flag is not None, "reboot": flag.to_json() if flag else None,
            "daemon_running": snap is not None, "wired_bytes": wired,
            "wired_baseline_bytes": baseline}
    if as_json:
        click.echo(json.dumps(info, indent=1))
    else:
        click.echo("reboot required: " + (f"YES ({printable(flag.why)})" if flag else "no"))
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
@click.option("--timeout", type=Duration(0), default=None,
              help="How long to wait for a fit node before refusing (seconds, or 90s, 5m) "
                   "[default: the config's health_timeout, 120].")
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

    from watchdog.launch.health import wait_healthy
    from watchdog.launch.relaunch import EXIT_REFUSED

    _existing_state_dir(state_dir)  # no daemon has ever run here: not known to be fit
    settings = dataclasses.replace(node_.settings, state_dir=state_dir)
    health = wait_healthy(settings, node_.launch.health_timeout if timeout is None else timeout,
                          on_wait=lambda problem: click.echo(printable(
                              f"mlx-watchdog: waiting for a fit node: {problem}"), err=True))
    for note in health.notes:
        if not quiet:
            click.echo(printable(f"mlx-watchdog: note: {note}"), err=True)
    if health.problem is not None:
        click.echo(printable(f"mlx-watchdog: node not fit: {health.problem}"), err=True)
        sys.exit(EXIT_REFUSED)
    if not quiet:
        click.echo("node fit to start a job", err=True)


@click.command()
@lenient_dir_option
@lenient_state_option
@click.option("--listen", default=None,
              help="Where the daemon serves /healthz and /status "
                   f"[default: the config's listen, else {Settings().listen}].")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: each check's name, level and message, and whether any "
                   "failed (for checking a fleet).")
@click.option("--mac-check", is_flag=True,
              help="On a Mac (run as root): start a small MLX job and measure what only "
                   "the hardware tells (threads, sample, ioreg's GPU time, powermetrics, a "
                   "save's bytes, wired memory), each beside what the daemon assumes.")
@click.option("--report", "report_path", default=None, metavar="FILE",
              help="With --mac-check: write the JSON report there.")
@click.pass_obj
def doctor(node_: Any, record_dir: str, state_dir: str, listen: str | None,
           as_json: bool, mac_check: bool = False, report_path: str | None = None) -> None:
    """Check this node's setup and say what to fix.

    Its directories, the daemon on the port (and the directories it watches), this
    environment, the config file (the fence secret and who may read it) and each peer
    (resolves, answers, its clock, the secret). Exits 1 when a check failed: a bad
    config, or no daemon answering on a node whose config or service says it runs one.
    With --mac-check, a Mac's first hour instead (docs/macos.md)."""
    from watchdog.cli.exits import OK, SETUP, VERDICT
    from watchdog.cli.node.doctor import named_checks

    if mac_check:
        from watchdog.cli.node.maccheck import run_check

        try:
            figures, report = run_check(report_path)
        except (RuntimeError, OSError, subprocess.SubprocessError) as err:
            click.echo(printable(f"mlx-watchdog: {err}"), err=True)
            sys.exit(SETUP)
        if as_json:
            click.echo(json.dumps(report, indent=1))
        else:
            click.echo(f"mac check on {report['platform']} ({report['python']})")
            for f in figures:
                click.echo(printable(f"[{f.level.upper():4}] {f.check}: {f.measured}  "
                                     f"(the daemon assumes: {f.assumes})"))
            if report_path:
                click.echo(f"report: {report_path}")
        sys.exit(OK if report["ok"] else VERDICT)

    # A bad config is a failed check, the rest run with its good keys: the one node a
    # fleet loop meant to diagnose still answers with JSON.
    settings, errors = node_.lenient_settings() if node_ is not None else (Settings(), [])
    path = node_.config_path if node_ is not None and node_.readable else None
    lines = named_checks(record_dir, state_dir, listen or settings.listen, path, settings,
                         tuple(errors))
    failed = any(level == "fail" for _, level, _ in lines)
    if as_json:
        click.echo(json.dumps({"host": os.uname().nodename, "ok": not failed, "checks": [
            {"check": name, "level": level, "message": message}
            for name, level, message in lines]}, indent=1))
    else:  # a peer's host and version, a listener's directories: any byte at all
        for _, level, message in lines:
            click.echo(f"[{level.upper():4}] {printable(message)}")
    sys.exit(VERDICT if failed else OK)
