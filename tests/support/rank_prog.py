"""A real MLX ring rank for the tests: `python rank_prog.py MODE [ARGS]`.

Modes:
  loop            all_sum in a loop, checking every result, hb.step() each round
  zero            the same loop without importing watchdog (MLX_WATCHDOG=1 instruments it)
  server          mlx-lm style: a tiny all_sum every ~0.1 s, idle in between
  idle            init, then sit inside hb.idle() forever
  expect S        init, then every rank waits in a recv nobody sends, inside hb.expect(S)
  recv            rank 0 waits forever on a recv that rank 1 never sends; others idle
  shm MIB         lock a SysV SHM segment of MIB MiB (left behind), then loop
  rounds N        N checked all_sum rounds with hb.step(), then exit 0 (a clean exit)
  allops          one checked round of every ring collective (all_sum, all_gather,
                  all_max, all_min, send/recv, send/recv_like), then idle forever
  soak S [PACE]   checked all_sum rounds (PACE s of sleep between them) until rank 0
                  has run S seconds; the end travels in the same all_sum, so every
                  rank leaves after the same round and exits 0 (a clean job end)
  stubborn        like recv (rank 0 waits forever on a recv nobody sends), but every
                  rank ignores SIGTERM: only SIGKILL ends the job
  consume HOW     all_sum rounds whose result is consumed only through one entry point:
                  print (print(a)), fstring (f"{a}"), format (f"{a[0]:.1f}"), numpy
                  (numpy.array(a): the buffer protocol), async_eval (mlx-lm's pattern:
                  async_eval the next round, then .item() the previous one)
  buffer          all_sum in a loop read through the buffer protocol
                  (`memoryview(all_sum(x))`, no wrapped wait), hb.step() each round:
                  with a peer frozen the main thread blocks in a native call
  pyworker S      one round, then rank 0's main thread sits in queue.get() while a pure
                  Python worker thread loads data (reads /dev/zero: mostly kernel time)
                  at 100% for S seconds (then exits 0)
  pycompute S     one round, then rank 0's main thread computes in Python for S seconds
  sleeper S       one round, then the main thread sleeps S seconds outside any wait
                  (a server waiting for requests without hb.idle(), nothing spinning);
                  in these three modes the other ranks sleep S seconds
  slowpeer S [N]  one round (N rounds), then rank 1 computes for S seconds (one long
                  CPU eval of an estimated S seconds, then shorter ones until S have
                  passed) before its all_sum while rank 0 waits in that all_sum; prints
                  "slowpeer done" after the round and exits 0
  save PATH       one round, then rank 1 writes a 256 KiB checkpoint (64 tensors) to PATH with
                  mx.save_safetensors (a FIFO the test drains slowly, or never) while
                  rank 0 waits in the next all_sum; "save done" and exit 0
  pyslowpeer S    the same shape, but rank 1 computes in pure Python for S seconds (by
                  the clock, so a loaded machine cannot stretch it); "slowpeer done"
  catch           all_sum in a loop, hb.step() each round, appending each completed
                  round's wall time to completed-<rank>.txt (in the working
                  directory); it catches the ring's RuntimeError ("[ring] connection
                  to a peer was lost", mlx >= 0.32.1), prints "caught: ..." and goes on,
                  as a program that does so computes on with a rank missing
  prefill S T P   a generation's shape: a long first step (every rank computes ~S s in
                  one eval, rank 1 half as long again, so rank 0 then waits in the
                  all_sum), short checked rounds for T s (rank 0 decides the end and
                  tells the others in the all_sum), a long step of ~P s (a prefill
                  after many short decode steps), a few rounds, exit 0.
                  Prints "prefill 1 start", "short rounds", "prefill 2 start", "done"
  bigsum MIB [N] [R]  N checked rounds (default 200: the job's pace learned), then R
                  (default 1) all_sums of MIB MiB (float32 ones), each checked; prints
                  "bigsum start" before the first, "bigsum done T" after each (T: its
                  seconds) and exits 0
  work N [FLAG]   a training step's shape: N 512 x 512 matmuls and an all_sum of their
                  result in one eval (compute and collective together, as mlx-lm's
                  trainer does), checked, hb.step() each round, forever; while the file
                  FLAG exists, rank 1 computes in Python before each step, by the
                  clock, as long as a step took before (a rank at half pace: by the
                  clock, so its peers' share of the cores does not change what it
                  costs), and prints "slow step T S AT" for each: the step took T s,
                  S of them in that computation, ending at monotonic AT.
                  With MLX_TEST_DATASET=DIR,PAGES in its environment, once DIR/go
                  exists each rank reads PAGES random 4 KiB pages of its own
                  memory-mapped dataset DIR/data-<rank>.bin before each step (a loader
                  of shuffled samples, MADV_RANDOM): page-cache hits while the file
                  fits in the memory left to the rank, major faults once it does not
"""

