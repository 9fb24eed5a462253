"""Parse macOS `sample` output: the hot frames of each thread, with counts.

`sample PID 1` prints a call graph, one tree per thread; each line holds the
number of samples in which that frame was on the stack, indented by depth
with the tree drawn in `+ ! : |`:

    Call graph:
        1304 Thread_8812  StreamThread
        + 1304 thread_start  (in libsystem_pthread.dylib) + 8  [0x18a429b80]
        +   1156 mlx::core::distributed::jaccl::MeshImpl::recv(...)  (in libmlx.dylib) + 96  [0x1..]
        +   ! 1156 tbt_poll_cq  (in libjaccl.dylib) + 40  [0x1..]

For each thread this returns its sample count, its leaf frames summed by
name (where the samples were taken: a thread hung in a collective shows one
leaf holding nearly all of them), and its heaviest path from the root. Pure:
text in, `status.HotThread`s out, never raises on bad input.
"""

from __future__ import annotations

import re
from typing import Any

from watchdog.status import HotFrame, HotThread, PathFrame

MAX_THREADS = 64
TOP_LEAVES = 5
PATH_FRAMES = 12  # the deepest frames of the heaviest path; the root end is boilerplate

_LINE = re.compile(r"^(?P<lead>[ +!:|]*?)(?P<count>\d+) (?P<text>\S.*)$")
_FRAME = re.compile(r"^(?P<name>.+?)  \(in (?P<lib>[^)]*)\)")


def _frame(text: str) -> tuple[str, str]:
    match = _FRAME.match(text)
    if match:
        return match.group("name").strip(), match.group("lib")
    return text.split("  ")[0].strip(), ""


def parse(text: str) -> list[HotThread]:
    """The threads of one `sample` report; [] when it holds no call graph."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Call graph:")
    except StopIteration:
        return []
    threads: list[HotThread] = []
    nodes: list[list[Any]] = []  # of the current thread: [depth, count, name, lib, children]
    roots: list[int] = []
    stack: list[int] = []
    for line in lines[start + 1:]:
        if not line.strip() or line.startswith("Total number in stack"):
            break
        match = _LINE.match(line)
        if not match:
            continue
        lead, count, text = match.group("lead"), int(match.group("count")), match.group("text")
        if "+" not in lead:  # a thread's line: its frames all start with "+"
            if threads:
                threads[-1] = _summarise(threads[-1], nodes, roots)
            if len(threads) >= MAX_THREADS:
                return threads
            threads.append(HotThread(" ".join(text.split()), count))
            nodes, roots, stack = [], [], []
            continue
        if not threads:
            continue
        depth = len(lead)
        name, lib = _frame(text)
        while stack and nodes[stack[-1]][0] >= depth:
            stack.pop()
        (nodes[stack[-1]][4] if stack else roots).append(len(nodes))
        stack.append(len(nodes))
        nodes.append([depth, count, name, lib, []])
    if threads:
        threads[-1] = _summarise(threads[-1], nodes, roots)
    return threads


def _summarise(thread: HotThread, nodes: list[list[Any]], roots: list[int]) -> HotThread:
    leaves: dict[tuple[str, str], int] = {}
    for _, count, name, lib, children in nodes:
        # Samples taken in this very frame: its count less its callees'.
        own = count - sum(nodes[c][1] for c in children)
        if own > 0:
            leaves[(name, lib)] = leaves.get((name, lib), 0) + own
    top = sorted(leaves.items(), key=lambda item: -item[1])[:TOP_LEAVES]
    path: list[PathFrame] = []
    current = max(roots, key=lambda i: nodes[i][1]) if roots else None
    while current is not None:
        _, count, name, _, children = nodes[current]
        path.append(PathFrame(name, count))
        current = max(children, key=lambda c: nodes[c][1]) if children else None
    return HotThread(thread.thread, thread.samples,
                     tuple(HotFrame(name, lib, n) for (name, lib), n in top),
                     tuple(path[-PATH_FRAMES:]))


def summary_line(thread: HotThread) -> str:
    """One line for people: "Thread_1 StreamThread: 1156 of 1304 in tbt_poll_cq (...)"."""
    if not thread.top:
        return f"{thread.thread}: {thread.samples} samples, no frames"
    hot = thread.top[0]
    path = [p.frame for p in thread.path[-3:]]
    return (f"{thread.thread}: {hot.samples} of {thread.samples} samples "
            f"in {hot.frame}" + (f" ({' > '.join(path)})" if path else ""))
