"""Asking the nodes: every peer's `/status`, concurrently, with a timeout each.

Only the asking: what the answers say of each job is judged, purely, in
`daemon/judge/cluster.py` (`cluster status` and the daemon both judge there).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from watchdog.status import NodeAnswer, NodeStatus

__all__ = ["MAX_STATUS_BYTES", "fetch", "gather"]

MAX_STATUS_BYTES = 16 << 20


def fetch(peer: str, timeout: float) -> NodeAnswer:
    """One node's `/status`, read through the contract, or why it could not be had."""
    try:
        with urllib.request.urlopen(f"http://{peer}/status", timeout=timeout) as response:
            answer = json.loads(response.read(MAX_STATUS_BYTES))
        if not isinstance(answer, dict) or not isinstance(answer.get("ranks"), list):
            raise ValueError("not an mlx-watchdog /status")
        return NodeAnswer(peer, True, NodeStatus.from_json(answer))
    except Exception as err:  # noqa: BLE001 - an unreachable node is a result
        return NodeAnswer(peer, False, error=str(getattr(err, "reason", err)))


def gather(peers: Sequence[str], timeout: float) -> list[NodeAnswer]:
    """Every peer's answer, in the order given."""
    if not peers:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(peers))) as pool:
        return list(pool.map(lambda p: fetch(p, timeout), peers))
