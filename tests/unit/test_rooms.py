"""Imports only point down (docs/architecture.md, "The parts"), and no module reaches
itself: every `watchdog` import in every module, a function's own included, and every load
by name (`importlib.import_module("watchdog...")`, `__import__("watchdog...")`), read from
the source and held to the rooms' rules: `cli` on top, then the launcher (`launch`), then
`daemon`, then `net`, then the contracts; `rank` (with the public API that loads it) beside
them, reading only the record, the states, the table of backends, `procstat.py` and
`host.py`. The simulated Mac (`macsim`, docs/macos.md) stands on the contracts alone: the
probes load it where they choose the platform, a rank on it its GPU's label
(`macsim.gpu`), only when MLX_WATCHDOG_SIMULATE=macos."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import watchdog

PACKAGE = Path(watchdog.__file__).resolve().parent
ROOMS = ("cli", "launch", "daemon", "net", "rank", "record", "macsim")
# The public rank API, rank's side when it imports; the package itself is lazy (it loads
# the rank side only when its API is used), so anyone may read its `__version__`.
RANK_API = ("watchdog", "watchdog._autoload")

# What each room may import besides itself and the contracts (every other top-level module).
MAY_USE: dict[str, set[str]] = {
    "macsim": set(),
    "cli": {"launch", "daemon", "net", "rank"},
    "launch": {"daemon", "net"},
    "daemon": {"net", "macsim"},
    "net": set(),
    "contracts": set(),
}
# host.py too: a rank on the simulated Mac labels MLX's compute thread, its GPU (the
# record reads it already, for the default directory), with the simulated Mac's `gpu`.
RANK_READS = {"record", "watchdog.states", "watchdog.backends", "watchdog.procstat",
              "watchdog.host", "watchdog.macsim.gpu"}
# Who loads the simulated Mac: the probes' choice of platform, and a rank's hook.
MACSIM_LOADERS = {"watchdog.daemon.probes", "watchdog.rank.hook"}
# The calls that load a module by name, its name their first argument.
LOADS_BY_NAME = {"import_module", "__import__"}


def module_name(path: Path) -> str:
    parts = ("watchdog",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


def imports(path: Path) -> Iterator[str]:
    """Every watchdog module a file imports (`from watchdog import host` is `watchdog.host`)."""
    return imports_in(path.read_text(encoding="utf-8"))


def loaded_by_name(node: ast.AST) -> str | None:
    """The module a call loads by name (`importlib.import_module("watchdog.macsim")`,
    `import_module(...)`, `__import__(...)`), when its name is written out; else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if name in LOADS_BY_NAME and isinstance(first, ast.Constant) \
            and isinstance(first.value, str):
        return first.value
    return None


