"""Build hook: compile the hook's optional C hot path (watchdog/rank/_fastpath.c, with
the Path type's setup in _fastpath_type.c and their structs in _fastpath.h).

Compiled with the C compiler Python itself was built with (sysconfig's LDSHARED),
next to its source, so an editable install finds it too. No compiler, or a failed
build, leaves the pure-Python hot path, which is always there: the wheel is then
pure and the install goes on (the reason is printed). `MLX_WATCHDOG_PURE_BUILD=1`
skips the compile. `mlx-watchdog doctor` says which path a rank uses.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

RANK = Path("watchdog") / "rank"
# As watchdog/rank/compiled.py SOURCES (the hash's order; tests/unit/rank/test_compiled.py
# checks a build's hash against it): the header, then the two units compiled together.
SOURCES = ("_fastpath.h", "_fastpath.c", "_fastpath_type.c")


def compile_fastpath(root: Path) -> Path:
    """Compile the extension in place; returns its path (raises if it cannot)."""
    sources = [root / RANK / name for name in SOURCES]
    out = root / RANK / ("_fastpath" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    out.unlink(missing_ok=True)  # a failed build must not leave an older one to be loaded
    ldshared = sysconfig.get_config_var("LDSHARED")
    if not ldshared:
        raise RuntimeError("this Python does not say how to build extensions (no LDSHARED)")
    # The sources' hash goes into the module: the hook refuses a module built from
    # other versions of them (an editable install not rebuilt after an edit).
    digest = hashlib.sha256(b"".join(source.read_bytes() for source in sources)).hexdigest()
    command = [*shlex.split(str(ldshared)),
               *shlex.split(str(sysconfig.get_config_var("CCSHARED") or "")),
               "-O2", "-Wall", "-I", sysconfig.get_paths()["include"],
               f'-DSOURCE_SHA256="{digest}"', *(str(s) for s in sources if s.suffix == ".c"),
               "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{done.stderr.strip()}")
    return out


class CompiledHotPath(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:  # type: ignore[type-arg]
        root = Path(self.root)
        if os.environ.get("MLX_WATCHDOG_PURE_BUILD") == "1":
            for old in (root / RANK).glob("_fastpath*.so"):
                old.unlink()  # an editable install would load it otherwise
            return
        try:
            out = compile_fastpath(root)
        except Exception as err:  # noqa: BLE001 - the pure-Python path stays
            print(f"mlx-watchdog: no compiled hot path, the pure-Python one is used ({err})",
                  file=sys.stderr)
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].append(out.relative_to(root).as_posix())
