"""The daemon's settings: defaults, the TOML file, command-line overrides, checks.

Every key of the TOML file is also a command-line option of `run` (dashes for
underscores). A bad value raises `ConfigError` with one sentence naming the
key; the CLI turns it into a one-line error and exit 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from watchdog import host
from watchdog.daemon.judge.deadlines import Rules
from watchdog.daemon.values import (  # re-exported: read by the CLI as config's
    DEFAULT_PORT as DEFAULT_PORT,
)
from watchdog.daemon.values import (
    ConfigError as ConfigError,
)
from watchdog.daemon.values import (
    SetupRefused as SetupRefused,
)
from watchdog.daemon.values import (
    own_peers as own_peers,
)
from watchdog.daemon.values import (
    parse_duration as parse_duration,
)
from watchdog.daemon.values import (
    parse_listen as parse_listen,
)
from watchdog.daemon.values import (
    parse_size as parse_size,
)
from watchdog.states import Mode, Word

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_RECORD_DIR = host.defaults().record_dir
DEFAULT_STATE_DIR = host.defaults().state_dir


# The recipe's placeholder (docs/cluster.md), and anything like it, is no secret.
PLACEHOLDER = "REPLACE"
SECRET_HOWTO = "make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"


class KillScope(Word):
    """Which ranks a hang ends."""

    JOB = "job"  # every local rank of the hung job
    RANK = "rank"  # only the hung rank


class RestartOn(Word):
    """Which endings `launch` relaunches."""

    TORN_DOWN = "torn-down"  # the watchdog or a fence ended it, or a rank died of a signal
    ANY = "any"  # also a rank's own non-zero exit


# The settings whose values are a vocabulary's words (their specs' choices).
WORDS: dict[str, type[Word]] = {"mode": Mode, "kill_scope": KillScope, "restart_on": RestartOn}


@dataclass(frozen=True)
class LadderSettings:
    """The response's settings (the enforcer's and the responses'): what it may do and
    each step's bound."""

    state_dir: str
    mode: Mode
    evidence_timeout: float
    grace: float
    kill_timeout: float
    settle: float
    wired_threshold: int
    peer_timeout: float

    def ladder_span(self) -> float:
        """Seconds a response's steps take at most by their own bounds: the peers'
        answer, the evidence, the grace, the kill timeout and the settle."""
        return self.peer_timeout + self.evidence_timeout + self.grace + self.kill_timeout \
            + self.settle

    def response_bound(self) -> float:
        """Seconds a response may take before it is presumed stuck (and an earlier
        daemon's is still completed at start): every step's bound, with room to spare."""
        return 2 * self.ladder_span() + 30.0


@dataclass(frozen=True)
class PeerSettings:
    """The other nodes' settings (asking them, fences, the data-link probe)."""

    peers: tuple[str, ...]
    peer_timeout: float
    secret: str | None
    state_dir: str
    evidence_timeout: float  # how long a fence may hold a job for its evidence


@dataclass(frozen=True)
class Settings:
    """The daemon's settings, every one with its default (docs/configuration.md says
    why each default is what it is); read from the config file and the command line."""
    dir: str = DEFAULT_RECORD_DIR
    state_dir: str = DEFAULT_STATE_DIR
    interval: float = 1.0
    deadline: float | None = None  # None: "auto"
    auto_factor: float = 4.0
    auto_floor: float = 60.0
    auto_min_waits: int = 20
    auto_fallback: float = 600.0
    init_deadline: float = 600.0
    blocked_deadline: float = 900.0
    spin_ratio: float = 0.5
    confirm: int = 2
    wedge_floor: float = 15.0
    wedge_floor_exact: float = 4.0
    gpu_spin_watts: float = 5.0
    mode: Mode = Mode.ENFORCE
    kill_scope: KillScope = KillScope.JOB
    grace: float = 10.0
    kill_timeout: float = 10.0
    evidence_timeout: float = 10.0
    wired_threshold: int = 1 << 30
    settle: float = 30.0
    retention: float = 60.0
    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    peers: tuple[str, ...] = field(default_factory=tuple)
    peer_timeout: float = 1.0
    secret: str | None = None
    job_label: str = "mlx_job"

    def __post_init__(self) -> None:
        _words(self)

    def rules(self) -> Rules:
        return Rules(deadline=self.deadline, auto_factor=self.auto_factor,
                     auto_floor=self.auto_floor, auto_min_waits=self.auto_min_waits,
                     auto_fallback=self.auto_fallback, init_deadline=self.init_deadline,
                     blocked_deadline=self.blocked_deadline, spin_ratio=self.spin_ratio,
                     confirm=self.confirm, wedge_floor=self.wedge_floor,
                     wedge_floor_exact=self.wedge_floor_exact,
                     gpu_spin_watts=self.gpu_spin_watts)

    @property
    def listen_address(self) -> tuple[str, int]:
        """`listen` as (host, port)."""
        return parse_listen(self.listen)

    def ladder(self) -> LadderSettings:
        """The enforcer's and the responses' view of these settings."""
        return LadderSettings(state_dir=self.state_dir, mode=self.mode,
                              evidence_timeout=self.evidence_timeout, grace=self.grace,
                              kill_timeout=self.kill_timeout, settle=self.settle,
                              wired_threshold=self.wired_threshold,
                              peer_timeout=self.peer_timeout)

    def peering(self) -> PeerSettings:
        """The peers', fences' and data-link probe's view of these settings."""
        return PeerSettings(peers=self.peers, peer_timeout=self.peer_timeout,
                            secret=self.secret, state_dir=self.state_dir,
                            evidence_timeout=self.evidence_timeout)


