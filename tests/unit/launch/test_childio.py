"""The launcher's stderr after Ctrl-C: mlx.launch's and the ranks' KeyboardInterrupt
tracebacks held back, every other line (another exception's traceback too) passed on."""

from __future__ import annotations

import io

from watchdog.launch.childio import InterruptTracebacks
from watchdog.launch.launcher import single_node

INTERRUPTED = b"""Traceback (most recent call last):
  File "/venv/bin/mlx.launch", line 8, in <module>
    sys.exit(main())
KeyboardInterrupt
"""
CHAINED = b"""Traceback (most recent call last):
  File "prog.py", line 3, in <module>
    mx.eval(x)
KeyboardInterrupt

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "prog.py", line 5, in <module>
    cleanup()
KeyboardInterrupt
"""
OTHER = b"""Traceback (most recent call last):
  File "prog.py", line 9, in save
    open(path)
FileNotFoundError: [Errno 2] No such file or directory: 'ckpt'
"""


def test_keyboard_interrupt_tracebacks_are_held_back_and_counted():
    out = io.BytesIO()
    quiet = InterruptTracebacks(out)
    for line in (b"step 10\n" + INTERRUPTED + CHAINED + OTHER + b"bye\n").splitlines(True):
        quiet.line(line)
    quiet.close()
    assert out.getvalue() == (b"step 10\n" + OTHER + b"bye\n"
                              b"mlx-watchdog: interrupted: 2 KeyboardInterrupt traceback(s) "
                              b"of mlx.launch and its ranks not shown\n")


def test_a_launch_of_this_node_alone_is_not_held_for_its_peers():
    assert single_node(["-n", "2", "--", "python", "x.py"], here="mac1")
    assert single_node(["--hosts", "localhost,mac1", "x.py", "--hosts", "mac2"], here="mac1")
    assert not single_node(["--hosts", "mac1,mac2", "x.py"], here="mac1")
    assert not single_node(["--hosts=mac2", "x.py"], here="mac1")
    assert not single_node(["--hostfile", "hosts.json", "x.py"], here="mac1")


def test_a_ctrl_c_traceback_read_before_the_launchers_handler_ran_is_held_back(monkeypatch):
    """A terminal's Ctrl-C reaches mlx.launch with the launcher: its traceback may come
    before the launcher's handler has run. It is held back all the same; a partial line
    (a progress bar) still passes as it comes, and another traceback is shown."""
    import os
    import sys
    import types

    from watchdog.launch.childio import pump
    from watchdog.launch.relaunch import Attempt

    out = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", types.SimpleNamespace(buffer=out))
    read, write = os.pipe()
    os.write(write, b"50%|#####")
    with os.fdopen(read, "rb") as stream:
        os.write(write, b"     |\n" + INTERRUPTED + OTHER + b"Trace")
        os.close(write)
        pump(stream, Attempt(number=1, started=0.0), lambda: False)
    assert out.getvalue() == (b"50%|#####     |\n" + OTHER + b"Trace"
                              b"mlx-watchdog: interrupted: 1 KeyboardInterrupt traceback(s) "
                              b"of mlx.launch and its ranks not shown\n")
