"""Helpers of the tests and the benchmarks: real ranks and daemons, fakes, other users,
and the programs the tests run as subprocesses by path."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parent.parent
BIN = SUPPORT / "bin"  # stand-ins on PATH: launchctl, systemctl, sample
DATA = SUPPORT / "data"
