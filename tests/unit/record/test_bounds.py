"""Every integer a record (or a peer's /status) claims is bounded.

Any local user may publish a record; a world size of 2**31 made the cluster
view build range(2**31): minutes of CPU, gigabytes, a hung `cluster status`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.support import REPO
from watchdog import record
from watchdog.record import RecordError, layout
from watchdog.record.layout import IDENTITY, IDENTITY_OFFSET


def _identity(buf: bytearray, **change: int) -> bytes:
    fields = list(IDENTITY.unpack_from(buf, IDENTITY_OFFSET))
    index = {"pid": 4, "start_time": 5, "rank": 7, "world_size": 8, "status": 10}
    for name, value in change.items():
        fields[index[name]] = value
    IDENTITY.pack_into(buf, IDENTITY_OFFSET, *fields)
    return bytes(buf)


@pytest.fixture
def good(record_dir) -> bytearray:
    path = record_dir / "r.rec"
    w = record.RecordWriter(str(path), pid=os.getpid(), start_time=1.7e9, uid=os.getuid(),
                            host="h", job="j", rank=1, world_size=2, backend="ring",
                            dump_signal=0)
    w.close(record.STATUS_OPEN, remove=False)
    buf = bytearray(path.read_bytes())
    assert record.decode(bytes(buf)).world_size == 2
    return buf


@pytest.mark.parametrize("change", [
    {"world_size": 2**31 - 1}, {"world_size": -5}, {"world_size": record.MAX_WORLD_SIZE + 1},
    {"rank": 2**31 - 1}, {"rank": record.MAX_WORLD_SIZE}, {"rank": -2},
    {"pid": 2**40}, {"status": 7}, {"start_time": float("inf")},
])
def test_out_of_bounds_integers_make_a_record_unusable(good, change):
    with pytest.raises(RecordError, match="corrupt"):
        record.decode(_identity(good, **change))


def test_an_infinite_expect_window_is_corrupt(good):
    layout.EXPECT.pack_into(good, layout.EXPECT_OFFSET, float("inf"), 1, b"")
    with pytest.raises(RecordError):
        record.decode(bytes(good))


def test_cluster_status_stays_fast_on_a_peer_claiming_a_huge_world(tmp_path):
    """Judged in a child with 1 GiB of address space and 60 s: range(2**31)
    (what an unbounded world size built) exhausts either."""
    ranks = [{"rank": 0, "state": "stalled", "phase": "wait", "host": "h", "job": "j",
              "pid": 1, "world_size": 2**31 - 1, "progress": 1,
              "last_collective": {"number": 1, "op": "all_sum"}}]
    nodes = [{"peer": "a:1", "ok": True, "status": {"host": "a", "ranks": ranks}}]
    code = textwrap.dedent("""
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from watchdog.cli.look.cluster import render_text
        from watchdog.daemon.judge import cluster
        from watchdog.status import NodeAnswer
        view = cluster.analyze([NodeAnswer.from_json(n) for n in json.load(sys.stdin)])
        text = render_text(view)
        print(json.dumps({"world": view.jobs[0].world_size,
                          "missing": len(view.jobs[0].missing_ranks)}))
    """)
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(nodes), text=True,
                         capture_output=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["world"] <= record.MAX_WORLD_SIZE
    assert result["missing"] == result["world"] - 1


def test_a_peer_status_with_wrongly_typed_numbers_is_judged_without_an_error():
    from watchdog.cli.look.cluster import render_text
    from watchdog.daemon.judge import cluster
    from watchdog.status import NodeAnswer

    # Wrongly typed ranks are dropped (never the view); the
    # well-typed one is judged.
    ranks = [{"rank": "0", "pid": None, "job": "j", "state": "stalled", "phase": "wait",
              "world_size": "2"},
             {"rank": 1, "pid": "x", "job": "j", "state": "stopped", "phase": "wait",
              "world_size": 2.5},
             {"rank": 1, "pid": 7, "job": "j", "state": "stopped", "phase": "wait",
              "world_size": 2}]
    typed = cluster.analyze([NodeAnswer.from_json(
        {"peer": "a:1", "ok": True, "status": {"ranks": ranks}})])
    view = typed.to_json()
    (job,) = view["jobs"]
    # Stopped in its wait, no wait past its deadline yet: suspect (issue 49), named.
    assert job["state"] == "suspect" and job["world_size"] == 2
    assert job["culprit"]["pid"] == 7
    assert [r["pid"] for r in job["ranks"]] == [7] and job["missing_ranks"] == [0]
    assert render_text(typed)