@dataclass(frozen=True)
class LaunchSettings:
    """`mlx-watchdog launch`'s settings (the daemon has no use for them): relaunching a
    torn-down job. Keys of the node's file with the daemon's, flags of `launch`."""

    restart: int = 0
    restart_on: RestartOn = RestartOn.TORN_DOWN
    restart_backoff: float = 3.0
    health_timeout: float = 120.0
    max_no_progress: int = 3
    warmup_waits: int = 10

    def __post_init__(self) -> None:
        _words(self)


def _words(settings: Settings | LaunchSettings) -> None:
    """Settings built in code get the words, as coerce() gives them."""
    for key, word in WORDS.items():
        value = getattr(settings, key, None)
        if value is not None and not isinstance(value, word) and value in tuple(word):
            object.__setattr__(settings, key, word(value))


class Live:
    """The daemon's settings as its parts read them: one holder they all share, each
    part reading its narrow view (`ladder`, `peering`, `rules`) when it uses it, so a
    reload is one assignment (`live.settings = new`) and no part keeps a value it was
    given at start. The views are made once per assignment, together (one tuple: a
    reader on another thread sees the old views or the new, never a mix)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @property
    def settings(self) -> Settings:
        """The settings in force; assigning new ones swaps every view at once."""
        return self._views[0]

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """The settings in force; assigning new ones swaps every view at once."""
        self._views = (settings, settings.ladder(), settings.peering(), settings.rules())

    @property
    def ladder(self) -> LadderSettings:
        """The ladder's view of the settings in force."""
        return self._views[1]

    @property
    def peering(self) -> PeerSettings:
        """The peers' view of the settings in force."""
        return self._views[2]

    @property
    def rules(self) -> Rules:
        """The detector's rules from the settings in force."""
        return self._views[3]


def live(settings: Settings | Live) -> Live:
    """The holder a part reads (a part built alone, in a test or a tool, may be given
    plain settings: a holder of its own)."""
    return settings if isinstance(settings, Live) else Live(settings)


@dataclass(frozen=True)
class Spec:
    """How one setting is read, checked and shown, from a TOML value or a flag alike."""

    help: str
    kind: str  # number | whole | deadline | text | choice | listen | peers | secret
    unit: str = ""  # what the number counts, shown in --help
    low: float | None = None  # smallest allowed value
    above: bool = False  # `low` itself is not allowed (> rather than >=)
    high: float | None = None
    choices: tuple[str, ...] = ()


def _seconds(help: str) -> Spec:
    return Spec(help, "number", "SECONDS", low=0, above=True)