import sys
import time

import mlx.core as mx

MODE = sys.argv[1]
ARG = float(sys.argv[2]) if len(sys.argv) > 2 and MODE not in ("consume", "save") else 0.0
# A chain of 512 x 512 matmuls divided by sqrt(512) keeps its values near 1; divided by
# 512 they sink toward denormals, which the CPU computes ten times slower or worse: a
# "5 s" slow peer then computed for 50 s and outlived the daemon's blocked deadline.
NORM = 512 ** 0.5

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
elif MODE == "rounds":
    import os

    for _ in range(int(ARG)):
        one_round()
        hb.step()
    print(f"record {hb.path} exists={hb.path is not None and os.path.exists(hb.path)}",
          flush=True)
    time.sleep(0.5)  # let the peers finish their last collective before we hang up
elif MODE == "allops":
    x = mx.ones(6) * (rank + 1)
    total = size * (size + 1) / 2
    checks = {
        "all_sum": (mx.distributed.all_sum(x), [total] * 6),
        "all_gather": (mx.distributed.all_gather(x),
                       [float(r + 1) for r in range(size) for _ in range(6)]),
        "all_max": (mx.distributed.all_max(x), [float(size)] * 6),
        "all_min": (mx.distributed.all_min(x), [1.0] * 6),
    }
    for name, (out, want) in checks.items():
        mx.eval(out)
        if out.tolist() != want:
            print(f"WRONG {name}: {out.tolist()} != {want}", flush=True)
            sys.exit(3)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for kind in ("recv", "recv_like"):  # a chain from rank 0, so no rank waits on itself
        if rank == 0:
            mx.eval(mx.distributed.send(x, nxt))
        if kind == "recv":
            got = mx.distributed.recv((6,), mx.float32, prv)
        else:
            got = mx.distributed.recv_like(x, prv)
        mx.eval(got)
        if rank != 0:
            mx.eval(mx.distributed.send(x, nxt))
        if got.tolist() != [float(prv + 1)] * 6:
            print(f"WRONG {kind}: {got.tolist()}", flush=True)
            sys.exit(3)
    hb.step()
    print("allops done", flush=True)
    with hb.idle():
        while True:
            time.sleep(1)
elif MODE == "soak":
    pace = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    began = time.monotonic()
    flag = mx.array([0.0] * 15 + [1.0])
    while True:
        x = mx.ones(16)
        if rank == 0 and time.monotonic() - began >= ARG:
            x = x + flag  # the last round: the sum's final element says so to every rank
        got = mx.distributed.all_sum(x).tolist()
        if got[:15] != [float(size)] * 15 or got[15] not in (size, size + 1):
            print(f"WRONG all_sum: {got}", flush=True)
            sys.exit(3)
        hb.step()
        if got[15] == size + 1:
            break
        time.sleep(pace)
    print("soak done", flush=True)
    time.sleep(1.0)  # let the peers finish the last collective before we hang up
elif MODE == "stubborn":
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    one_round()
    print("ignoring SIGTERM", flush=True)
    if rank == 0:
        mx.eval(mx.distributed.recv((4,), mx.float32, 1))
    else:
        while True:
            time.sleep(1)
