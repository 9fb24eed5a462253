"""A single MLX process (world size 1, no group) for the tests, as a user runs one: it
never imports watchdog (run it with MLX_WATCHDOG=1). `python solo_prog.py MODE [PATH]`.

Modes:
  matmul        checked 64 x 64 matmuls on the CPU, one mx.eval each, for ever (under the
                wedge shim's mode "park_eval", once its trigger exists, the CPU stream's
                sgemm waits for ever on a condition variable: the eval never returns and
                every thread sleeps)
  fifo PATH     the same rounds for a moment, then one mx.load (a watched wait) of a .npy
                array from the FIFO at PATH, which a test feeds slowly; prints
                "loaded N" (N: the sum of its elements) and exits 0
  long SECONDS  one long eval (matmuls sized to last SECONDS, more evals after it until
                SECONDS have passed: a matmul's time swings with the machine's load),
                then prints "long done" and exits 0
Each prints "solo up" once its first rounds have run.
"""

from __future__ import annotations

import io
import sys

import mlx.core as mx

MODE = sys.argv[1]


class Stream(io.RawIOBase):
    """A FIFO read as the seekable file mx.load wants: it only ever seeks to where it is
    (past the .npy header it has just read)."""

    def __init__(self, fifo: io.BufferedReader) -> None:
        super().__init__()
        self.fifo, self.at = fifo, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        count = self.fifo.readinto(buffer)
        self.at += count
        return count

    def tell(self) -> int:
        return self.at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if (whence, offset) not in ((io.SEEK_SET, self.at), (io.SEEK_CUR, 0)):
            raise io.UnsupportedOperation("a FIFO only reads on")
        return self.at


def one_round() -> None:
    a = mx.ones((64, 64))
    product = a @ a
    mx.eval(product)
    got = product[0, 0].item()
    if got != 64:
        print(f"WRONG matmul: {got} != 64", flush=True)
        sys.exit(3)


for _ in range(20):
    one_round()
print("solo up", flush=True)
if MODE == "matmul":
    while True:
        one_round()
elif MODE == "long":
    import time

    seconds = float(sys.argv[2])
    a = mx.random.normal((256, 256), key=mx.random.key(0)) / 16
    began = time.monotonic()
    mx.eval((a @ a) @ a)
    per = max((time.monotonic() - began) / 2, 1e-4)
    n, began = max(1, int(seconds / per)), time.monotonic()
    while time.monotonic() - began < seconds:
        y = a
        for _ in range(n):
            y = (y @ a) / 16
        mx.eval(y)
        n = max(1, n // 8)
    print("long done", flush=True)
elif MODE == "fifo":
    with open(sys.argv[2], "rb") as fifo:
        loaded = mx.load(Stream(fifo), format="npy")
    print(f"loaded {mx.sum(loaded).item():.0f}", flush=True)
