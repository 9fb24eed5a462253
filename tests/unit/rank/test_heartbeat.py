"""The Heartbeat API refuses what it cannot honour, and leaves the record as it was."""

from __future__ import annotations

import math
import os

import pytest

from watchdog import record
from watchdog.rank import hook
from watchdog.record import RecordWriter


@pytest.mark.parametrize("seconds", [math.inf, math.nan, -1.0])
def test_expect_refuses_an_infinite_window(record_dir, seconds):
    w = RecordWriter(str(record_dir / "r.rec"), pid=os.getpid(), start_time=1.0,
                     uid=os.getuid(), host="h", job="j", rank=0, world_size=1, backend="",
                     dump_signal=0)
    hb = hook.Heartbeat(w)
    with pytest.raises(ValueError, match="finite"):
        with hb.expect(seconds):
            pass
    assert record.read_path(str(record_dir / "r.rec")).expect_seconds == 0.0
    hb.close()
