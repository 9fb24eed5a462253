"""The hook's stack-dump file in a shared directory: nothing planted at its path
blocks or redirects the rank (issue 30, item 10). Real FIFOs, links and files."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from watchdog.rank import dumps

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_a_fifo_raced_in_after_the_check_cannot_block_the_rank(tmp_path):
    """A FIFO appears at the dump path right after any look at it (what a racing
    user gets 2 times in 120): the rank still opens a regular file of its own at
    once, in a real process with a real FIFO, and never blocks."""
    path = tmp_path / "123.stacks"
    script = textwrap.dedent(f"""
        import os, signal
        real_open, planted = os.open, []
        def racing_open(p, *args, **kwargs):
            # The attacker's FIFO lands between any check and the first open.
            if str(p) == {str(path)!r} and not planted:
                planted.append(1)
                os.mkfifo(p)
            return real_open(p, *args, **kwargs)
        os.open = racing_open
        from watchdog.rank import dumps
        print(dumps.register_dump(int(signal.SIGUSR2), {str(path)!r}), flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the rank blocked opening its dump file on a FIFO")
    assert proc.returncode == 0, err
    assert out.strip() == str(int(signal.SIGUSR2)), (out, err)
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def test_a_fifo_with_a_reader_a_link_or_a_foreign_file_is_never_written(tmp_path):
    """Each is replaced by a regular file of ours (or the dumps are off): the FIFO's
    reader and the link's target get nothing."""
    fifo = tmp_path / "fifo.stacks"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader: open would not fail
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    link = tmp_path / "link.stacks"
    link.symlink_to(target)
    try:
        for path in (fifo, link):
            fd = dumps._open_dump(str(path))
            try:
                os.write(fd, b"Thread 0x1\n")
                assert os.path.isfile(path) and not os.path.islink(path)
            finally:
                os.close(fd)
        assert os.read(reader, 64) == b""  # nothing reached the FIFO's reader
        assert target.read_text() == "precious\n"
    finally:
        os.close(reader)
