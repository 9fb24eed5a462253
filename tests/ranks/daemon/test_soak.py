"""The chaos soak of benchmarks/soak.py, short: real ring jobs, one real daemon, seeded faults."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from tests.support import REPO

pytestmark = pytest.mark.ranks

SOAK_PATH = REPO / "benchmarks" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("mlxwd_soak", SOAK_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_short_soak_kills_no_healthy_rank_and_misses_no_hang(tmp_path):
    soak = load_soak()
    config = soak.Config(seconds=40, seed=1, lifetime=(5.0, 12.0), drain=30.0,
                         workdir=tmp_path / "soak")
    figures = soak.Soak(config).run()
    text = soak.report(figures)
    print(text)
    assert figures["wrong_kills"] == 0, text
    assert figures["hangs_missed"] == 0, text
    assert figures["culprit_errors"] == 0, text
    assert figures["bad_exits"] == 0 and figures["wrong_results"] == 0, text
    assert figures["daemon_alive"], text
    # Every kind of fault happened at least once, and every hang was caught.
    assert all(n >= 1 for n in figures["faults_injected"].values()), text
    assert figures["short_pauses_survived"] >= 1, text
    hangs = figures["faults_injected"]["long_pause"] + figures["faults_injected"]["recv"]
    assert figures["hangs_caught"] == hangs, text
    assert figures["slack_worst_s"] is not None and figures["slack_worst_s"] < config.bound, text
    if os.geteuid() == 0:  # a second local user named real jobs: only its own ranks ended
        assert figures["strangers"]["started"] >= 1, text
        assert figures["strangers"]["own_hang_ended"] == figures["strangers"]["started"], text
        # A hostile second user's attacks, the whole soak long: none succeeded.
        hostile = figures["hostile"]
        assert hostile["crowd"] == 40 and hostile["crowd_ended"] == 0, text
        assert hostile["pending_left"] == 0 and hostile["unwritten"] == 0, text
        assert hostile["too_many_open_files"] == 0, text
        # Issue 30: one-process jobs hung ignoring the dump signal, huge request heads.
        assert hostile["hung"] >= 16 and hostile["hung_missed"] == 0, text
        assert hostile["hung_unjournaled"] == 0 and hostile["hung_ended"] == hostile["hung"], text
        assert soak.hostile_problems(hostile) == [], text
    assert not soak.failed(figures)
