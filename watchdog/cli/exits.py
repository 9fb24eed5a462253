"""The exit codes of every command, in one table (`TABLE`; docs/operations.md shows it,
and tests/unit/docs/test_exit_codes.py holds the docs' tables and sentences to it).

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
130 interrupted (`launch`: 143 when SIGTERM ended it)
"""

from __future__ import annotations

import click

from watchdog.launch.codes import GAVE_UP, RANKS_FAILED, REFUSED, TORN_DOWN

OK = 0
VERDICT = 1
USAGE = 2
SETUP = 3
NO_ANSWER = 4
# RANKS_FAILED, TORN_DOWN, REFUSED, GAVE_UP (10-13): the launcher's, launch/codes.py
INTERRUPTED = 130
TERMINATED = 143  # launch: SIGTERM to the launcher (128 + 15, as a shell says it)

# Every code a command exits with, and who (docs/operations.md's table).
TABLE: tuple[tuple[int, str], ...] = (
    (OK, "done; nothing wrong found"),
    (VERDICT, "a verdict: status --check, node status, cluster status, doctor"),
    (USAGE, "usage: a bad flag, argument, config file or value"),
    (SETUP, "setup: a directory, file, daemon or tool missing or unusable"),
    (NO_ANSWER, "cluster status: no node answered"),
    (RANKS_FAILED, "launch: a rank failed"),
    (TORN_DOWN, "launch: the watchdog or a fence ended the job"),
    (REFUSED, "launch, node wait-healthy: the node is not fit"),
    (GAVE_UP, "launch: gave up (no progress)"),
    (INTERRUPTED, "interrupted (Ctrl-C)"),
)


class SetupError(click.ClickException):
    """This node or its files are not set up for the command: one line, exit 3."""

    exit_code = SETUP