SPECS: dict[str, Spec] = {
    "dir": Spec("record directory the ranks publish into", "text", "DIR"),
    "state_dir": Spec("journal, reboot flag, evidence and status.json", "text", "DIR"),
    "interval": _seconds("seconds between scans"),
    "deadline": Spec("how long a wait may last (seconds, or 90s, 2m as every duration), or "
                     "'auto' to learn it per job and kind of wait",
                     "deadline", "SECONDS|auto", low=0, above=True),
    "auto_factor": Spec("auto: the deadline is this many times the longest completed wait",
                        "number", "FACTOR", low=0, above=True),
    "auto_floor": _seconds("auto: never a deadline under this many seconds"),
    "auto_min_waits": Spec("auto: completed waits needed before the learned deadline applies",
                           "whole", "COUNT", low=0),
    "auto_fallback": _seconds("auto: the deadline until then"),
    "init_deadline": _seconds("deadline of mx.distributed.init (connecting to every peer)"),
    "blocked_deadline": _seconds("a wait past its deadline with no thread spinning is ended "
                                 "after this"),
    "spin_ratio": Spec("share of one core at which a thread counts as spinning", "number",
                       "RATIO", low=0, above=True, high=1),
    "confirm": Spec("scans in a row a rank must be due before it is acted on (no single sample "
                    "kills)", "whole", "COUNT", low=1),
    "wedge_floor": _seconds("a collective found wedged (every rank spinning in a wait frame, "
                            "no byte moving) is ended after max(this, auto_factor x its "
                            "longest completed wait)"),
    "wedge_floor_exact": _seconds("the same when every rank's stillness was read from its "
                                  "sockets' byte counters (Linux), spinning or parked "
                                  "(never above wedge_floor)"),
    "gpu_spin_watts": Spec("macOS: a GPU at least 90% resident under this power spins on "
                           "nothing (mlx #3830): its GPU time is not work; 0: always work",
                           "number", "WATTS", low=0),
    "mode": Spec("enforce (signal hung ranks) or observe (report only)", "choice",
                 choices=tuple(w.value for w in Mode)),
    "kill_scope": Spec("job (every local rank of a hung job) or rank (only the hung rank)",
                       "choice", choices=tuple(w.value for w in KillScope)),
    "grace": _seconds("seconds between SIGTERM and SIGKILL"),
    "kill_timeout": _seconds("seconds after SIGKILL before a rank is declared unkillable"),
    "evidence_timeout": _seconds("seconds, in all, for stack dumps before signalling"),
    "wired_threshold": Spec("bytes above the idle baseline that count as leaked wired memory",
                            "whole", "BYTES", low=0),
    "settle": _seconds("seconds wired memory gets to come back after a kill"),
    "retention": Spec("seconds an ended rank stays in status and metrics", "number", "SECONDS",
                      low=0),
    "listen": Spec("HOST:PORT of the HTTP endpoint (/metrics, /status, /healthz)", "listen",
                   "HOST:PORT"),
    "peers": Spec("other nodes' daemons (HOST:PORT), for the cluster view", "peers",
                  "HOST:PORT"),
    "peer_timeout": _seconds("seconds to wait for each peer"),
    "secret": Spec("shared secret for job fences between nodes (unset: fences off)", "secret",
                   "TEXT"),
    "job_label": Spec("the metrics' label naming the MLX job: mlx_job, or job (the old "
                      "name, kept for one release; it needs honor_labels)", "choice",
                      choices=("mlx_job", "job")),
    "restart": Spec("launch: relaunch a torn-down job up to this many times", "whole", "COUNT",
                    low=0),
    "restart_on": Spec("launch: torn-down (the watchdog or a fence ended it, or a rank died "
                       "of a signal) or any (also a rank's own non-zero exit)", "choice",
                       choices=tuple(w.value for w in RestartOn)),
    "restart_backoff": Spec("launch: seconds before the first relaunch, doubled each time "
                            "(at most 60)", "number", "SECONDS", low=0),
    "health_timeout": Spec("launch, node wait-healthy: seconds to wait for a fit node (no "
                           "reboot flag, wired memory back) before refusing", "number",
                           "SECONDS", low=0),
    "max_no_progress": Spec("launch: give up after this many attempts in a row without "
                            "progress past the warm-up", "whole", "COUNT", low=1),
    "warmup_waits": Spec("launch: completed waits of a rank that are still warm-up (more, or "
                         "any hb.step(), is progress)", "whole", "COUNT", low=0),
}
HELP = {key: spec.help for key, spec in SPECS.items()}
# Keys of `mlx-watchdog launch`: in the node's file with the rest, flags of `launch`, not `run`.
LAUNCH_KEYS = tuple(f.name for f in dataclasses.fields(LaunchSettings))
DAEMON_KEYS = tuple(f.name for f in dataclasses.fields(Settings))
KEYS = {*DAEMON_KEYS, *LAUNCH_KEYS}  # the file's keys: the daemon's and launch's alike


