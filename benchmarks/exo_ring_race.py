"""exo's ring connect, reduced: does a rank-0 runner's report leave its process before
MLX's ring init blocks? (issue 46's one stall; docs/exo.md, "A ring that never connects")

    sudo EXO_BASE=/tmp/exo-i46 python3 -m benchmarks.exo_ring_race --trials 20

Needs the exo bed built by ../shared/exo-bed/setup.sh (its chroot's Python 3.13, mlx and
exo), and root (it mounts proc, dev and sys into the chroot while it runs, if they are
not, and unmounts what it mounted). Not a CI test.

Per trial, a spawned child does what exo's runner does on `ConnectToGroup`, with exo's
own `mp_channel` (a multiprocessing.Queue: `send` appends to a buffer that a feeder
thread writes to the pipe when it gets the GIL): it reports idle, 0.5 s later sends
Running, Connecting and Acknowledged, logs, writes a hostfile and calls
`mx.distributed.init(backend="ring")` as rank 0 of 2 with no peer, so it blocks in
`accept()`. The parent reads the channel for 3.5 s: a trial stalls when an event sent
before `init` never arrives (MLX keeps the GIL in `accept()`, the feeder never runs).
Run without and with the mlx-watchdog hook loaded (`MLX_WATCHDOG=1`); one line each."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, multiprocessing as mp, os, sys, tempfile, time
from exo.utils.channels import mp_channel

def child(tx, port):
    import mlx.core as mx
    tx.send(("Idle",))
    time.sleep(0.5)
    tx.send(("Running",))
    sys.stderr.write("runner connecting\n"); sys.stderr.flush()
    tx.send(("Connecting",))
    tx.send(("Ack",))
    sys.stderr.write("Starting initialization for rank 0\n"); sys.stderr.flush()
    with tempfile.TemporaryDirectory() as d:
        hf = os.path.join(d, "hosts.json")
        with open(hf, "w") as f:
            f.write(json.dumps(["0.0.0.0:%d" % port, "127.0.0.2:%d" % (port + 1)]))
        os.environ["MLX_HOSTFILE"] = hf
        os.environ["MLX_RANK"] = "0"
        mx.distributed.init(backend="ring", strict=True)

if __name__ == "__main__":
    mp.set_start_method("spawn")
    trials, stalled = int(sys.argv[1]), 0
    for i in range(trials):
        tx, rx = mp_channel()
        p = mp.Process(target=child, args=(tx, 47400 + 2 * (i % 200)), daemon=True)
        p.start()
        got, t0 = [], time.time()
        while time.time() - t0 < 3.5 and len(got) < 4:
            try:
                got.append(rx.receive_nowait()[0])
            except Exception:
                time.sleep(0.05)
        stalled += len(got) < 4
        p.kill()
        p.join()
    print(stalled)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    root = Path(os.environ.get("EXO_BASE", "/tmp/exo-try")) / "trixie"
    if not (root / "opt" / "venv" / "bin").is_dir():
        sys.exit(f"exo_ring_race: no bed at {root} (build it with ../shared/exo-bed/setup.sh)")
    work = root / "tmp" / "exo-ring-race"
    work.mkdir(parents=True, exist_ok=True)
    (work / "race.py").write_text(CHILD)
    mounted: list[Path] = []
    try:
        for m in ("proc", "dev", "sys"):
            p = root / m
            if subprocess.run(["mountpoint", "-q", str(p)], check=False).returncode == 0:
                continue
            argv = (["mount", "-t", "proc", "proc", str(p)] if m == "proc"
                    else ["mount", "--bind", f"/{m}", str(p)])
            subprocess.run(argv, check=True)
            mounted.append(p)
        for hook in (False, True):
            env = "MLX_WATCHDOG=1 MLX_WATCHDOG_DIR=/tmp/exo-ring-race/rec " if hook else ""
            (work / "rec").mkdir(exist_ok=True)
            done = subprocess.run(
                ["chroot", str(root), "sh", "-c",
                 f"cd /tmp/exo-ring-race && {env}/opt/venv/bin/python race.py {args.trials}"],
                capture_output=True, text=True, check=False)
            stalled = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "?"
            print(f"hook {'on ' if hook else 'off'}: {stalled} of {args.trials} trials "
                  f"stalled (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        for p in reversed(mounted):
            subprocess.run(["umount", str(p)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
