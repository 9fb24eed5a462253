"""Freeze every thread of a process but its main one: `python freeze_threads.py PID`.

A wedged GPU or a broken group seen from outside: the main thread sits in its wait
(mx.eval waits on the stream's thread) and no thread of the process runs, so nothing
spins. Each other thread is ptrace-seized and interrupted (Linux, root or the same
user); the process itself is not stopped (its state stays "sleeping"). Prints
"frozen N" once done, then holds the threads until it is ended; they run again
when this process exits (the kernel detaches its tracees).
"""

import ctypes
import os
import signal
import sys

PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
pid = int(sys.argv[1])
frozen = 0
for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
    if tid == pid:
        continue
    for request in (PTRACE_SEIZE, PTRACE_INTERRUPT):
        if libc.ptrace(request, tid, None, None) != 0:
            err = ctypes.get_errno()
            sys.exit(f"ptrace({request:#x}, {tid}): {os.strerror(err)}")
    frozen += 1
print(f"frozen {frozen}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