def _number(key: str, value: Any, spec: Spec) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        united = None
        if isinstance(value, str) and spec.unit.startswith("SECONDS"):
            united = parse_duration(value)
        elif isinstance(value, str) and spec.unit == "BYTES":
            united = parse_size(value)
        if united is None:
            unit = {"SECONDS": " (e.g. 10 or 10s, 500ms, 2m)",
                    "BYTES": " (e.g. 1073741824 or 1G, 512M)"}.get(spec.unit, "")
            raise ConfigError(f"{key} must be a number{unit}, got {value!r}") from None
        number = united
    if not math.isfinite(number):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    if spec.low is not None and (number <= spec.low if spec.above else number < spec.low):
        raise ConfigError(f"{key} must be {'>' if spec.above else '>='} {spec.low:g}, "
                          f"got {value!r}")
    if spec.high is not None and number > spec.high:
        raise ConfigError(f"{key} must be <= {spec.high:g}, got {value!r}")
    return number


def coerce(key: str, value: Any) -> Any:
    """One setting's value from TOML or the command line, checked; ConfigError if unusable."""
    spec = SPECS[key]
    if spec.kind == "deadline":
        if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
            return None
        try:
            return _number(key, value, spec)
        except ConfigError:
            raise ConfigError(f"deadline must be 'auto' or a duration > 0 (seconds, or "
                              f"500ms, 90s, 2m), got {value!r}") from None
    if spec.kind in ("text", "listen", "choice"):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key} must be a non-empty string, got {value!r}")
        if spec.kind == "listen":
            parse_listen(value)
        if spec.choices and value.lower() in spec.choices:
            value = value.lower()  # --mode ENFORCE, as its metavar shows it
        if spec.choices and value not in spec.choices:
            raise ConfigError(f"{key} must be {' or '.join(map(repr, spec.choices))}, "
                              f"got {value!r}")
        return WORDS[key](value) if key in WORDS else value
    if spec.kind == "secret":
        if value is None or value == "":  # "" is how default_toml() (and TOML) spells unset
            return None
        if not isinstance(value, str) or len(value) < 16:
            raise ConfigError(f"secret must be a string of at least 16 characters; "
                              f"{SECRET_HOWTO}")
        if value.strip().upper().startswith(PLACEHOLDER):
            raise ConfigError(f"secret is still the recipe's placeholder (it starts "
                              f"{PLACEHOLDER}); {SECRET_HOWTO}, the same on every node")
        return value
    if spec.kind == "peers":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
            raise ConfigError(f"peers must be a list of HOST:PORT strings, got {value!r}")
        value = [p for item in value for p in item.replace(",", " ").split()]
        for peer in value:
            try:
                parse_listen(peer)
            except ConfigError:
                raise ConfigError(f"peers must be HOST:PORT strings, got {peer!r}") from None
        return tuple(value)
    number = _number(key, value, spec)
    if spec.kind == "whole":
        if number != int(number):
            raise ConfigError(f"{key} must be a whole number, got {value!r}")
        return int(number)
    return number


def build(file_values: dict[str, Any], overrides: dict[str, Any]) -> Settings:
    """Defaults, then the file, then the command line (None means not given). Every key
    is checked, launch's too (one file, one verdict on it); the daemon's are kept."""
    values = _values(file_values, overrides)
    settings = Settings(**{k: v for k, v in values.items() if k not in LAUNCH_KEYS})
    _check(settings)
    mine = own_peers(settings.listen, settings.peers)
    if mine:  # one file for every node lists each node too: never a peer of itself
        settings = dataclasses.replace(
            settings, peers=tuple(p for p in settings.peers if p not in mine))
    return settings


def build_launch(file_values: dict[str, Any], overrides: dict[str, Any]) -> LaunchSettings:
    """`launch`'s settings, from the same file and flags (checked as `build` does)."""
    values = _values(file_values, overrides)
    launch = LaunchSettings(**{k: v for k, v in values.items() if k in LAUNCH_KEYS})
    _check(launch)
    return launch


