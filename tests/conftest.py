"""Fixtures shared by every level, and the level as a marker.

Everything under tests/ranks/ and tests/multihost/ runs real processes (MLX ranks, the
daemon, servers, network namespaces) and is marked `ranks` here, so `pytest -m "not
ranks"` runs the fast layer alone; tests of tests/unit/ that do so carry the mark
themselves. Tests of tests/unit/ that start processes, a venv or a server, or race
threads, for a fifth of a second or more, are marked `slow`: `pytest -m "not ranks
and not slow"` is the quick layer, in seconds.
"""

from pathlib import Path

import pytest

REAL_PROCESS_LEVELS = ("ranks", "multihost")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        level = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else ""
        if level in REAL_PROCESS_LEVELS:
            item.add_marker(pytest.mark.ranks)


@pytest.fixture
def record_dir(tmp_path):
    d = tmp_path / "records"
    d.mkdir()
    return d


@pytest.fixture
def state_dir(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def darwin(monkeypatch):
    """Take the macOS branches: the one platform seam is `watchdog.host.OS`."""
    from watchdog import host

    monkeypatch.setattr(host, "OS", host.DARWIN)
    return host


@pytest.fixture(params=["compiled", "python"])
def hotpath(request, monkeypatch):
    """Run the test over each hot path of the hook: the compiled one (which CI builds, so
    it must be there) and the pure-Python one. Subprocesses inherit the choice."""
    from watchdog.rank import compiled

    monkeypatch.setenv(compiled.ENV, request.param)
    if request.param == "compiled":
        fast, why = compiled.choice()
        assert fast is not None, f"the compiled hot path is not usable here: {why}"
    return request.param
