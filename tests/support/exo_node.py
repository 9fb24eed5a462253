"""An exo node, as far as the watchdog can tell: `python -m tests.support.exo_node ...`.

Faithful to how exo (github.com/exo-explore/exo at b5375f8) launches, blocks and
supervises its MLX runners, with nothing of exo installed (exo needs Python 3.13):

- The node is a long-lived process that imports mlx.core (exo's worker does) and never
  waits on MLX itself. Its runner is a `multiprocessing` spawn child that inherits the
  node's environment (MLX_WATCHDOG=1, MLX_WATCHDOG_DIR), as exo's runner supervisor
  starts its runners.
- The runner seeds MLX (`mx.random.seed(42)`), then, in `mlx_distributed_init`'s way,
  writes its node's own hostfile `hosts_<instance id>_<rank>.json` in a temporary
  directory (own slot `0.0.0.0:<port>`, the peer as this node reaches it), sets
  MLX_HOSTFILE and MLX_RANK in os.environ right before
  `mx.distributed.init(backend="ring", strict=True)`, and deletes the directory after.
- It warms up (a few evaluated all_sums: exo generates a few tokens), then waits for
  tasks on its pipe from the node (no MLX call while idle, as exo's runner waits on its
  task channel). A task is `generate N` (N steps of an evaluated all_sum, ~20 ms apart,
  like decode steps) or `generate forever`, which runs until the next task arrives.
- When its runner dies, the node starts the next instance's runner (exo's master
  recreates a dead instance with a new instance id and new ports): instance
  `<instance>-<k>` on port `<port> + k`, the same on every node, up to `--restarts`.

The test is exo's API client: it drops `request-<n>` files (one task a line) into the
node's directory; the node hands each new one to its runner. Each runner writes
`runner-<instance>.json` (its pid, rank, instance) once warmed up, and
`steps-<instance>` (steps done) as it generates; the node writes `ended-<instance>` (the
runner's pid, exit code and the wall time the node saw it end) and logs to stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

WARMUP = 5  # evaluated all_sums before the runner reports ready (exo generates a few tokens)


def runner(conn: Connection, rank: int, peer: str, port: int, instance: str,
           workdir: str) -> None:
    import mlx.core as mx

    mx.random.seed(42)
    with tempfile.TemporaryDirectory() as tmpdir:
        path = Path(tmpdir) / f"hosts_{instance}_{rank}.json"
        hosts = [f"0.0.0.0:{port}", f"{peer}:{port}"]
        if rank == 1:
            hosts.reverse()
        path.write_text(json.dumps(hosts, separators=(",", ":")))
        os.environ["MLX_HOSTFILE"] = str(path)
        os.environ["MLX_RANK"] = str(rank)
        group = mx.distributed.init(backend="ring", strict=True)
    x = mx.ones((256,))
    for _ in range(WARMUP):
        mx.eval(mx.distributed.all_sum(x, group=group))
    out = Path(workdir)
    (out / f"runner-{instance}.json").write_text(json.dumps(
        {"pid": os.getpid(), "rank": rank, "instance": instance, "size": group.size()}))
    steps = 0
    task = conn.recv()  # idle: waiting for a task, no MLX call
    while True:
        kind, _, count = task.partition(" ")
        forever = count == "forever"
        todo = 0 if forever else int(count or 0)
        while forever or todo > 0:
            y = mx.distributed.all_sum(x, group=group)
            mx.eval(y)
            if float(y[0].item()) != group.size():
                raise SystemExit(f"wrong all_sum: {y[0].item()}")
            steps += 1
            todo -= 1
            (out / f"steps-{instance}").write_text(str(steps))
            time.sleep(0.02)
            if forever and conn.poll():
                break
        task = conn.recv()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--peer", required=True, help="the other node's address")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--restarts", type=int, default=1)
    args = parser.parse_args()

    import mlx.core  # noqa: F401 - exo's worker imports MLX; it never waits on it

    ctx = multiprocessing.get_context("spawn")
    workdir = Path(args.workdir)
    handled: set[str] = set()
    for attempt in range(args.restarts + 1):
        instance = args.instance if attempt == 0 else f"{args.instance}-{attempt}"
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=runner, args=(theirs, args.rank, args.peer,
                                                args.port + attempt, instance, str(workdir)))
        proc.start()
        print(f"node: runner {proc.pid} for instance {instance}", flush=True)
        while proc.is_alive():
            for request in sorted(workdir.glob("request-*")):
                if request.name not in handled:
                    handled.add(request.name)
                    for line in request.read_text().splitlines():
                        if line.strip():
                            ours.send(line.strip())
            proc.join(0.1)
        ended = time.time()
        print(f"node: runner {proc.pid} of instance {instance} ended ({proc.exitcode})",
              flush=True)
        # When, as exo's supervisor sees it (the runner's pipe closed): what exo makes of
        # its runners' ends depends on their order across nodes (docs/exo.md).
        (workdir / f"ended-{instance}").write_text(json.dumps(
            {"pid": proc.pid, "time": ended, "exitcode": proc.exitcode}))
        ours.close()
        time.sleep(0.5)  # exo's master notices, then places the instance again


if __name__ == "__main__":
    main()