elif MODE == "consume":
    import os

    how = sys.argv[2]
    sink = open(os.devnull, "w")  # noqa: SIM115
    rounds = 0

    def issue():
        x = mx.distributed.all_sum(mx.ones(16))
        for _ in range(200):  # far more tasks than the scheduler keeps in flight
            x = x * 1.0
        return x

    ahead = issue()
    while True:
        x = issue() if how != "async_eval" else ahead
        if how == "print":
            print(x, file=sink)
        elif how == "fstring":
            sink.write(f"{x}")
        elif how == "format":
            sink.write(f"{x[0]:.1f}")
        elif how == "numpy":
            import numpy

            numpy.array(x)
        elif how == "async_eval":
            ahead = issue()
            mx.async_eval(ahead)
            if x[0].item() != size:
                sys.exit(3)
        else:
            sys.exit(f"unknown way to consume {how}")
        rounds += 1
        if rounds % 50 == 0:
            print(f"round {rounds}", flush=True)
elif MODE == "buffer":
    while True:
        view = memoryview(mx.distributed.all_sum(mx.ones(16)))  # evaluates: blocks
        if view[0] != size:
            print(f"WRONG all_sum: {view[0]} != {size}", flush=True)
            sys.exit(3)
        hb.step()
elif MODE in ("pyworker", "pycompute", "sleeper"):
    import queue
    import threading

    one_round()
    print(f"{MODE} started", flush=True)

    def spin(seconds):
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            n += 1  # pure Python: holds the GIL, never calls MLX
        return n

    def load_data(seconds):
        # A data loader: reads in a loop, so most of its time is spent in the
        # kernel, like a ring thread polling its sockets.
        end, n = time.monotonic() + seconds, 0
        with open("/dev/zero", "rb", buffering=0) as f:
            while time.monotonic() < end:
                n += len(f.read(1 << 16))
        return n

    if rank != 0:  # only rank 0 does the mode; the others sleep it out
        time.sleep(ARG)
    elif MODE == "pyworker":
        results = queue.Queue()
        threading.Thread(target=lambda: results.put(load_data(ARG)), daemon=True).start()
        results.get()  # the main thread blocks here, in a lock, not in MLX
    elif MODE == "pycompute":
        spin(ARG)
    else:
        time.sleep(ARG)
    print(f"{MODE} done", flush=True)
