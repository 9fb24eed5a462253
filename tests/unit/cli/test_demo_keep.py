"""The demo's scratch directory: removed at the end (its first line says so, and that
`--keep` keeps it), or with `--keep` kept with the incident and evidence, the ranks'
records gone and how to remove it said. No ranks run: the directory alone."""

from __future__ import annotations

import os
import shutil

import pytest

from watchdog.cli.demo.story import Demo


@pytest.mark.parametrize("keep", [False, True])
def test_the_scratch_directory_is_kept_only_when_asked(keep):
    told: list[str] = []
    demo = Demo(ranks=2, deadline=4, fault="stop", echo=told.append, keep=keep)
    evidence = os.path.join(demo.state_dir, "evidence", "inc")
    os.makedirs(evidence)
    open(os.path.join(evidence, "rank0-pid1-python.txt"), "w").close()
    try:
        demo.cleanup()
        said = " ".join(told)
        if keep:
            assert os.path.isfile(os.path.join(evidence, "rank0-pid1-python.txt"))
            assert not os.path.exists(demo.record_dir)
            assert f"kept {demo.tmp}" in said and f"rm -rf {demo.tmp}" in said
        else:
            assert not os.path.exists(demo.tmp)
            assert f"removed {demo.tmp} (--keep keeps it)" in said
    finally:
        shutil.rmtree(demo.tmp, ignore_errors=True)
