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