elif MODE == "slowpeer":
    steps = 1
    a = mx.random.normal((512, 512), key=mx.random.key(0))
    if rank == 1:
        # Sized before the round, so that after it rank 1 goes straight into one
        # long eval while rank 0 waits in the all_sum for it.
        mx.eval((a @ a) / NORM)  # warm up
        began = time.monotonic()
        mx.eval((((a @ a) / NORM) @ a) / NORM)
        per = max((time.monotonic() - began) / 2, 1e-4)
        steps = max(1, int(ARG / per))
        print(f"slowpeer: {steps} matmuls of {per * 1000:.1f} ms", flush=True)
    for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1):
        one_round()
    x = mx.ones(16)
    if rank == 1:
        # One long eval of the estimated size; a matmul's time swings 5x with the
        # machine's load, so more evals follow until S seconds have passed.
        began, y, n = time.monotonic(), a, steps
        while True:
            for _ in range(n):
                y = (y @ a) / NORM
            mx.eval(y)
            if time.monotonic() - began >= ARG:
                break
            n = max(1, steps // 8)
        print(f"slowpeer computed {time.monotonic() - began:.1f}s", flush=True)
        x = x + 0 * y.sum()
    got = mx.distributed.all_sum(x)
    mx.eval(got)
    print(f"slowpeer done {got[0].item()}", flush=True)
elif MODE == "save":
    # Made before the round, so that after it rank 1 goes straight into its save.
    weights = {f"w{i}": mx.ones((1024,)) for i in range(64)}  # 64 writes of 4 KiB
    mx.eval(weights)
    one_round()
    if rank == 1:
        print("saving", flush=True)
        mx.save_safetensors(sys.argv[2], weights)
    one_round()
    print("save done", flush=True)
elif MODE == "catch":
    done = open(f"completed-{rank}.txt", "a", buffering=1)  # noqa: SIM115 - until killed
    while True:
        try:
            x = mx.distributed.all_sum(mx.ones(16))
            mx.eval(x)
            x[0].item()
        except RuntimeError as err:
            print(f"caught: {err}", flush=True)
            continue
        done.write(f"{time.time():.6f}\n")
        hb.step()
elif MODE == "pyslowpeer":
    one_round()
    if rank == 1:
        print("slowpeer: computing in Python", flush=True)
        end, n = time.monotonic() + ARG, 0
        while time.monotonic() < end:
            n += 1  # holds the GIL, never calls MLX: the user's own work
    got = mx.distributed.all_sum(mx.ones(16))
    mx.eval(got)
    print(f"slowpeer done {got[0].item()}", flush=True)
elif MODE == "prefill":
    short_for = float(sys.argv[3])
    a = mx.random.normal((512, 512), key=mx.random.key(rank))
    mx.eval((a @ a) / NORM)  # warm up
    per = 1.0
    for _ in range(3):  # the fastest of three: the step errs long, never short
        began = time.monotonic()
        mx.eval((((a @ a) / NORM) @ a) / NORM)
        per = min(per, max((time.monotonic() - began) / 2, 1e-4))

    def long_step(seconds):
        y = a
        for _ in range(max(1, int(seconds * (1.5 if rank == 1 else 1.0) / per))):
            y = (y @ a) / NORM
        got = mx.distributed.all_sum(mx.ones(16) + 0 * y.sum())
        began = time.monotonic()
        mx.eval(got)  # one eval: the compute, then the all_sum
        print(f"long step took {time.monotonic() - began:.1f}s", flush=True)
        if got[0].item() != size:
            sys.exit(3)

    print("prefill 1 start", flush=True)
    long_step(ARG)
    print("short rounds", flush=True)
    began = time.monotonic()
    flag = mx.array([0.0] * 15 + [1.0])
    while True:
        x = mx.ones(16)
        if rank == 0 and time.monotonic() - began >= short_for:
            x = x + flag
        out = mx.distributed.all_sum(x)
        mx.eval(out)  # a decode step: the same kind of wait as the long steps
        got = out.tolist()
        if got[:15] != [float(size)] * 15:
            sys.exit(3)
        if got[15] == size + 1:
            break
    print("prefill 2 start", flush=True)
    long_step(float(sys.argv[4]))
    for _ in range(5):
        one_round()
    print("done", flush=True)
    time.sleep(0.5)
elif MODE == "work":
    import os

    flag = sys.argv[3] if len(sys.argv) > 3 else ""
    a = mx.random.normal((512, 512), key=mx.random.key(0))
    step = None  # a healthy step's time, averaged
    dataset = os.environ.get("MLX_TEST_DATASET", "")
    if dataset:
        import mmap
        import random

        folder, pages = dataset.rsplit(",", 1)
        fd = os.open(os.path.join(folder, f"data-{rank}.bin"), os.O_RDONLY)
        data = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
        data.madvise(mmap.MADV_RANDOM)
        shuffle = random.Random(rank)
    while True:
        began = time.monotonic()
        if dataset and os.path.exists(os.path.join(folder, "go")):
            total = 0
            for _ in range(int(pages)):
                total += data[shuffle.randrange(len(data) >> 12) << 12]
        slow = rank == 1 and flag and os.path.exists(flag)
        if slow and step:
            until = time.monotonic() + step
            while time.monotonic() < until:
                sum(range(1000))
        y = a
        for _ in range(int(ARG)):
            y = (y @ a) / NORM
        got = mx.distributed.all_sum(mx.ones(16) + 0 * y.sum())
        mx.eval(got)
        if got[0].item() != size:
            print(f"WRONG all_sum: {got[0].item()}", flush=True)
            sys.exit(3)
        hb.step()
        took = time.monotonic() - began
        if not slow:
            step = took if step is None else 0.9 * step + 0.1 * took
        elif step:
            print(f"slow step {took:.4f} {step:.4f} {time.monotonic():.3f}", flush=True)
elif MODE == "bigsum":
    for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 200):
        one_round()
        hb.step()
    print("bigsum start", flush=True)
    for _ in range(int(sys.argv[4]) if len(sys.argv) > 4 else 1):
        began = time.monotonic()
        big = mx.distributed.all_sum(mx.ones(int(ARG * (1 << 20)) // 4))
        mx.eval(big)
        if big[0].item() != size or big[-1].item() != size:
            print(f"WRONG all_sum: {big[0].item()}", flush=True)
            sys.exit(3)
        print(f"bigsum done {time.monotonic() - began:.1f}", flush=True)
        hb.step()
    time.sleep(0.5)  # the peers finish their part before we hang up
else:
    sys.exit(f"unknown mode {MODE}")
