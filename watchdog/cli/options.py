"""What several commands share: the directory options and the settings' click types."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import click

from watchdog.cli.service.unit import DEFAULT_CONFIG
from watchdog.daemon.config import (
    DEFAULT_RECORD_DIR,
    DEFAULT_STATE_DIR,
    ConfigError,
    LaunchSettings,
    Settings,
)

DIR_ENV = "MLX_WATCHDOG_DIR"
STATE_ENV = "MLX_WATCHDOG_STATE_DIR"

class Commands(click.Group):
    """A group whose --help lists each command with its whole first sentence
    (click cuts them at the terminal's width with "...")."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with each one's whole first sentence, not click's cut one."""
        rows = [(name, command.get_short_help_str(limit=200))
                for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class Node:
    """ctx.obj: this node's configuration, read once, when a command first needs it.

    The file is `--config` (or MLX_WATCHDOG_CONFIG) given to the group, else
    /etc/mlx-watchdog.toml when it exists, so that on a configured node
    `mlx-watchdog status` looks where the daemon looks. A file named on purpose
    must be usable; the implicit one is skipped when this user may not read it
    (it is mode 600 when it holds the fence secret).
    """

    def __init__(self, config_path: str | None) -> None:
        self.explicit = config_path is not None
        self.config_path = config_path or DEFAULT_CONFIG
        self._settings: Settings | None = None
        self._launch: LaunchSettings | None = None
        self._lenient: tuple[Settings, list[str]] | None = None

    @property
    def readable(self) -> bool:
        """The file is read: named on purpose, or the implicit one this user may read."""
        return self.explicit or os.access(self.config_path, os.R_OK)

    def lenient_settings(self) -> tuple[Settings, list[str]]:
        """The settings the file's good keys make, and what is wrong with the rest: for
        `doctor`, which reports a bad config as a failed check and runs the others."""
        if self._lenient is None:
            from watchdog.daemon.config import salvage

            self._lenient = salvage(self.config_path) if self.readable else (Settings(), [])
        return self._lenient

    @property
    def settings(self) -> Settings:
        """The node's settings from its config file, read once (defaults when unreadable)."""
        if self._settings is None:
            from watchdog.daemon.config import load

            readable = self.explicit or os.access(self.config_path, os.R_OK)
            self._settings = load(self.config_path, {}) if readable else Settings()
        return self._settings

    @property
    def launch(self) -> LaunchSettings:
        """The file's keys for `launch` (the daemon has no use for them)."""
        if self._launch is None:
            from watchdog.daemon.config import load_launch

            readable = self.explicit or os.access(self.config_path, os.R_OK)
            self._launch = (load_launch(self.config_path, {}) if readable
                            else LaunchSettings())
        return self._launch


def _from_config(key: str, lenient: bool = False) -> Any:
    """A directory option's value: the flag or its env var, else the node's config
    (`lenient`: its good keys, a bad file being `doctor`'s to report)."""
    def resolve(ctx: click.Context, _param: Any, value: str | None) -> str:
        if value is not None:
            return value
        node = ctx.find_object(Node)
        if node is None:
            return str(getattr(Settings(), key))
        return str(getattr(node.lenient_settings()[0] if lenient else node.settings, key))
    return resolve


dir_option = click.option(
    "--dir", "record_dir", envvar=DIR_ENV, callback=_from_config("dir"), metavar="DIR",
    type=click.Path(file_okay=False),
    help=f"Record directory (env {DIR_ENV}; else the config's, else {DEFAULT_RECORD_DIR}).")
lenient_dir_option = click.option(
    "--dir", "record_dir", envvar=DIR_ENV, callback=_from_config("dir", lenient=True),
    metavar="DIR", type=click.Path(file_okay=False),
    help=f"Record directory (env {DIR_ENV}; else the config's, else {DEFAULT_RECORD_DIR}).")
lenient_state_option = click.option(
    "--state-dir", envvar=STATE_ENV, callback=_from_config("state_dir", lenient=True),
    metavar="DIR", type=click.Path(file_okay=False),
    help=f"Daemon state directory (env {STATE_ENV}; else the config's, else "
         f"{DEFAULT_STATE_DIR}).")
state_option = click.option(
    "--state-dir", envvar=STATE_ENV, callback=_from_config("state_dir"), metavar="DIR",
    type=click.Path(file_okay=False),
    help=f"Daemon state directory (env {STATE_ENV}; else the config's, else "
         f"{DEFAULT_STATE_DIR}).")


class SettingType(click.ParamType):  # type: ignore[type-arg]
    """A daemon setting on the command line, checked exactly as the config file's value is."""

    def __init__(self, key: str) -> None:
        from watchdog.daemon.config import SPECS

        self.key, self.spec = key, SPECS[key]
        self.name = "|".join(self.spec.choices) or self.spec.unit or "TEXT"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        """The flag's value checked by the config file's rule, or a usage error naming it."""
        from watchdog.daemon.config import coerce

        try:
            checked = coerce(self.key, value)
        except ConfigError as err:
            # Said of the flag the user typed (click names it), not of the file's key.
            message = str(err)
            if param is not None and message.startswith(self.key + " "):
                message = message[len(self.key) + 1:]
            self.fail(message, param, ctx)
        # "auto" (deadline) and "" (secret) check out as None, which `build` would
        # read as "not given" and let the file's value win: pass them on as given.
        return value if checked is None else checked

    def shell_complete(self, ctx: Any, param: Any, incomplete: str) -> list[Any]:
        """Completions for the setting: its choices, a directory, or `auto`."""
        from click.shell_completion import CompletionItem

        if self.spec.choices:
            return [CompletionItem(c) for c in self.spec.choices if c.startswith(incomplete)]
        if self.spec.unit == "DIR":
            return [CompletionItem(incomplete, type="dir")]
        if self.key == "deadline" and "auto".startswith(incomplete):
            return [CompletionItem("auto")]
        return []


def settings_options(f: Any) -> Any:
    """One option per setting, so every key of the TOML file is also a flag (those of
    `launch` are its flags instead).

    Each option's type is the setting's own (`SettingType`): a bad value gets the
    same one-line message from the file or the command line, and --help shows
    the unit. Defaults stay None here, so the file's value wins over no flag.
    """
    from watchdog.daemon.config import SPECS

    envvars = {"dir": DIR_ENV, "state_dir": STATE_ENV, "secret": "MLX_WATCHDOG_SECRET"}
    defaults = Settings()
    for field in reversed(dataclasses.fields(Settings)):
        flag = "--" + field.name.replace("_", "-")
        spec = SPECS[field.name]
        default = getattr(defaults, field.name)
        if field.name == "peers":
            f = click.option(flag, multiple=True, default=None, type=SettingType("peers"),
                             metavar="HOST:PORT", help=f"{spec.help} (repeat, or commas)")(f)
            continue
        shown = {"deadline": "auto", "secret": "unset"}.get(field.name, default)
        f = click.option(flag, field.name, envvar=envvars.get(field.name),
                         type=SettingType(field.name), help=f"{spec.help} [default: {shown}]")(f)
    return f


deadline_option = click.option(
    "--deadline", type=SettingType("deadline"), default=None,
    help="With no daemon running: the deadline to judge waits by, 'auto' or a duration "
         "(seconds, or 500ms, 90s, 2m, as every duration) [default: the config's "
         "deadline and its other judging settings, else auto].")


class Duration(click.ParamType):  # type: ignore[type-arg]
    """Seconds, as a number or with a unit (500ms, 90s, 2m, 1h): what every duration of
    the config file and the daemon's flags takes, at least `low`."""

    name = "DURATION"

    def __init__(self, low: float = 0.0) -> None:
        self.low = low

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        """The value in seconds (a number, or 500ms, 90s, 2m), or a usage error."""
        from watchdog.daemon.config import parse_duration

        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds: float | None = float(value)
        else:
            text = str(value).strip()
            try:
                seconds = float(text)
            except ValueError:
                seconds = parse_duration(text)
        if seconds is None or seconds != seconds or seconds in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a duration (seconds, or 500ms, 90s, 2m)", param, ctx)
        if seconds < self.low:
            self.fail(f"{value!r} is under {self.low:g}s", param, ctx)
        return seconds

