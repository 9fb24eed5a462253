"""A real MLX ring rank for the tests: `python rank_prog.py MODE [ARGS]`.

Modes:
  loop            all_sum in a loop, checking every result, hb.step() each round
  zero            the same loop without importing watchdog (MLX_WATCHDOG=1 instruments it)
  server          mlx-lm style: a tiny all_sum every ~0.1 s, idle in between
  idle            init, then sit inside hb.idle() forever
  expect S        init, then every rank waits in a recv nobody sends, inside hb.expect(S)
  recv            rank 0 waits forever on a recv that rank 1 never sends; others idle
  shm MIB         lock a SysV SHM segment of MIB MiB (left behind), then loop
"""

import sys
import time

import mlx.core as mx

MODE = sys.argv[1]
ARG = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0

hb = None
if MODE != "zero":
    import watchdog

    hb = watchdog.install()


def shm_lock(mib):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    size = int(mib) << 20
    shmid = libc.shmget(0, ctypes.c_size_t(size), 0o1600)  # IPC_PRIVATE | IPC_CREAT
    if shmid < 0:
        raise OSError(ctypes.get_errno(), "shmget")
    if libc.shmctl(shmid, 11, None) != 0:  # SHM_LOCK
        raise OSError(ctypes.get_errno(), "shmctl(SHM_LOCK)")
    addr = libc.shmat(shmid, None, 0)
    ctypes.memset(addr, 1, size)  # fault the pages in: locked pages count as Unevictable
    print(f"shmid {shmid}", flush=True)


group = mx.distributed.init(backend="ring", strict=True)
rank, size = group.rank(), group.size()
print(f"rank {rank} of {size} up", flush=True)

if MODE == "shm" and rank == 0:
    shm_lock(ARG)


def one_round():
    x = mx.distributed.all_sum(mx.ones(16))
    mx.eval(x)
    got = x[0].item()
    if got != size:
        print(f"WRONG all_sum: {got} != {size}", flush=True)
        sys.exit(3)


if MODE in ("loop", "zero", "shm"):
    while True:
        one_round()
        if hb is not None:
            hb.step()
elif MODE == "server":
    while True:
        one_round()
        with hb.idle():
            time.sleep(0.1)
elif MODE == "idle":
    with hb.idle():
        while True:
            time.sleep(1)
elif MODE == "expect":
    with hb.expect(ARG, "checkpoint"):
        peer = (rank + 1) % size
        mx.eval(mx.distributed.recv((4,), mx.float32, peer))
elif MODE == "recv":
    one_round()
    if rank == 0:
        mx.eval(mx.distributed.recv((4,), mx.float32, 1))
    else:
        while True:
            time.sleep(1)
else:
    sys.exit(f"unknown mode {MODE}")
