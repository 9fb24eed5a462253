"""Colour for states in the text a person reads: on a terminal only, and never when
NO_COLOR is set (https://no-color.org). Padding is done before colouring, so columns
stay aligned."""

from __future__ import annotations

import os
import sys
from typing import TextIO

import click

# A hang and its aftermath in red, what may become one in yellow, health in green.
COLOURS = {"stalled": "red", "blocked": "red", "unkillable": "red", "hung": "red",
           "unknown": "red", "killed": "magenta", "suspect": "yellow", "stopped": "yellow",
           "traced": "yellow", "abandoned": "yellow", "slow": "yellow", "running": "green",
           "healthy": "green"}


def wanted(stream: TextIO | None = None) -> bool:
    """Colour for `stream` (stdout): a terminal, and NO_COLOR unset or empty."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream or sys.stdout, "isatty", None)
    return bool(isatty and isatty())


def state(text: str, name: str | None, on: bool) -> str:
    """`text` (a state's cell, already padded) in the colour of state `name`."""
    colour = COLOURS.get((name or "").lower()) if on else None
    return click.style(text, fg=colour) if colour else text
