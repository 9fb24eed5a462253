"""The launcher's exit codes: its contract with the script that runs it.

`cli/exits.py`'s table of every command's codes takes them from here, so the
launcher needs nothing of the command line.
"""

from __future__ import annotations

RANKS_FAILED = 10  # launch: a rank failed
TORN_DOWN = 11  # launch: the watchdog or a fence ended the job
REFUSED = 12  # launch, node wait-healthy: the node is not fit
GAVE_UP = 13  # launch: no progress, attempt after attempt
