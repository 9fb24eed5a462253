"""doctor's checks of this Python environment: the rank side imports, no foreign
`watchdog` package shadows ours, the zero-code hook is installed, the dump signal
is free, and the tools that capture native stacks are there."""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import site
import sys
from importlib import metadata
from typing import Any

from watchdog import host

Line = tuple[str, str]
OK, WARN, FAIL = "ok", "warn", "fail"
MIN_MLX = (0, 32)
PTH = "mlx_watchdog.pth"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_instrumentation() -> list[Line]:
    """Whether the rank side imports here, its hot path, and MLX beside it."""
    lines: list[Line] = []
    try:
        importlib.import_module("watchdog.rank.hook")
    except Exception as err:  # noqa: BLE001 - report any failure to import
        lines.append((FAIL, f"watchdog.rank.hook does not import ({err!r}): "
                            "reinstall mlx-watchdog"))
    else:
        lines.append((OK, "watchdog.rank.hook imports (the rank side of the watchdog)"))
        lines.append(_hot_path())
    extra = "'mlx[cpu]'" if host.os_name() == host.LINUX else "mlx"
    try:
        mx: Any = importlib.import_module("mlx.core")
    except Exception as err:  # noqa: BLE001
        lines.append((FAIL, f"mlx.core does not import in {sys.executable} ({err}): "
                            f"pip install {extra}"))
        return lines
    version = str(getattr(mx, "__version__", "unknown"))
    if not hasattr(mx, "distributed"):
        lines.append((FAIL, f"mlx {version} has no mlx.core.distributed: pip install -U "
                            f"{extra}"))
    elif _version_tuple(version) < MIN_MLX:
        lines.append((WARN, f"mlx {version} is older than "
                            f"{'.'.join(map(str, MIN_MLX))}, the version mlx-watchdog is "
                            f"tested with: pip install -U {extra}"))
    else:
        lines.append((OK, f"mlx {version} (mlx.core imports)"))
    return lines


def _hot_path() -> Line:
    """Which hot path this environment's ranks run (watchdog/rank/compiled.py)."""
    from watchdog.rank import compiled

    fast, why = compiled.choice()
    wanted = os.environ.get(compiled.ENV, "auto").strip().lower() or "auto"
    if fast is not None or wanted == "python":
        return OK, f"hook hot path: {why}"
    if wanted not in compiled.CHOICES:
        return WARN, f"hook hot path: {why}; unset {compiled.ENV} or give one of those"
    return WARN, (f"hook hot path: {why}; the hook works, at a few times the cost per "
                  "call: reinstall mlx-watchdog where a C compiler is (on a Mac: "
                  "xcode-select --install), e.g. pip install --force-reinstall "
                  "--no-deps mlx-watchdog")


def check_foreign_watchdog() -> list[Line]:
    """The PyPI `watchdog` (filesystem events) shares our import name and folder."""
    lines: list[Line] = []
    fix = ("pip uninstall -y watchdog && pip install --force-reinstall mlx-watchdog (both own "
           "site-packages/watchdog/, so uninstalling one deletes files of the other), or give "
           "mlx-watchdog a virtual environment of its own")
    try:
        dist: Any = metadata.distribution("watchdog")
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        lines.append((FAIL, f"the PyPI package 'watchdog' {dist.version} (filesystem events, "
                            "not this project) is installed here and shares the import name "
                            f"'watchdog': {fix}"))
    package = sys.modules.get("watchdog") or importlib.import_module("watchdog")
    where = os.path.dirname(getattr(package, "__file__", None) or "") or "the 'watchdog' package"
    if not hasattr(package, "install") or not hasattr(package, "Heartbeat"):
        lines.append((FAIL, f"{where}/__init__.py is not mlx-watchdog's (no install()): "
                            f"another 'watchdog' overwrote it: {fix}"))
    try:
        observers = importlib.util.find_spec("watchdog.observers")
    except (ImportError, ValueError):
        observers = None
    if observers is not None:
        lines.append((FAIL, f"{where}/observers exists: files of the filesystem-events "
                            f"'watchdog' are mixed into this package: {fix}"))
    if not lines:
        lines.append((OK, "no foreign 'watchdog' package (the PyPI filesystem-events "
                          "library) in this environment"))
    return lines


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def check_pth() -> list[Line]:
    """Whether the `.pth` that `MLX_WATCHDOG=1` needs is installed and is this version's."""
    import watchdog

    # The one this version ships, beside the package (it looked beside the CLI's
    # module before, where no .pth is: the comparison never ran).
    shipped = os.path.join(os.path.dirname(os.path.abspath(watchdog.__file__)), "_pth", PTH)
    try:
        with open(shipped, "rb") as f:
            expected: bytes | None = f.read()
    except OSError:
        expected = None
    found = [os.path.join(d, PTH) for d in _site_dirs() if os.path.isfile(os.path.join(d, PTH))]
    if not found:
        return [(WARN, f"{PTH} is not in this interpreter's site-packages "
                       f"({', '.join(_site_dirs())}): MLX_WATCHDOG=1 does nothing here "
                       "(ranks calling watchdog.install() are unaffected); reinstall: pip "
                       "install --force-reinstall mlx-watchdog")]
    path = found[0]
    if expected is not None:
        try:
            with open(path, "rb") as f:
                if f.read() != expected:
                    return [(WARN, f"{path} differs from this version's hook: reinstall: "
                                   "pip install --force-reinstall mlx-watchdog")]
        except OSError as err:
            return [(WARN, f"{path} is unreadable ({err.strerror})")]
    return [(OK, f"zero-code hook {path} present: MLX_WATCHDOG=1 instruments any process "
                 "of this interpreter that imports mlx.core")]


