"""`cluster status`: every node's ranks lined up by job, and the culprit of each."""

from __future__ import annotations

import json
import sys
import time

import click

from watchdog.cli import exits
from watchdog.cli.options import Node, state_option
from watchdog.status import ClusterView, JobState, JobView
from watchdog.text import printable


def straggler_lines(job: JobView) -> list[str]:
    """A healthy job held back by one rank: who, by how much, why (judge/stragglers.py)."""
    s = job.straggler
    if s is None:
        return []
    return [f"  straggler: {s.summary} (the job would run {s.slowdown or 1:.2f}x faster "
            "at the others' pace)"]


def render_text(view: ClusterView) -> str:
    """The cluster view as `cluster status` prints it."""
    lines = []
    for node in view.nodes:
        state = f"ok ({node.host})" if node.ok else f"UNREACHABLE: {node.error}"
        flag = "  REBOOT REQUIRED" if node.reboot_required else ""
        lines.append(f"node {node.peer}: {state}{flag}")
    for job in view.jobs:
        lines.append("")
        owner = f" of uid {job.uid}" if job.uid is not None else ""
        lines.append(f"job {job.job}{owner} ({job.world_size} ranks): "
                     f"{job.state.value.upper()}")
        for seen in job.ranks:
            r, last = seen.rank, seen.rank.last_collective
            at = f"{last.op} #{last.number}" if last is not None else "no collective yet"
            lines.append(f"  rank {r.rank}  {r.host} pid {r.pid}  {r.state}  {r.phase}  "
                         f"at {at}  progress {r.progress}")
        for missing in job.missing_ranks:
            lines.append(f"  rank {missing}  (not reported)")
        if job.culprit:
            c = job.culprit
            lines.append(f"  culprit: rank {c.rank} on {c.host or c.node or '?'}"
                         f" (pid {c.pid}): {c.reason}")
        if job.cause:
            lines.append(f"  cause: {job.cause}: {job.summary or ''}")
        if job.evidence:
            lines.append(f"  evidence: {job.evidence}")
        lines.extend(straggler_lines(job))
    if not view.jobs:
        lines.append("no ranks on any reachable node")
    return "\n".join(printable(line) for line in lines)  # peers' strings are untrusted


@click.group()
def cluster() -> None:
    """Every node's ranks, lined up by job: which rank holds a job up."""


@cluster.command("status")
@click.argument("peers", nargs=-1)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="MLX_WATCHDOG_CONFIG", help="Take the peers from this config file.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds to wait for each node.")
@click.option("--json", "as_json", is_flag=True,
              help="The nodes and the judged jobs as one JSON object.")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@state_option
@click.pass_obj
def cluster_status(node: Node | None, peers: tuple[str, ...], config_path: str | None,
                   timeout: float, as_json: bool, watch: bool, interval: float,
                   state_dir: str) -> None:
    """Gather /status from each HOST:PORT (and this node's daemon, read from its state
    directory) and judge every job; exit 1 if one is hung or cannot be checked (a rank
    behind an unreachable node while another waits or has ended), 4 if no node answered
    (2 is a usage error, as for every command)."""
    from watchdog.cli.look.sampling import daemon_status
    from watchdog.daemon.config import ConfigError, load, parse_listen
    from watchdog.daemon.judge import cluster as judge
    from watchdog.net import cluster as asking
    from watchdog.status import NodeAnswer

    peers = tuple(p for item in peers for p in item.replace(",", " ").split())
    for peer in peers:
        try:
            parse_listen(peer)
        except ConfigError:
            raise click.BadParameter(f"{peer!r} is not HOST:PORT (e.g. mac2.local:9753)",
                                     param_hint="PEERS") from None
    if not peers:  # a configured node needs no arguments
        settings = load(config_path, {}) if config_path else (node or Node(None)).settings
        peers = settings.peers
    if not peers:
        raise click.UsageError("name the nodes (HOST:PORT ...) or a --config with peers")
    while True:
        nodes = asking.gather(peers, timeout)
        # This node's own daemon, read from its status.json: a node cut off from the
        # network (its own address unreachable too) still shows its own ranks.
        local = daemon_status(state_dir)
        if local is not None:
            nodes.append(NodeAnswer(judge.LOCAL, True, local))
        view = judge.analyze(nodes)
        if as_json:
            click.echo(json.dumps(view.to_json(), indent=1))
        else:
            prefix = "\x1b[H\x1b[2J" if watch else ""
            click.echo(prefix + render_text(view))
        if not watch:
            break
        time.sleep(interval)
    if any(job.state in (JobState.HUNG, JobState.UNKNOWN) for job in view.jobs):
        sys.exit(exits.VERDICT)
    if not any(node.ok for node in view.nodes):
        click.echo("mlx-watchdog: no node answered", err=True)
        sys.exit(exits.NO_ANSWER)

