"""The one platform seam: which OS, and the defaults that follow from it."""

from __future__ import annotations

import os
import threading

import pytest

from watchdog import host
from watchdog.daemon.probes import samplegraph
from watchdog.daemon.probes.exits import ExitWatcher
from watchdog.launch import launcher


@pytest.mark.parametrize("platform, name", [
    ("darwin", host.DARWIN), ("linux", host.LINUX), ("linux2", host.LINUX),
    ("freebsd14", host.OTHER), ("win32", host.OTHER)])
def test_detect(platform, name):
    assert host.detect(platform) == name


def test_darwin_defaults_in_one_place(darwin):
    d = host.defaults()
    assert (d.record_dir, d.state_dir, d.service) == (
        "/var/run/mlx-watchdog", "/var/db/mlx-watchdog", "launchd")
    assert (d.stdout_log, d.stderr_log) == ("/var/log/mlx-watchdog.log",
                                            "/var/log/mlx-watchdog.err.log")
    assert host.for_service("launchd") == d
    darwin.OS = darwin.OTHER  # anything else gets Linux's paths
    assert host.defaults() == host.defaults(host.LINUX) == host.for_service("systemd")
    assert host.defaults().stdout_log is None  # the journal has them


def test_service_kind_follows_the_seam(darwin):
    from watchdog.cli.service.commands import _service_kind

    assert _service_kind(False, False) == "launchd"
    darwin.OS = darwin.LINUX
    assert _service_kind(False, False) == "systemd"


def test_no_exit_watcher_without_pidfd_or_kqueue(monkeypatch):
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    watcher = ExitWatcher(threading.Event())
    assert not watcher.available()
    watcher.start()
    assert watcher._thread is None
    watcher.join(1)


def test_find_mlx_launch(monkeypatch, tmp_path):
    assert os.path.basename(launcher.find_mlx_launch()) == "mlx.launch"
    monkeypatch.setattr(launcher.sysconfig, "get_path", lambda name: str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(launcher.LauncherError, match="pip install mlx"):
        launcher.find_mlx_launch()


def test_new_job_ids_differ_and_say_when():
    a, b = launcher.new_job_id(0), launcher.new_job_id(0)
    assert a != b and a.startswith("launch-19700101T000000-")


def test_sample_frames_without_a_library_and_threads_without_frames():
    text = ("Call graph:\n    10 Thread_1\n    + 10 ???  [0x1]\n    4 Thread_2\n")
    one, two = samplegraph.parse(text)
    assert one.to_json()["top"] == [{"frame": "???  [0x1]".split("  ")[0], "lib": "",
                                     "samples": 10}]
    assert samplegraph.summary_line(two) == "Thread_2: 4 samples, no frames"
