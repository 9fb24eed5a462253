"""Zero-code activation: imported from `mlx_watchdog.pth` when MLX_WATCHDOG=1.

Adds an import hook that calls `watchdog.install(lazy=True)` right after
`mlx.core` finishes importing, so a process that never names the watchdog is
instrumented; its record opens at its first wait or collective, so a process
that only imports mlx.core (`mlx.launch` itself) is never published as a rank.
Processes that never import mlx pay for one finder lookup.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

TARGET = "mlx.core"


class _InstallAfter(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        """Create the module as the wrapped loader would."""
        return self._inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        """Run the module, then install the hook lazily on it (never failing the import)."""
        self._inner.exec_module(module)
        try:
            from watchdog.rank.hook import install

            install(lazy=True)  # published at its first wait: a launcher never is
        except Exception as err:  # noqa: BLE001 - never break the user's import
            sys.stderr.write(f"mlx-watchdog: not instrumenting this process: {err!r}\n")


class MlxCoreFinder(importlib.abc.MetaPathFinder):
    """A one-shot import hook: when `mlx.core` is first imported, the hook is installed
    on it (`MLX_WATCHDOG=1`: zero-code), and the finder takes itself off the path."""
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        """`mlx.core`'s spec, its loader installing the hook (once); None for others."""
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # one shot: only the first import needs us
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _InstallAfter(spec.loader)
                return spec
        return None


if TARGET in sys.modules:
    from watchdog.rank.hook import install

    install(lazy=True)
elif not any(isinstance(f, MlxCoreFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, MlxCoreFinder())
