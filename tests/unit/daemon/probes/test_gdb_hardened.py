"""Root's gdb runs nothing a rank's owner names (issue 48, defect 1).

A user's rank loads a library by a path that leads through gdb's auto-load directory
(`/usr/share/gdb/auto-load/../../../../<theirs>/lib.so`): gdb's safe-path check matches
the unresolved name, and an unhardened gdb run as root executes the script the library
carries in its `.debug_gdb_scripts` section. The control proves the reproduction is live;
every gdb the daemon starts (the evidence command and the wedge sampler) must not run it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.users import OTHER_UID, fork_as
from watchdog import gdbstack
from watchdog.daemon.probes.linux import LinuxProbe

pytestmark = pytest.mark.slow

EVIL = r"""
asm(".pushsection \".debug_gdb_scripts\", \"MS\",@progbits,1\n"
    ".byte 4\n"
    ".ascii \"gdb.inlined-script\\n\"\n"
    ".ascii \"import os\\n\"\n"
    ".ascii \"open('MARKER', 'w').write(str(os.getuid()))\\n\"\n"
    ".byte 0\n"
    ".popsection\n");
int evil(void) { return 42; }
"""
AUTOLOAD = "/usr/share/gdb/auto-load"


@pytest.fixture
def hostile_rank(tmp_path: Path):
    """Another user's process that loaded a script-carrying library through gdb's
    auto-load directory; (its pid, the file the script would write as root)."""
    gdb = shutil.which("gdb")
    assert gdb, "gdb is needed (apt install gdb; .ci/run installs it)"
    assert os.path.isdir(AUTOLOAD), f"{AUTOLOAD} is gdb's (apt install gdb)"
    theirs = Path(f"/tmp/mlxwd-hostile-{os.getpid()}")
    theirs.mkdir(mode=0o755)
    marker = tmp_path / "written-by-gdb"  # root's: only root can write here
    try:
        source = theirs / "evil.c"
        source.write_text(EVIL.replace("MARKER", str(marker)))
        lib = theirs / "libevil.so"
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
        os.chmod(lib, 0o755)
        via = AUTOLOAD + "/.." * AUTOLOAD.count("/") + str(lib)
        assert os.path.samefile(via, lib)

        def rank(report: int) -> None:
            ctypes.CDLL(via)
            os.write(report, b"ready")
            time.sleep(60)

        pid, read = fork_as(OTHER_UID, rank)
        try:
            assert os.read(read, 5) == b"ready"
            yield pid, marker
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read)
    finally:
        shutil.rmtree(theirs, ignore_errors=True)


def test_an_unhardened_gdb_runs_the_users_script_as_root(hostile_rank) -> None:
    pid, marker = hostile_rank
    gdb = shutil.which("gdb")
    assert gdb
    subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                   capture_output=True, timeout=60, check=False)
    assert marker.read_text() == "0", "the reproduction is dead: the test proves nothing"


def test_the_evidence_gdb_runs_nothing_the_rank_names(hostile_rank) -> None:
    pid, marker = hostile_rank
    command = LinuxProbe().stack_command(pid)
    assert command == gdbstack.command(command[0], pid)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert "time_sleep" in done.stdout  # it still reads the stacks
    assert not marker.exists()


def test_the_wedge_samplers_gdb_runs_nothing_the_rank_names(hostile_rank) -> None:
    pid, marker = hostile_rank
    deadline = time.monotonic() + 30
    stacks = LinuxProbe().native_stacks(pid, 20.0)
    assert time.monotonic() < deadline
    assert stacks and any("time_sleep" in frames for frames in stacks.values())
    assert not marker.exists()


def test_every_gdb_is_built_in_one_place() -> None:
    """No module but gdbstack spells gdb's options: a new caller cannot forget one."""
    root = Path(gdbstack.__file__).parent  # watchdog/
    spelled = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if "thread apply all bt" in p.read_text() and p.name != "gdbstack.py"]
    assert spelled == []
    for option in ("-nx", "set auto-load off", "set libthread-db-search-path $sdir",
                   "set debuginfod enabled off",
                   f"set auto-load safe-path {gdbstack.NO_SAFE_PATH}"):
        assert option in gdbstack.command("gdb", 1)
