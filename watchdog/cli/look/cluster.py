"""`cluster status`: every node's ranks lined up by job, and the culprit of each."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import click

from watchdog.cli import exits
from watchdog.cli.colour import state as colour_of
from watchdog.cli.colour import wanted as colour_wanted
from watchdog.cli.options import Commands, Duration, Node, dir_option, state_option
from watchdog.status import ClusterView, JobState, JobView
from watchdog.text import plural, printable, who

RANK_COLUMNS = ("RANK", "HOST", "PID", "STATE", "PHASE", "AT", "PROGRESS")


def straggler_lines(job: JobView) -> list[str]:
    """A healthy job held back by one rank: who, by how much, why (judge/stragglers.py)."""
    s = job.straggler
    if s is None:
        return []
    # As `status` says it: one clause after another, the score said for what it is.
    return [f"  straggler: {s.summary}; the job would run {s.slowdown or 1:.2f}x faster "
            "at the others' pace" + (f" (its score {s.score:.2f}: the others' share of time "
                                     "working over its own)" if s.score is not None else "")]


def render_text(view: ClusterView, colour: bool = False) -> str:
    """The cluster view as `cluster status` prints it; states coloured when `colour`."""
    from watchdog.cause import refused, where
    from watchdog.cli.look.status import clash_lines, pace_line
    from watchdog.daemon.judge.cluster import LOCAL

    lines = []
    from watchdog.daemon.judge.cluster import SAMPLED

    for node in view.nodes:
        state = (f"ok ({node.host})" if node.ok else f"DOWN: {node.error}"
                 if node.peer == LOCAL else f"{node.error}: run `mlx-watchdog doctor`"
                 if refused(node.error) else f"UNREACHABLE: {node.error}")
        flag = "  REBOOT REQUIRED" if node.reboot_required else ""
        name = "this node's daemon" if node.peer == LOCAL else f"node {node.peer}"
        if node.peer == SAMPLED:
            name, state = ("this node's records", "sampled here, as `status` does with no "
                           "daemon (judged, nothing acted on)")
        lines.append(printable(f"{name}: {state}{flag}"))
    for job in view.jobs:
        lines.append("")
        owner = f" of uid {job.uid}" if job.uid is not None else ""
        verdict = colour_of(job.state.value.upper(), job.state.value, colour)
        lines.append(printable(f"job {job.job}{owner} ({plural(job.world_size, 'rank')}): ")
                     + verdict)
        rows: list[tuple[str, ...]] = [RANK_COLUMNS]
        for seen in job.ranks:
            r = seen.rank
            rows.append(tuple(printable("-" if cell is None else cell) for cell in (
                r.rank, r.host, r.pid, r.state, r.phase, where(r), r.progress)))
        rows += [(printable(missing), "(not reported)") for missing in job.missing_ranks]
        lines += _rank_rows(rows, colour)
        # Two live ranks claiming one rank of the job (on one node or two): said, as
        # `status` says it, under the rows that show them.
        lines += [f"  {line}" for line in clash_lines([seen.rank for seen in job.ranks])]
        if job.culprit:
            c = job.culprit
            lines.append(printable(f"  culprit: {who(c.rank, c.host or c.node, c.pid)}: "
                                   f"{c.reason or c.state or 'holds the job up'}"))
        if job.cause:
            lines.append(printable(f"  cause: {job.cause}: {job.summary or ''}"))
        if job.evidence:
            lines.append(printable(f"  evidence: {job.evidence}"))
        lines.extend(f"  pace: {line}" for seen in job.ranks
                     if (line := pace_line(seen.rank)) is not None)
        lines.extend(straggler_lines(job))
    if not view.jobs:
        lines.append("no ranks on any reachable node")
    return "\n".join(lines)  # peers' strings are untrusted: each made printable above


def _rank_rows(rows: list[tuple[str, ...]], colour: bool) -> list[str]:
    """A job's ranks under their header, columns aligned (a rank not reported is one
    cell wide); the STATE column coloured."""
    full = [row for row in rows if len(row) == len(RANK_COLUMNS)]
    widths = [max(len(row[i]) for row in full) for i in range(len(RANK_COLUMNS))]
    state_at = RANK_COLUMNS.index("STATE")
    out = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)]
        if n and len(row) == len(RANK_COLUMNS):
            cells[state_at] = colour_of(cells[state_at], row[state_at], colour)
        out.append(("  " + "  ".join(cells)).rstrip())
    return out


@click.group(cls=Commands)
def cluster() -> None:
    """Every node's ranks, lined up by job: which rank holds a job up."""


@cluster.command("status", short_help="Every node's ranks by job, each job judged, and "
                 "the culprit of a hung one.")
@click.argument("peers", nargs=-1)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="MLX_WATCHDOG_CONFIG", help="Take the peers from this config file.")
@click.option("--timeout", type=Duration(0.1), default=2.0, show_default=True,
              help="How long to wait for each node (seconds, or 500ms, 2s).")
@click.option("--json", "as_json", is_flag=True,
              help="The nodes and the judged jobs as one JSON object.")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds.")
@click.option("--interval", type=Duration(0.2), default=2.0, show_default=True,
              help="With --watch: the time between refreshes (seconds, or 500ms, 2s).")
