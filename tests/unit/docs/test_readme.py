"""The README keeps its promises, and the docs cover what the code has.

- The README's "Quick start" lines are filtered as tests/ranks/docs/test_quick_start.py
  runs them: lines that need root (`sudo`), lines marked `# macOS`, and the install
  step itself (`pip install`, the venv; tests/unit/test_install.py installs the package
  for real) are left out; the install step is checked instead.
- Every `mlx-watchdog COMMAND` the README names exists (`--help` exits 0).
- Every `docs/...` file the README names or links exists, and so do the
  anchors it links to.
- The README's test command is the one `.ci/run` runs.
- docs/configuration.md lists every setting with its current default and
  flag; docs/operations.md has the anchor of every alert's runbook link.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from functools import cache

import pytest

from tests.support import REPO
from watchdog.daemon.config import HELP, LaunchSettings, Settings, default_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

README = REPO / "README.md"
DOCS = REPO / "docs"
TEST_COMMAND = "python3 -m ruff check . && python3 -m mypy && python3 -m pytest -q"
INSTALL_STEP = re.compile(r"\bpip install\b|-m venv\b|(^|&&\s*)(\.|source)\s+\S*activate\b"
                          r"|\bgit clone\b")
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
ALERT_ANCHORS = ("rank-hung", "rank-suspect", "rank-unkillable", "node-reboot-required",
                 "repeated-kills", "watchdog-down", "watchdog-not-scanning",
                 "watchdog-scans-slow", "invalid-records", "probe-errors",
                 "watchdog-observe-mode")


def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(markdown: str, title: str) -> str:
    """The text under the `## title` heading, up to the next heading of level 1 or 2."""
    match = re.search(rf"^##\s+{re.escape(title)}\s*$(.*?)(?=^#{{1,2}}\s|\Z)", markdown,
                      re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def shell_lines(markdown: str) -> list[str]:
    """The commands of the ```sh / ```bash blocks, continuation lines joined."""
    lines: list[str] = []
    for lang, body in FENCE.findall(markdown):
        if lang not in ("sh", "bash", "shell", "console"):
            continue
        pending = ""
        for raw in body.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def is_install_step(line: str) -> bool:
    return bool(INSTALL_STEP.search(line))


def runnable_here(line: str) -> bool:
    """Can this quick-start line run on Linux as an ordinary user, after the install?"""
    command = re.sub(r"\s+#.*$", "", line)  # a trailing comment is not part of it
    if re.search(r"(^|[\s;&|(])sudo\s", command):
        return False
    if line.rstrip().endswith("# macOS"):
        return False
    return not is_install_step(line)


def script_dirs() -> list[str]:
    """Where this interpreter's console scripts (mlx-watchdog) and python3 live."""
    dirs = [os.path.dirname(sys.executable), sysconfig.get_path("scripts")]
    try:
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    return [d for d in dict.fromkeys(dirs) if d and os.path.isdir(d)]


@cache
def cli_script() -> str:
    path = shutil.which("mlx-watchdog", path=os.pathsep.join(
        [*script_dirs(), os.environ.get("PATH", "")]))
    if path is None:
        pytest.fail("no mlx-watchdog script: install the package first "
                    "(python3 -m pip install -e '.[test]')")
    return path


# -- the quick start -----------------------------------------------------------


def test_quick_start_filter():
    assert not runnable_here("sudo mlx-watchdog service install --launchd   # macOS")
    assert not runnable_here("sudo systemctl daemon-reload")
    assert not runnable_here("launchctl print system/x   # macOS")
    assert not runnable_here("python3 -m venv .venv && . .venv/bin/activate")
    assert not runnable_here("python3 -m pip install -e '.[test]'")
    assert runnable_here("mlx-watchdog demo")
    assert runnable_here("mlx-watchdog status --json  # sudo is not needed")


def test_quick_start_install_step_is_sound():
    """The install lines name extras that exist and the Python the package needs."""
    quick = section(readme(), "Quick start")
    install = [line for line in shell_lines(quick) if is_install_step(line)]
    assert any("pip install" in line for line in install), quick
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    for line in install:
        for wanted in re.findall(r"\.\[([\w,-]+)\]", line):
            for extra in wanted.split(","):
                assert extra in extras, f"{line!r} asks for extra {extra!r}: not in pyproject"
    # The demo needs the package alone: the test extra (mlx-lm, ...) is for the tests.
    assert "python3 -m pip install ." in install, install
    assert not any("[test]" in line for line in install), install
    minimum = re.search(r">=\s*(3\.\d+)", project["requires-python"])
    assert minimum and f"Python {minimum.group(1)}" in quick, (
        "the quick start must say which Python the package needs")