def check_dump_signal() -> list[Line]:
    """Whether ranks started here dump their stacks on a signal the daemon sends."""
    from watchdog.daemon.signaller import DUMP_SIGNALS
    from watchdog.rank.hook import dump_signal_from_env

    raw = os.environ.get("MLX_WATCHDOG_DUMP_SIGNAL")
    signum = dump_signal_from_env()
    if raw is not None and raw.strip() not in ("", "0") and signum == 0:
        return [(FAIL, f"MLX_WATCHDOG_DUMP_SIGNAL={raw!r} is not a signal: use SIGUSR2 (the "
                       "default), SIGUSR1, a number, or 0 for no dumps")]
    if signum == 0:
        return [(WARN, "stack dumps are off (MLX_WATCHDOG_DUMP_SIGNAL=0): incidents will hold "
                       "no Python stacks; unset it to use SIGUSR2")]
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum not in DUMP_SIGNALS:
        return [(WARN, f"ranks would dump on {name}, which the daemon never sends (only "
                       "SIGUSR1, SIGUSR2 or a real-time signal): set "
                       "MLX_WATCHDOG_DUMP_SIGNAL=SIGUSR2")]
    source = "MLX_WATCHDOG_DUMP_SIGNAL" if raw else "the default"
    return [(OK, f"ranks dump their Python stacks on {name} ({source}); a program with its own "
                 f"{name} handler gets no dumps (the hook says so on its stderr)")]


def check_evidence_tools() -> list[Line]:
    """The native stack sampler the evidence would use here, and whether it may attach."""
    from watchdog.daemon.probes import probe

    command = probe().stack_command(os.getpid())
    lines: list[Line] = []
    if command is None:
        hint = ("/usr/bin/sample ships with macOS (the daemon runs it by that path alone)"
                if host.os_name() == host.DARWIN else "pip install py-spy, or apt install gdb")
        lines.append((WARN, "no native stack sampler for evidence (py-spy or gdb on Linux, "
                            f"sample on macOS): incidents get only Python stacks; {hint}"))
    else:
        tool = ("sample, simulated (watchdog.macsim.tools)" if host.simulated()
                else os.path.basename(command[0]))
        lines.append((OK, f"native stacks for evidence: {tool} ({command[0]})"))
        scope = _ptrace_scope()
        if scope is not None and scope >= 3:
            lines.append((WARN, "kernel.yama.ptrace_scope is 3: nobody may attach a debugger, "
                                "native stacks will be empty"))
        elif scope is not None and scope >= 1 and os.geteuid() != 0:
            lines.append((WARN, f"kernel.yama.ptrace_scope is {scope} and the daemon would not "
                                "be root: it cannot attach to ranks for native stacks (the "
                                "service runs as root)"))
    return lines


def _ptrace_scope() -> int | None:
    if host.os_name() != host.LINUX:
        return None  # Yama is Linux's; macOS lets root attach (SIP-protected binaries aside)
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


