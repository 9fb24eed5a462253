"""The package as users get it: built and installed non-editable into a fresh venv.

The venv borrows this machine's dependencies (mlx, psutil, click,
prometheus_client) through a plain path line in a `.pth` file, rather than
`--system-site-packages`: a path line adds the directories without running
the `.pth` files in them, so the editable install's own `mlx_watchdog.pth`
there cannot stand in for the one the wheel must ship. Everything then runs
from the venv's interpreter with the working directory outside the
repository and no PYTHONPATH, so the checkout itself is never imported.

The build fetches hatchling from PyPI (pip's isolated build), unless
hatchling is already importable here, in which case it builds offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO

# A venv built from a wheel: every test here is slow.
pytestmark = pytest.mark.slow

BUDGET = 300.0  # seconds for everything in this module
DEPENDENCIES = ("mlx.core", "psutil", "click", "prometheus_client")


@dataclass
class Venv:
    root: Path
    python: Path
    script: Path
    site: Path
    work: Path
    deadline: float

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MLX_", "PYTHON", "PIP_", "VIRTUAL_ENV"))}
        env["PATH"] = os.pathsep.join([str(self.python.parent), env.get("PATH", "")])
        env["PYTHONNOUSERSITE"] = "1"  # nothing from ~/.local either
        env.update(extra)
        return env

    def run(self, argv: list[str], *, limit: float = 120.0,
            **extra: str) -> subprocess.CompletedProcess[str]:
        left = self.deadline - time.monotonic()
        if left <= 1:
            pytest.fail(f"the install tests ran out of their {BUDGET:.0f}s budget")
        return subprocess.run(argv, cwd=self.work, env=self.env(**extra), text=True,
                              capture_output=True, stdin=subprocess.DEVNULL,
                              timeout=min(limit, left))


def hatchling_here() -> bool:
    return importlib.util.find_spec("hatchling") is not None


def dependency_dirs() -> list[str]:
    """The sys.path entries this interpreter finds the runtime dependencies in."""
    dirs: list[str] = []
    for name in DEPENDENCIES + (("hatchling",) if hatchling_here() else ()):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, f"{name} is not importable here"
        origin = os.path.realpath(spec.origin)
        entries = [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)]
        holder = max((p for p in entries if origin.startswith(p + os.sep)), key=len)
        assert holder != os.path.realpath(REPO), f"{name} comes from the checkout itself"
        if holder not in dirs:
            dirs.append(holder)
    return dirs


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    deadline = time.monotonic() + BUDGET
    base = tmp_path_factory.mktemp("install")
    root, work = base / "venv", base / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120,
                   capture_output=True, cwd=work)
    bindir = "Scripts" if os.name == "nt" else "bin"
    python = root / bindir / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    (site / "_borrowed_dependencies.pth").write_text("\n".join(dependency_dirs()) + "\n")
    v = Venv(root, python, root / bindir / "mlx-watchdog", site, work, deadline)

    argv = [str(python), "-m", "pip", "install", "--no-deps", "--no-input",
            "--disable-pip-version-check", str(REPO)]
    if hatchling_here():  # build offline with it (borrowed above); else pip fetches it
        argv.insert(argv.index("--no-deps"), "--no-build-isolation")
    done = v.run(argv, limit=240)
    assert done.returncode == 0, (
        "pip could not build and install the package (the build needs hatchling: from PyPI,"
        f" or installed here):\n{done.stdout}\n{done.stderr}")
    return v


def test_installed_not_editable(venv: Venv):
    assert venv.script.is_file()
    found = venv.run([str(venv.python), "-c", "import watchdog, sys; print(watchdog.__file__)"])
    assert found.returncode == 0, found.stderr
    where = Path(found.stdout.strip()).resolve()
    assert where.is_relative_to(venv.root.resolve()), f"imported {where}, not the venv's copy"
    assert not where.is_relative_to(REPO), where
    package = venv.site / "watchdog"
    files = {str(p.relative_to(package)) for p in package.rglob("*") if p.is_file()}
    shipped_modules = {"__init__.py", "py.typed", "rank/hook.py", "cli/commands.py",
                       "cli/demo/rank.py", "daemon/loop.py", "net/metrics.py"}
    assert shipped_modules <= files, files
    shipped = venv.site / "mlx_watchdog.pth"
    assert shipped.is_file(), "the wheel did not install mlx_watchdog.pth into site-packages"
    assert shipped.read_bytes() == (REPO / "watchdog" / "_pth" / "mlx_watchdog.pth").read_bytes()


def test_cli_runs_from_the_venv(venv: Venv):
    helped = venv.run([str(venv.script), "--help"])
    assert helped.returncode == 0, helped.stderr
    assert "Usage: mlx-watchdog" in helped.stdout
    for command in ("run", "status", "demo", "doctor", "service"):
        assert command in helped.stdout
    version = venv.run([str(venv.script), "--version"])
    assert version.returncode == 0 and "mlx-watchdog" in version.stdout, version


RANK = textwrap.dedent("""
    import json, os, sys
    import mlx.core as mx
    directory = os.environ["RECORDS"]
    loaded = "watchdog" in sys.modules
    x = mx.ones(8) * 2
    mx.eval(x)
    total = x.sum().item()
    mine = f"{os.getpid()}.rec"
    report = {"loaded": loaded, "total": total, "record": mine in os.listdir(directory),
              "wrapped": hasattr(mx.eval, "__wrapped__")}
    if loaded:
        from watchdog import record
        rec = record.read_path(os.path.join(directory, mine))
        report.update(pid_ok=rec.pid == os.getpid(), completed=rec.waits_completed,
                      hook=sys.modules["watchdog.rank.hook"].__file__)
    print(json.dumps(report))
""")


def run_rank(venv: Venv, tmp_path: Path, **extra: str) -> tuple[dict[str, object], Path]:
    records = tmp_path / "records"
    records.mkdir()
    ran = venv.run([str(venv.python), "-c", RANK], RECORDS=str(records),
                   MLX_WATCHDOG_DIR=str(records), **extra)
    assert ran.returncode == 0, f"{ran.stdout}\n{ran.stderr}"
    return json.loads(ran.stdout.strip().splitlines()[-1]), records


def test_zero_code_rank_publishes_a_record(venv: Venv, tmp_path: Path):
    report, records = run_rank(venv, tmp_path, MLX_WATCHDOG="1")
    assert report["total"] == 16.0
    assert report["loaded"] and report["wrapped"], report
    assert report["record"] and report["pid_ok"], report
    assert isinstance(report["completed"], int) and report["completed"] >= 2, report
    assert Path(str(report["hook"])).resolve().is_relative_to(venv.root.resolve()), report
    assert not list(records.glob("*.rec")), "a clean exit must remove the record"


def test_without_mlx_watchdog_nothing_happens(venv: Venv, tmp_path: Path):
    report, records = run_rank(venv, tmp_path)
    assert report == {"loaded": False, "total": 16.0, "record": False, "wrapped": False}
    assert not list(records.iterdir())


@pytest.mark.ranks
def test_demo_runs_from_the_installed_package(venv: Venv):
    demo = venv.run([str(venv.script), "demo", "--ranks", "3", "--deadline", "3"], limit=180,
                    PYTHONUNBUFFERED="1")
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert "outcome as expected" in out, out
    assert str(REPO) not in out.replace(str(venv.root), ""), (
        "the installed demo ran code from the checkout")