def _values(file_values: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for source in (file_values, {k: v for k, v in overrides.items() if v is not None}):
        for key, value in source.items():
            key = key.replace("-", "_")
            if key not in KEYS:
                raise ConfigError(f"unknown setting {key!r}{_did_you_mean(key)}")
            values[key] = coerce(key, value)
    return values


def _check(s: Settings | LaunchSettings) -> None:
    """What no single value shows: each value was checked on its way in (`coerce`)."""
    for f in dataclasses.fields(s):  # built in code, they skip coerce(): check each again
        value = getattr(s, f.name)
        key = f.name
        if value is not None and value != ():
            coerce(key, value)


def load_file(path: str) -> dict[str, Any]:
    """The TOML file's table, or a `ConfigError` in one sentence."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {err.start}: "
                          f"{err.object[err.start:err.start + 1]!r})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from None
    section = data.get("watchdog", data)  # keys at the top, or under [watchdog]
    outside = sorted(k for k in data if k != "watchdog") if "watchdog" in data else []
    if outside:
        raise ConfigError(f"config file {path}: {', '.join(outside)} must go under [watchdog] "
                          "(or drop the [watchdog] header)")
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [watchdog] must be a table")
    for key, value in section.items():
        if isinstance(value, dict):  # a [header] of its own: a mistyped [watchdog]?
            hint = "did you mean [watchdog]?" if difflib.get_close_matches(
                key, ["watchdog"], n=1, cutoff=0.6) else "the only one is [watchdog]"
            raise ConfigError(f"config file {path}: unknown section [{key}]: {hint}")
        if key.replace("-", "_") not in KEYS:
            raise ConfigError(f"config file {path}: unknown setting {key!r}"
                              f"{_did_you_mean(key.replace('-', '_'))}")
    return section


def _did_you_mean(key: str) -> str:
    """"; did you mean deadline?" for a key close to a setting's name, else ""."""
    close = difflib.get_close_matches(key, sorted(KEYS), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def secret_exposed(path: str) -> str:
    """What to do about a config file that holds the fence secret and that its group
    or everyone may read ("" when it is not so, or cannot be read): whoever reads the
    secret can end this cluster's jobs with a fence."""
    try:
        mode = os.stat(path).st_mode
        values = load_file(path)
    except (OSError, ConfigError):
        return ""
    if not values.get("secret") or not mode & 0o044:
        return ""
    who = " and ".join(name for name, bit in (("its group", 0o040), ("everyone", 0o004))
                       if mode & bit)
    return (f"config file {path} holds the fence secret and {who} may read it (mode "
            f"{mode & 0o777:o}): whoever reads it can end this cluster's jobs; "
            f"chmod 600 {path}")


def _file_values(path: str | None) -> dict[str, Any]:
    """The file's keys, each checked; a bad value named with the file it is in."""
    if not path:
        return {}
    values = load_file(path)
    try:
        _values(values, {})
    except ConfigError as err:
        raise ConfigError(f"config file {path}: {err}") from None
    return values


def load(path: str | None, overrides: dict[str, Any]) -> Settings:
    """The daemon's settings: defaults, then the file (if any), then `overrides`, checked."""
    return build(_file_values(path), overrides)


def salvage(path: str) -> tuple[Settings, list[str]]:
    """The settings of the file's good keys, and one message per fault (none for a good
    file): `doctor` reports a bad file and still checks the rest of the node with it."""
    try:
        return load(path, {}), []
    except ConfigError as err:
        errors = [str(err)]
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return Settings(), errors  # nothing in it can be read: the defaults
    section = raw.get("watchdog", raw)
    good: dict[str, Any] = {}
    for key, value in (section.items() if isinstance(section, dict) else ()):
        try:
            build({key: value}, {})
        except ConfigError as err:
            errors.append(f"config file {path}: {err}")
            continue
        good[key] = value
    try:
        return build(good, {}), list(dict.fromkeys(errors))
    except ConfigError as err:  # the keys are good alone, not together
        return Settings(), [*errors, f"config file {path}: {err}"]


def load_launch(path: str | None, overrides: dict[str, Any]) -> LaunchSettings:
    """`launch`'s settings: defaults, then the file (if any), then `overrides`, checked."""
    return build_launch(_file_values(path), overrides)


def default_toml() -> str:
    """A config file listing every key with its default, commented out."""
    lines = ["# mlx-watchdog configuration: every key is optional; shown with its default.",
             "# Reference: docs/configuration.md", "[watchdog]"]
    for defaults in (Settings(), LaunchSettings()):  # the daemon's keys, then launch's
        lines += _default_lines(defaults)
    return "\n".join(lines) + "\n"


def _default_lines(defaults: Settings | LaunchSettings) -> list[str]:
    lines = []
    for f in dataclasses.fields(defaults):
        value = getattr(defaults, f.name)
        if f.name == "deadline" and value is None:
            value = "auto"
        if value is None:
            text = '""'
        elif isinstance(value, str):
            text = f'"{value}"'
        elif isinstance(value, tuple):
            text = "[" + ", ".join(f'"{v}"' for v in value) + "]"
        else:
            text = repr(value)
        lines.append(f"# {HELP[f.name]}")
        lines.append(f"# {f.name} = {text}")
    return lines
