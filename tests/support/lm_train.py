"""The real `python -m mlx_lm lora --train` as a distributed job: data parallel over ring
ranks on 127.0.0.1 the way `mlx.launch` starts them (`MLX_HOSTFILE`, `MLX_RANK`),
instrumented by `MLX_WATCHDOG=1` only, on the small random Llama of lm_server.py and a
small dataset written here (no download).

mlx-lm 0.32's trainer averages the gradients of every step with `average_gradients` (an
all_sum), all_sums the losses of each report and validation, and rank 0 alone saves the
adapters every `--save-every` iterations: first `adapters.safetensors`, then
`<iteration>_adapters.safetensors`, each with `mx.save_safetensors`. `SlowStorage` makes
the second one a FIFO the test drains slowly (a busy NAS), or never opens (a hung mount).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.ranks import RankProcs, base_env, free_ports
from watchdog import record

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Python 3.10+ on Linux), spelled for older ones
PIPE_SIZE = 4096  # the smallest pipe the kernel allows: the writer waits on every page


def build_dataset(folder: Path, lines: int = 64) -> Path:
    """train.jsonl and valid.jsonl of short texts, mlx-lm's {"text": ...} format."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = [f"the quick brown fox {i} jumps over the lazy dog; a watchdog names the culprit"
             for i in range(lines)]
    for name, part in (("train", texts), ("valid", texts[: max(8, lines // 4)])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                      for t in part))
    return folder


def checkpoint_name(iteration: int) -> str:
    """The file rank 0 writes after `adapters.safetensors` at a save (mlx-lm's trainer)."""
    return f"{iteration:07d}_adapters.safetensors"


class LmTrain(RankProcs):
    """`mlx_lm lora --train` over `size` ring ranks; each rank's output in its own log."""

    def __init__(self, workdir: Path, record_dir: Path, model: Path, data: Path, *,
                 iters: int, save_every: int, eval_every: int, size: int = 2) -> None:
        self.workdir, self.size = workdir, size
        self.adapters = workdir / "adapters"
        self.adapters.mkdir(parents=True, exist_ok=True)
        hostfile = workdir / "train-hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(size)]))
        self.env = base_env(record_dir, MLX_WATCHDOG="1")
        self.env["MLX_HOSTFILE"] = str(hostfile)
        self.record_dir = record_dir
        self.argv = [sys.executable, "-m", "mlx_lm", "lora", "--model", str(model), "--train",
                     "--data", str(data), "--iters", str(iters), "--batch-size", "4",
                     "--val-batches", "2", "--steps-per-eval", str(eval_every),
                     "--steps-per-report", "2", "--save-every", str(save_every),
                     "--adapter-path", str(self.adapters), "--max-seq-length", "48",
                     "--num-layers", "2", "--seed", "3"]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> LmTrain:
        for rank in range(self.size):
            log = open(self.workdir / f"train-rank{rank}.log", "wb")  # noqa: SIM115
            self.procs.append(subprocess.Popen(
                self.argv, env=dict(self.env, MLX_RANK=str(rank)), stdout=log,
                stderr=subprocess.STDOUT, cwd=self.workdir))
            log.close()
        return self

    def log(self, rank: int) -> str:
        return (self.workdir / f"train-rank{rank}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- rank {r}:\n{self.log(r)[-3000:]}" for r in range(self.size))

    def records(self) -> dict[int, record.Record]:
        """Each live rank's record, by rank number."""
        found = {}
        for pid in self.pids:
            try:
                r = record.read_path(str(self.record_dir / f"{pid}{record.SUFFIX}"))
            except (OSError, record.RecordError):
                continue
            found[r.rank] = r
        return found

    def codes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def finished(self) -> bool:
        return all(code is not None for code in self.codes())



class SlowStorage(threading.Thread):
    """A checkpoint file as storage that is slow (`seconds` to take `size` bytes, in a
    trickle) or that never answers (`seconds` None: nobody ever opens the other end, so
    the writer's open() waits forever, no byte moving, as on a hung network mount).

    The FIFO's pipe is shrunk to one page before the writer comes, so the writer waits
    on the drain for all but the last page of its file."""

    def __init__(self, path: Path, size: int = 0, seconds: float | None = None) -> None:
        super().__init__(daemon=True)
        os.mkfifo(path)
        self.path, self.size, self.seconds = path, size, seconds
        self.received = 0
        self.began = self.ended = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        if self.seconds is None:
            return  # never opened: storage that never answers
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
            while not self.stopping.is_set():
                # Bytes a second; the size may be learned after the thread started.
                rate = max(64.0, self.size / self.seconds)
                try:
                    chunk = os.read(fd, 256)
                except BlockingIOError:  # the writer is there, between writes
                    time.sleep(0.05)
                    continue
                if not chunk:
                    if self.received:  # the writer closed it: the checkpoint is written
                        self.ended = time.monotonic()
                        return
                    time.sleep(0.05)  # no writer yet
                    continue
                self.began = self.began or time.monotonic()
                self.received += len(chunk)
                time.sleep(len(chunk) / rate)
        finally:
            os.close(fd)
