"""`cluster status`: every node's ranks lined up by job, and the culprit of each."""

from __future__ import annotations

import json
import sys
import time

import click

from watchdog.cli import exits
from watchdog.cli.options import Node, state_option


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
    from watchdog.net import cluster as cluster_view

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
        nodes = cluster_view.gather(peers, timeout)
        # This node's own daemon, read from its status.json: a node cut off from the
        # network (its own address unreachable too) still shows its own ranks.
        local = daemon_status(state_dir)
        if local is not None:
            nodes.append({"peer": "local", "ok": True, "status": local})
        view = cluster_view.analyze(nodes)
        if as_json:
            click.echo(json.dumps(view, indent=1))
        else:
            prefix = "\x1b[H\x1b[2J" if watch else ""
            click.echo(prefix + cluster_view.render_text(view))
        if not watch:
            break
        time.sleep(interval)
    if any(job["state"] in ("hung", "unknown") for job in view["jobs"]):
        sys.exit(exits.VERDICT)
    if not any(node["ok"] for node in view["nodes"]):
        click.echo("mlx-watchdog: no node answered", err=True)
        sys.exit(exits.NO_ANSWER)

