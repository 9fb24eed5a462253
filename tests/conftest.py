import pytest


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
