"""A collective wedged across hosts, at the default settings: one ring rank on each of
the bed's two hosts (tests/support/netbed.py), each host's daemon as an operator runs
it (no setting but its directories, its address, its peer and the shared secret).

Rank 1's ring worker is made to spin in user space on a socket that never delivers
(tests/support/wedge_shim.c, LD_PRELOAD); rank 0 spins waiting on it. Neither daemon
sees the whole job: each judges it from its own rank and the rank its peer publishes
in `/status` (frames, sockets' quiet seconds and unread bytes: judge/wedge.py), and
ends it at the wedge floor (15 s) instead of holding rank 1 as computing for 900 s.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import SUPPORT
from tests.support.ranks import wait_for

pytestmark = [pytest.mark.ranks, pytest.mark.skipif(shutil.which("gdb") is None,
                                                    reason="no gdb to sample stacks")]

WEDGE_WITHIN = 30.0  # seconds from the wedge to the ranks' end, at the defaults


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    """The wedge injector, built now from its source."""
    out = tmp_path_factory.mktemp("shim") / "wedge.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(out),
                    str(SUPPORT / "wedge_shim.c"), "-ldl"], check=True)
    return out


@pytest.fixture
def hosts(bed):
    bed.heal()
    yield bed
    bed.stop_all()
    bed.heal()


def test_a_collective_wedged_across_hosts_is_ended_within_30s_at_the_defaults(
        hosts, shim, tmp_path):
    trigger = tmp_path / "wedge-now"
    daemons = hosts.start_daemons(fences=True, at_defaults=True)
    job = hosts.ring("loop", env={"LD_PRELOAD": str(shim), "MLXWD_WEDGE_RANK": "1",
                                  "MLXWD_WEDGE_FILE": str(trigger),
                                  "MLXWD_WEDGE_MODE": "user"})
    job.wait_running(collectives=200)  # the job's pace learned (20 waits and more)
    trigger.touch()
    wedged = time.monotonic()
    wait_for(job.gone, 60, interval=0.2, what="the wedged job ended on both hosts")
    took = time.monotonic() - wedged
    found = [wait_for(lambda d=d: [i for i in d.incidents() if i.get("outcome")], 30,
                      what="each host's incident")[-1] for d in daemons]
    logs = "\n".join(d.log()[-4000:] for d in daemons)
    for inc in found:
        assert inc["cause"] == "collective_wedged", (inc, logs)
        assert inc["culprit"]["rank"] == 1, inc
        assert inc["culprit"]["host"] == hosts.hosts[1].name, inc
    # At least one host decided it (the other may have been fenced by it first); a
    # decision made on host 0 names the culprit on the other host.
    decided = [(h, i) for h, i in zip(hosts.hosts, found, strict=True)
               if i["verdict"] != "fenced"]
    assert decided, found
    for host, inc in decided:
        assert "collective wedged across nodes" in inc["summary"], inc["summary"]
        if host is hosts.hosts[0]:
            assert f"rank 1 on {hosts.hosts[1].name} leaves" in inc["summary"], inc["summary"]
    assert took <= WEDGE_WITHIN, f"ended {took:.1f}s after the wedge: {found}"
    print(f"wedge across hosts ended {took:.1f}s after it began; decided on "
          f"{', '.join(h.name for h, _ in decided)}")