def test_test_command_is_what_ci_runs():
    lines = shell_lines(section(readme(), "Running the tests"))
    assert TEST_COMMAND in lines, lines
    ci = (REPO / ".ci" / "run").read_text()
    assert TEST_COMMAND in ci
    assert "bash .ci/run" in readme()
    # What the suite needs beyond pip is said before the command, and it is what CI installs.
    before = lines[:lines.index(TEST_COMMAND)]
    assert any(re.search(r"apt-get install\b.*\bprometheus\b", line) for line in before), before
    assert re.search(r"apt-get install\b.*\bprometheus\b", ci)
    assert any("pip install -e '.[test]'" in line for line in before), before


@pytest.mark.slow
def test_shell_completion_lines_work_as_written(tmp_path):
    """The README's completion lines: bash's defines the completion function and
    completes a command; zsh's source is zsh's (compdef)."""
    lines = shell_lines(section(readme(), "Shell completion"))
    bash = [line for line in lines if line.endswith("# bash")]
    zsh = [line for line in lines if line.endswith("# zsh")]
    assert len(bash) == 1 and len(zsh) == 1, lines
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env.update(PYTHONPATH=str(REPO), PATH=os.pathsep.join([*script_dirs(), env.get("PATH", "")]))
    done = subprocess.run(["bash", "-c", f"{bash[0]}\ncomplete -p mlx-watchdog"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "_mlx_watchdog_completion" in done.stdout
    asked = subprocess.run([cli_script()], env={**env, "COMP_WORDS": "mlx-watchdog sta",
                                                "COMP_CWORD": "1",
                                                "_MLX_WATCHDOG_COMPLETE": "bash_complete"},
                           capture_output=True, text=True, timeout=60)
    assert "plain,status" in asked.stdout.splitlines(), asked.stdout
    source = re.search(r'"\$\((.*)\)"', zsh[0])
    assert source
    made = subprocess.run(["bash", "-c", source.group(1)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert "compdef" in made.stdout, made.stdout


# -- commands, files and links the README names ----------------------------------


def code_spans(markdown: str) -> list[str]:
    """The contents of fenced blocks and of inline `code`."""
    spans = [body for _, body in FENCE.findall(markdown)]
    prose = FENCE.sub("", markdown)
    spans += re.findall(r"`([^`\n]+)`", prose)
    return spans


def named_commands(markdown: str) -> set[tuple[str, ...]]:
    """Each `mlx-watchdog WORD [WORD]` in code: the command and maybe its subcommand."""
    found: set[tuple[str, ...]] = set()
    for span in code_spans(markdown):
        for match in re.finditer(r"(?<![\w/.$-])mlx-watchdog((?: [a-z][a-z-]*)+)", span):
            found.add(tuple(match.group(1).split()[:2]))
    return found


def help_of(*words: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([cli_script(), *words, "--help"], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


def subcommands(help_text: str) -> set[str]:
    block = help_text.split("Commands:", 1)
    if len(block) == 1:
        return set()
    return {m.group(1) for m in re.finditer(r"^\s{2}([a-z][a-z-]*)\b", block[1], re.M)}


@pytest.mark.slow
def test_every_command_the_readme_names_exists():
    named = named_commands(readme())
    assert {("demo",), ("run",), ("status",), ("doctor",)} <= {n[:1] for n in named}, named
    checked = set()
    for words in sorted(named):
        top = help_of(words[0])
        assert top.returncode == 0, f"mlx-watchdog {words[0]} --help:\n{top.stdout}{top.stderr}"
        subs = subcommands(top.stdout)
        if subs and len(words) > 1:
            assert words[1] in subs, f"mlx-watchdog {' '.join(words)}: no such subcommand"
            sub = help_of(*words)
            assert sub.returncode == 0, f"mlx-watchdog {' '.join(words)} --help:\n{sub.stderr}"
        checked.add(" ".join(words[: 2 if subs else 1]))
    assert {"node status", "node clear-reboot", "cluster status", "service install"} <= checked


def heading_anchors(markdown: str) -> set[str]:
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', markdown))
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_docs_file_the_readme_names_exists():
    text = readme()
    named = set(re.findall(r"(?<![\w/])(docs/[\w./-]*\w)", text))
    assert named, "the README names no docs"
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert not missing, f"README names missing files: {missing}"
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", text)
    assert {path for path, _ in links} >= {"docs/architecture.md", "docs/operations.md",
                                          "docs/configuration.md", "docs/limits.md"}
    for path, anchor in links:
        assert path.endswith(".md") and (REPO / path).is_file(), path
        if anchor:
            assert anchor in heading_anchors((REPO / path).read_text(encoding="utf-8")), (
                f"README links {path}#{anchor}, which has no such anchor")


def test_links_between_the_docs_resolve():
    for page in ("architecture", "operations", "configuration", "limits"):
        text = (DOCS / f"{page}.md").read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([\w./-]*)(?:#([\w-]+))?\)", text):
            target_path = DOCS / target if target else DOCS / f"{page}.md"
            assert target_path.is_file(), f"docs/{page}.md links missing {target}"
            if anchor:
                assert anchor in heading_anchors(target_path.read_text(encoding="utf-8")), (
                    f"docs/{page}.md links {target}#{anchor}, which has no such anchor")


# -- the docs cover the code ------------------------------------------------------------


def test_configuration_doc_lists_every_setting_with_its_default():
    doc = (DOCS / "configuration.md").read_text(encoding="utf-8")
    defaults = dict(re.findall(r"^# (\w+) = (.+)$", default_toml(), re.M))
    for f in (*dataclasses.fields(Settings), *dataclasses.fields(LaunchSettings)):
        row = re.search(rf"^\| `{f.name}` \|(.*)$", doc, re.M)
        assert row, f"docs/configuration.md has no row for {f.name}"
        assert f"`{defaults[f.name]}`" in row.group(1), (
            f"docs/configuration.md: {f.name} should show its default `{defaults[f.name]}`")
        flag = "--" + f.name.replace("_", "-")
        assert f"`{flag}`" in doc, f"docs/configuration.md does not name the flag {flag}"
        assert f.name in HELP
    for variable in ("MLX_WATCHDOG_DIR", "MLX_WATCHDOG_STATE_DIR", "MLX_WATCHDOG_CONFIG",
                     "MLX_WATCHDOG_SECRET", "MLX_WATCHDOG_JOB", "MLX_WATCHDOG_DUMP_SIGNAL",
                     "`MLX_WATCHDOG`"):
        assert variable in doc, f"docs/configuration.md does not explain {variable}"


def test_operations_doc_has_every_runbook_anchor():
    doc = (DOCS / "operations.md").read_text(encoding="utf-8")
    alerts = (DOCS / "alerts.yml").read_text(encoding="utf-8")
    linked = set(re.findall(r"docs/operations\.md#([\w-]+)", alerts))
    assert linked, "docs/alerts.yml links no runbook anchors"
    for anchor in linked | set(ALERT_ANCHORS):
        assert f'<a id="{anchor}"></a>' in doc, f"docs/operations.md lacks anchor {anchor}"
    for state in ("running", "idle", "suspect", "stalled", "blocked", "stopped", "killed",
                  "unkillable", "exited"):
        assert re.search(rf"^\| `{state}` \|", doc, re.M), f"operations.md: no row for {state}"


def test_the_docs_say_what_a_down_peer_costs_a_start_and_what_the_quota_needs():
    from watchdog.launch.health import PEER_DOWN_AFTER

    ops = (DOCS / "operations.md").read_text(encoding="utf-8")
    waits = ops.split('<a id="wait-healthy"></a>', 1)[1].split("\n## ", 1)[0]
    assert f"holds every\nstart for {PEER_DOWN_AFTER:g} s" in waits
    assert f"{PEER_DOWN_AFTER:g} s" in (DOCS / "cluster.md").read_text(encoding="utf-8")
    quota = ops[ops.index("usrquota"):][:600]
    assert "CONFIG_TMPFS_QUOTA" in quota