def imports_in(source: str) -> Iterator[str]:
    """Every watchdog module some source imports, or loads by a name written out."""
    for node in ast.walk(ast.parse(source)):
        loaded = loaded_by_name(node)
        if loaded is not None and loaded.startswith("watchdog"):
            yield loaded
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("watchdog"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith("watchdog"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                below = PACKAGE.joinpath(*name.split(".")[1:])
                is_module = below.with_suffix(".py").exists() or below.is_dir()
                yield name if is_module else node.module


def room(module: str, importer: bool = True) -> str:
    if module in RANK_API and (importer or module != "watchdog"):
        return "rank"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1] if parts[1] != "record" else "contracts"
    return "contracts"


def graph() -> dict[str, set[str]]:
    return {module_name(p): set(imports(p)) for p in PACKAGE.rglob("*.py")}


def test_imports_only_point_down() -> None:
    wrong = []
    for module, targets in graph().items():
        here = room(module)
        for target in targets:
            there = room(target, importer=False)
            if here == "rank":
                ok = there == "rank" or target.startswith("watchdog.record") or target in RANK_READS
            else:
                ok = there in (here, "contracts") or there in MAY_USE[here]
            if not ok:
                wrong.append(f"{module} ({here}) imports {target} ({there})")
    assert wrong == []


def circles(modules: dict[str, set[str]]) -> list[list[str]]:
    """Every group of two modules or more that import each other in a loop (the strongly
    connected parts of the graph, Tarjan's), each import's target taken as the module it
    names or, for a name inside one (`watchdog.host.LINUX`), that module."""
    def resolved(target: str) -> str | None:
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        return target if target in modules else None

    edges = {m: {t for t in map(resolved, targets) if t is not None and t != m}
             for m, targets in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in edges[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = [stack.pop()]
            while group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in edges:
        if module not in index:
            visit(module)
    return found


def test_no_module_reaches_itself() -> None:
    """0 circles: no module imports (or loads by name) one that, by any path of imports,
    a function's own and loads by name included, imports it back."""
    assert circles(graph()) == []


def test_the_simulated_mac_is_loaded_where_the_platform_is_chosen() -> None:
    """The probes' choice of platform loads the simulated Mac, and a rank's hook its GPU's
    label; nothing else does, and it imports only the contracts (never host.py's loader
    again: host.py imports nothing of it)."""
    modules = graph()
    loaders = {m for m, targets in modules.items() if room(m) != "macsim"
               and any(room(t, importer=False) == "macsim" for t in targets)}
    assert loaders == MACSIM_LOADERS
    assert {room(t, importer=False) for m, targets in modules.items() if room(m) == "macsim"
            for t in targets} <= {"macsim", "contracts"}


def test_a_load_by_name_and_a_circle_are_seen() -> None:
    """The test itself: a module loaded by a name written out is an arrow, as an import
    is; a loop of two modules, or of four through a package, is a circle."""
    source = ("import importlib\n"
              "def f():\n"
              "    importlib.import_module('watchdog.macsim')\n"
              "    __import__('watchdog.daemon.loop')\n"
              "    importlib.import_module(name)\n")
    assert set(imports_in(source)) == {"watchdog.macsim", "watchdog.daemon.loop"}
    assert circles({"a": {"b.X"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    four = {"host": {"macsim"}, "macsim": {"macsim.tools"}, "macsim.tools": {"procstat"},
            "procstat": {"host.LINUX"}}
    assert circles(four) == [sorted(four)]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_launcher_is_a_room_of_its_own_and_its_command_is_thin() -> None:
    """The launcher's modules are under watchdog/launch/; cli/launch/ holds only the command,
    which reaches the launcher only inside its body (loading the command line loads none)."""
    modules = graph()
    launch = {m for m in modules if room(m) == "launch"}
    assert {"watchdog.launch.supervisor", "watchdog.launch.relaunch", "watchdog.launch.childio",
            "watchdog.launch.launcher", "watchdog.launch.health"} <= launch
    assert {m for m in modules if m.startswith("watchdog.cli.launch")} == {
        "watchdog.cli.launch", "watchdog.cli.launch.commands"}
    importers = {m for m, targets in modules.items()
                 if any(room(t, importer=False) == "launch" for t in targets)}
    assert {room(m) for m in importers} <= {"cli", "launch"}, importers


def test_the_rules_catch_an_import_up() -> None:
    """The test itself: an import up is named, one down is not."""
    assert room("watchdog.daemon.loop") == "daemon" and room("watchdog.status") == "contracts"
    assert room("watchdog") == "rank" and room("watchdog", importer=False) == "contracts"
    assert room("watchdog._autoload", importer=False) == "rank"
    assert room("watchdog.record.layout") == "contracts"
    assert "launch" not in MAY_USE["daemon"] and "cli" not in MAY_USE["launch"]
    source = PACKAGE / "daemon" / "store" / "snapshot.py"
    assert "watchdog.daemon.store.journal" in set(imports(source))
    assert all(room(t) in ("daemon", "contracts") for t in imports(source))


# Inside daemon/, bottom up (docs/architecture.md, "The parts"): each part (a module, or a
# package such as judge/) imports only parts on floors below its own. A new part gets a floor.
DAEMON_FLOORS: tuple[frozenset[str], ...] = tuple(frozenset(floor) for floor in (
    {"sample", "clock", "counters", "recdir", "lograte", "values"},  # data, the clock, what
    # is counted, a setting's text read
    {"probes", "judge"},  # the OS seam; the pure judgement
    {"config", "view", "observation", "attempts", "wired"},  # settings; a rank as shown; ...
    {"signaller"},  # the one class that signals
    {"store", "lifecycle"},  # the daemon's files; a rank's lifecycle
    {"sightings", "early", "paces"},  # what a scan saw of a rank; its early samples; paces
    {"holds", "table", "jobs", "publish", "roomkeeper"},  # a scan's parts
    {"act"},  # the responses
    {"fences", "outcomes"},  # fences in, and orphans; what a finished response did
    {"loop"},  # the wiring
    {"runner"},  # `run`
))


def daemon_part(module: str) -> str | None:
    """`watchdog.daemon.judge.wedge` is the part `judge`; None outside daemon/ (or its face)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["watchdog", "daemon"] else None


def floor_of(part: str) -> int:
    return next(i for i, floor in enumerate(DAEMON_FLOORS) if part in floor)


def test_inside_the_daemon_imports_only_point_down() -> None:
    modules = graph()
    parts = {p for p in map(daemon_part, modules) if p is not None}
    assert parts == set().union(*DAEMON_FLOORS), "every part of daemon/ has one floor"
    wrong = []
    for module, targets in modules.items():
        here = daemon_part(module)
        for target in targets:
            there = daemon_part(target)
            if here is None or there is None or there == here:
                continue
            if floor_of(there) >= floor_of(here):
                wrong.append(f"{module} (floor {floor_of(here)}) imports {target} "
                             f"(floor {floor_of(there)})")
    assert wrong == []


def test_the_daemon_s_floors_catch_an_import_up() -> None:
    """The test itself: a scan's judgement (jobs) sits below the loop and above the judge."""
    assert daemon_part("watchdog.daemon.judge.wedge") == "judge"
    assert daemon_part("watchdog.daemon") is None and daemon_part("watchdog.status") is None
    assert floor_of("judge") < floor_of("jobs") < floor_of("loop")
    assert floor_of("sample") < floor_of("probes") and floor_of("sample") < floor_of("judge")


MAX_MODULE_LINES = 600  # a module longer is two
MAX_CLASS_LINES = 300  # a class longer owns too much


def test_no_module_over_600_lines_and_no_class_over_300() -> None:
    """The house's size bars (issue 59): a room that grows past them is split."""
    long_modules, long_classes = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        if source.count("\n") > MAX_MODULE_LINES:
            long_modules.append((module_name(path), source.count("\n")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None \
                    and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                long_classes.append((module_name(path), node.name,
                                     node.end_lineno - node.lineno + 1))
    assert long_modules == [] and long_classes == [], (long_modules, long_classes)
