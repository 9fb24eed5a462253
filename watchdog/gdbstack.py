"""gdb's `thread apply all bt`: the one command line that runs it, and its parse into each
thread's frames by its kernel thread id.

    Thread 4 (Thread 0x7f1f60bfd6c0 (LWP 7880) "python3"):
    #0  __libc_recv (flags=<optimized out>, len=32, buf=0x5653..., fd=4) at ../recv.c:28
    #2  0x00007f1f63f01887 in mlx::...::ring::(anonymous namespace)::SocketThread::worker() ()
        from .../libmlx.so  (one line in gdb's output)

The parse is pure: text in, {tid: (frame names, leaf first)} out; never raises on bad
input. A frame is its function's name as gdb prints it, without the address, the
arguments and where it is from (`??` for a frame without a symbol).

gdb runs as root against a process its user controls, so every gdb the daemon starts
is built by `command`, which runs nothing the target names: no init file (`-nx`), no
auto-loaded script or `.debug_gdb_scripts` section, whatever the path it is reached by
(a library loaded as `/usr/share/gdb/auto-load/../../../home/u/x.so` passes gdb's
safe-path check, which matches the unresolved name), no libthread_db but the system's
(gdb otherwise tries one beside the target's own libc or libpthread), and nothing
fetched from debuginfod. gdb still parses the target's ELF and DWARF as root: a
parser's bugs are the attack surface left (docs/operations.md, the threat model).
"""

from __future__ import annotations

import re

MAX_THREADS = 256
# No directory is safe for auto-loading: one that does not exist, and that no user can
# create (it is not under a writable directory), so no path can be made to lead through it.
NO_SAFE_PATH = "/nonexistent/mlx-watchdog"
HARDENED = (
    "-nx", "-nh", "-batch",
    "-iex", "set auto-load off",
    "-iex", f"set auto-load safe-path {NO_SAFE_PATH}",
    "-iex", "set libthread-db-search-path $sdir",
    "-iex", "set debuginfod enabled off",
)
MAX_FRAMES = 64  # of each thread, from its leaf: a deep recursion is cut

_THREAD = re.compile(r"^Thread \d+ \(.*?\(LWP (?P<tid>\d+)\)")
_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-fA-F]+ in )?(?P<rest>\S.*)$")


def command(gdb: str, pid: int) -> list[str]:
    """The one gdb command line the daemon runs: every thread's backtrace of `pid`,
    hardened as the module says (the sampler and the evidence alike)."""
    return [gdb, *HARDENED, "-p", str(pid), "-ex", "thread apply all bt"]


def frame_name(rest: str) -> str:
    """The function of a frame line's text after its number and address."""
    for mark in (" from ", " at "):
        cut = rest.find(mark)
        if cut >= 0:
            rest = rest[:cut]
    rest = rest.rstrip()
    # The argument list gdb prints after the name: " (fd=4, ...)" or " ()".
    depth, i = 0, len(rest)
    if rest.endswith(")"):
        for i in range(len(rest) - 1, -1, -1):
            ch = rest[i]
            depth += ch == ")"
            depth -= ch == "("
            if depth == 0:
                break
        if i > 0 and rest[i - 1] == " ":
            rest = rest[:i - 1]
    return rest.strip()


def parse(text: str) -> dict[int, tuple[str, ...]]:
    """The threads of one backtrace, by LWP id; {} when it holds none."""
    threads: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _THREAD.match(line)
        if match:
            if len(threads) >= MAX_THREADS:
                break
            current = threads.setdefault(int(match.group("tid")), [])
            continue
        found = _FRAME.match(line)
        if found and current is not None and len(current) < MAX_FRAMES:
            current.append(frame_name(found.group("rest")))
    return {tid: tuple(frames) for tid, frames in threads.items()}