@state_option
@dir_option
@click.pass_obj
def cluster_status(node: Node | None, peers: tuple[str, ...], config_path: str | None,
                   timeout: float, as_json: bool, watch: bool, interval: float,
                   state_dir: str, record_dir: str) -> None:
    """Gather /status from each HOST:PORT (and this node's daemon, read from its state
    directory; with no peers, this node alone) and judge every job; exit 1 if one is
    hung or cannot be checked (a rank behind an unreachable node while another waits
    or has ended, or this node's own daemon down: its records are then sampled here, as
    `status` does), 4 if no node answered (2 is a usage error, as for every command)."""
    from watchdog.daemon.config import ConfigError, load, parse_listen
    from watchdog.daemon.judge import cluster as judge
    from watchdog.daemon.store.snapshot import daemon_status
    from watchdog.net import cluster as asking
    from watchdog.status import NodeAnswer

    peers = tuple(p for item in peers for p in item.replace(",", " ").split())
    for peer in peers:
        try:
            parse_listen(peer)
        except ConfigError:
            raise click.BadParameter(f"{peer!r} is not HOST:PORT (e.g. mac2.local:9753)",
                                     param_hint="PEERS") from None
    named = bool(peers)
    secret = None
    if not peers:  # a configured node needs no arguments
        settings = load(config_path, {}) if config_path else (node or Node(None)).settings
        # Asked as its daemon asks (signed with its secret): one story with its incidents,
        # a node holding another secret said so.
        peers, secret = settings.peers, settings.secret
    # This node is one of the cluster's (its peers from its config, or a daemon ran
    # here): its own daemon down is said, not left out.
    member = not named or os.path.isdir(state_dir)
    listen = _own_listen(record_dir, node)
    while True:
        nodes = asking.gather(peers, timeout, secret) if peers else []
        # This node's own daemon, read from its status.json: a node cut off from the
        # network (its own address unreachable too) still shows its own ranks.
        local = daemon_status(state_dir)
        if local is not None and not any(  # this node's daemon, unless named among them
                n.ok and n.status is not None and n.status.host == local.host
                and n.status.daemon_pid == local.daemon_pid for n in nodes):
            nodes.append(NodeAnswer(judge.LOCAL, True, local))
        elif local is None and member and not _answers_here(nodes, listen):
            nodes.append(NodeAnswer(judge.LOCAL, False, error=(
                f"no daemon publishes in {state_dir}: this node's ranks are not watched; "
                + _START)))
            # Its ranks, read and judged here as `status` does with no daemon: a job hung
            # on this node is shown (and counted) all the same.
            sampled = _sampled(record_dir)
            if sampled is not None:
                nodes.append(NodeAnswer(judge.SAMPLED, True, sampled))
        view = judge.analyze(nodes)
        if as_json:
            click.echo(json.dumps(view.to_json(), indent=1))
        else:
            prefix = "\x1b[H\x1b[2J" if watch else ""
            click.echo(prefix + render_text(view, colour=colour_wanted()))
        if not watch:
            break
        time.sleep(interval)
    if not any(node.ok for node in view.nodes):
        click.echo("mlx-watchdog: no node answered" + (
            "" if peers else " (no peers: name the nodes, HOST:PORT ..., or a --config "
                             "with peers)"), err=True)
        sys.exit(exits.NO_ANSWER)
    if any(job.state in (JobState.HUNG, JobState.UNKNOWN) for job in view.jobs) or any(
            n.peer == judge.LOCAL and not n.ok for n in view.nodes):
        sys.exit(exits.VERDICT)  # this node's own daemon down: its ranks go unwatched


_START = ("start it: sudo systemctl restart mlx-watchdog (macOS: sudo launchctl kickstart -k "
          "system/com.github.mlx-watchdog), or `mlx-watchdog doctor` says what is wrong")


def _own_listen(record_dir: str, node: Node | None) -> str | None:
    """HOST:PORT this node's daemon listens on: its pointer in the record directory
    (left there when it stops), else the node's config."""
    from watchdog.daemon.store import journal

    try:
        pointer = journal.read_pointer(record_dir)
    except OSError:
        pointer = None
    if pointer is not None and pointer.listen:
        return pointer.listen
    try:
        return (node or Node(None)).settings.listen
    except Exception:  # noqa: BLE001 - a bad config: no address known, none matched
        return None


def _addresses(host: str) -> set[str]:
    """The IP addresses `host` resolves to ("" and wildcards: every local interface's)."""
    import psutil

    if host in ("", "0.0.0.0", "::", "*"):  # noqa: S104 - compared, never bound
        return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values()
                for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)}
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return set()


def _answers_here(nodes: list[Any], listen: str | None) -> bool:
    """One of the answers is this node's own daemon (named among the peers), told by
    the address it listens on: daemons on one host share its name (a bed of several on
    one machine), never an address and port."""
    from watchdog.daemon.config import ConfigError, parse_listen

    if not listen:
        return False
    try:
        host, port = parse_listen(listen)
    except ConfigError:
        return False
    mine = _addresses(host)
    for n in nodes:
        if not n.ok:
            continue
        try:
            peer_host, peer_port = parse_listen(n.peer)
        except ConfigError:
            continue
        if peer_port == port and _addresses(peer_host) & mine:
            return True
    return False


def _sampled(record_dir: str) -> Any:
    """This node's ranks read and judged here (a `status.NodeStatus`), as `status` does
    with no daemon; None when there is no record directory to read."""
    from watchdog.cli.look.sampling import sample_ranks
    from watchdog.cli.look.status import _rules
    from watchdog.status import NodeStatus

    if not os.path.isdir(record_dir):
        return None
    try:
        ranks, _ = sample_ranks(record_dir, _rules(None))
    except Exception:  # noqa: BLE001 - what cannot be read is left out, as unwatched
        return None
    return NodeStatus(host=socket.gethostname(), ranks=tuple(ranks), dir=record_dir)
