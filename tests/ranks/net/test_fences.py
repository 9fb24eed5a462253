"""A fence is not accepted twice, even across the receiver's restart.

The real daemon, with a secret, on 127.0.0.1; the fence is signed by a sender
whose clock runs ahead of the receiver's.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tests.support.ranks import DaemonProc
from tests.unit.net.test_fences import SECRET
from watchdog.net import fence


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/fence", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.mark.ranks
def test_a_fence_replayed_after_the_receiver_restarts_is_refused(record_dir, state_dir):
    body, headers = fence.make(SECRET, "job", "sender", "test", None, now=time.time() + 10)
    first = DaemonProc(record_dir, state_dir, secret=SECRET).start()
    try:
        code, answer = post(first.url(), body, headers)  # type: ignore[attr-defined]
        assert code == 202, answer
        assert post(first.url(), body, headers)[0] == 401  # type: ignore[attr-defined]
    finally:
        first.stop()
    second = DaemonProc(record_dir, state_dir, secret=SECRET).start()
    try:
        # Signed 10 s "after" the first daemon's start by the sender's clock, so
        # after this one's too: only the nonce, kept on disk, tells the replay.
        code, answer = post(second.url(), body, headers)  # type: ignore[attr-defined]
        assert code == 401 and "replayed" in answer["error"], answer
        fresh_body, fresh_headers = fence.make(SECRET, "job", "sender", "test", None)
        assert post(second.url(), fresh_body, fresh_headers)[0] == 202  # type: ignore[attr-defined]
    finally:
        second.stop()
