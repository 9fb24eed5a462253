"""The daemon's settings handed out as narrow views read at use: a reload is one
assignment, and no part keeps a value it was given at start."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.fakes import FakeProbe
from watchdog.daemon.config import (
    KillScope,
    LadderSettings,
    LaunchSettings,
    Live,
    PeerSettings,
    RestartOn,
    Settings,
    load,
    load_launch,
)
from watchdog.daemon.loop import Daemon
from watchdog.daemon.probes import datalink
from watchdog.states import Mode

SECRET = "s" * 24


@pytest.fixture
def daemon(tmp_path):
    settings = Settings(dir=str(tmp_path / "records"), state_dir=str(tmp_path / "state"),
                        deadline=60.0, peer_timeout=0.5, peers=("a:1",), secret=SECRET)
    d = Daemon(settings, FakeProbe())
    yield d
    for pool in (d.executor, d.asking, d.jobs.probing, d.jobs.sampling):
        pool.shutdown()


def test_a_reload_reaches_every_part_in_one_assignment(daemon):
    before = daemon.settings
    assert daemon.jobs.links.timeout() == 0.5
    new = dataclasses.replace(before, peer_timeout=0.2, grace=3.0, deadline=5.0,
                              mode="observe", evidence_timeout=4.0, peers=("b:2",),
                              kill_scope="rank")
    daemon.apply_settings(new)
    assert daemon.settings is new and daemon.live.settings is new
    # The data-link probe kept the peer_timeout it got at start (0.5) before.
    assert daemon.jobs.links.timeout() == 0.2
    assert daemon.enforcer.settings == new.ladder()
    assert daemon.enforcer.settings.grace == 3.0 and daemon.enforcer.settings.mode is Mode.OBSERVE
    assert daemon.responses.settings.response_bound() == new.ladder().response_bound()
    assert daemon.responses.bound() < before.ladder().response_bound()
    assert daemon.peers.settings == new.peering() and daemon.peers.settings.peers == ("b:2",)
    assert daemon.fences.settings.evidence_timeout == 4.0
    assert daemon.jobs.detector.rules == new.rules() and daemon.jobs.detector.rules.deadline == 5.0
    for part in (daemon.enforcer, daemon.responses, daemon.peers, daemon.fences):
        assert part.live is daemon.live and "settings" not in vars(part), part


def test_the_prober_reads_its_timeout_as_each_probe_starts():
    seconds, asked = [1.0], []
    prober = datalink.Prober(lambda fn: fn(), lambda: seconds[0],
                             probe_=lambda pid, timeout: asked.append(timeout) or "up")
    prober.ask((1, 0.0), 10.0)
    seconds[0] = 0.25  # a reload
    prober.ask((1, 0.0), 10.0 + datalink.PROBE_EVERY)
    assert asked == [1.0, 0.25]


def test_the_views_are_narrow_and_made_together():
    settings = Settings(peers=("a:1",), secret=SECRET, grace=2.0)
    live = Live(settings)
    assert isinstance(live.ladder, LadderSettings) and isinstance(live.peering, PeerSettings)
    assert not hasattr(live.ladder, "peers") and not hasattr(live.peering, "grace")
    assert live.ladder.ladder_span() == (settings.peer_timeout + settings.evidence_timeout
                                         + 2.0 + settings.kill_timeout + settings.settle)
    views = live._views
    live.settings = dataclasses.replace(settings, grace=5.0)
    assert live._views is not views and live.ladder.grace == 5.0 and views[1].grace == 2.0


def test_mode_kill_scope_and_restart_on_are_words_their_text_unchanged(tmp_path):
    path = tmp_path / "watchdog.toml"
    path.write_text('[watchdog]\nmode = "OBSERVE"\nkill_scope = "rank"\nrestart_on = "any"\n')
    settings, launch = load(str(path), {}), load_launch(str(path), {})
    assert settings.mode is Mode.OBSERVE and settings.kill_scope is KillScope.RANK
    assert launch.restart_on is RestartOn.ANY
    assert f"{settings.mode} {settings.kill_scope} {launch.restart_on}" == "observe rank any"
    built = Settings(mode="observe", kill_scope="rank")  # in code
    assert built.mode is Mode.OBSERVE and built.kill_scope is KillScope.RANK
    assert LaunchSettings(restart_on="torn-down").restart_on is RestartOn.TORN_DOWN
    assert dataclasses.replace(built, mode="enforce").mode is Mode.ENFORCE
