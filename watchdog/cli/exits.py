"""The exit codes of every command, in one table (docs/operations.md shows it).

A script can trust them: a usage or setup error never shares a code with a
verdict, so `status --check` exiting 1 always means a rank is hung, never
that the directory was missing.

0   done; nothing wrong found
1   a verdict: a rank hung (`status --check`), the node flagged for reboot
    (`node status`), a job hung or not checkable (`cluster status`), a failed
    check (`doctor`)
2   usage: a bad flag or argument, a bad config file or value
3   setup: a directory, file, daemon or tool missing or unusable; another
    daemon already on the directories
4   `cluster status`: no node answered
10-13  `launch` (10 a rank failed, 11 the watchdog or a fence ended the job,
    12 refused: node not fit, also `node wait-healthy`; 13 gave up)
130 interrupted
"""

from __future__ import annotations

import click

OK = 0
VERDICT = 1
USAGE = 2
SETUP = 3
NO_ANSWER = 4
INTERRUPTED = 130


class SetupError(click.ClickException):
    """This node or its files are not set up for the command: one line, exit 3."""

    exit_code = SETUP
