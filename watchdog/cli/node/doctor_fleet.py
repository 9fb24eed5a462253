"""`doctor`'s checks of this node within its fleet: the config file (its secret and
its mode), the daemon that answers on the port (does it watch the directories this
config names?), and each peer (resolves, answers, its clock against the fences'
window). Each returns `(level, message)` lines as doctor.py's; a message that is not
"ok" says what to do.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from email.utils import parsedate_to_datetime

from watchdog.cli.node.doctor_env import FAIL, OK, WARN, Line
from watchdog.daemon.config import (
    PLACEHOLDER,
    SECRET_HOWTO,
    ConfigError,
    Settings,
    load_file,
    own_peers,
    parse_listen,
    secret_exposed,
)
from watchdog.net.fence import WINDOW
from watchdog.status import NodeStatus

HTTP_TIMEOUT = 2.0
# A peer's clock this far from ours (seconds) is told as a warning: a fence spends part
# of its WINDOW in flight and in the peer's queue, and NTP keeps clocks far closer.
CLOCK_WARN = WINDOW / 3


def check_config(path: str | None, settings: Settings) -> list[Line]:
    """The config file read, the fence secret (set, placeholder, peers without it), and
    the file's mode when it holds the secret."""
    if path is None or not os.path.exists(path):
        lines: list[Line] = [(OK, "no config file: defaults and flags")]
    else:
        lines = [(OK, f"config file {path}")]
    if settings.secret and settings.secret.strip().upper().startswith(PLACEHOLDER):
        # Only from a flag or MLX_WATCHDOG_SECRET (the file's is refused when read).
        lines.append((FAIL, f"the secret is still a placeholder (it starts {PLACEHOLDER}): "
                            f"{SECRET_HOWTO}"))
    elif settings.secret:
        lines.append((OK, f"fences on: a secret of {len(settings.secret)} characters"))
    elif settings.peers:
        lines.append((WARN, "peers are configured but no secret: fences are off (a job ended "
                            "here leaves its ranks on the other nodes waiting until their "
                            f"own verdict); set the same secret on every node ({SECRET_HOWTO})"))
    exposed = secret_exposed(path) if path else ""
    if exposed:
        lines.append((WARN, exposed))
    return lines


def _base(listen: str) -> str:
    """`http://HOST:PORT` to reach a daemon listening on `listen` from here."""
    host, port = parse_listen(listen)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def fetch_status(base: str, timeout: float = HTTP_TIMEOUT) -> tuple[NodeStatus, float | None]:
    """A daemon's `/status` and its clock's offset from ours in seconds (its answer's
    `Date`, a second's resolution, against the middle of the exchange), or raises
    OSError/ValueError."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    began = time.time()
    with opener.open(f"{base}/status", timeout=timeout) as resp:
        body = resp.read(16 << 20)
        date = resp.headers.get("Date")
    ended = time.time()
    status = NodeStatus.from_json(json.loads(body))
    offset = None
    if date:
        try:
            offset = parsedate_to_datetime(date).timestamp() - (began + ended) / 2
        except (TypeError, ValueError):
            offset = None
    return status, offset


def check_watches(listen: str, record_dir: str, state_dir: str) -> list[Line]:
    """The daemon answering on `listen` watches the directories this config names."""
    try:
        base = _base(listen)
    except ConfigError:
        return []  # the daemon check says so
    if base.endswith(":0"):
        return []
    try:
        status, _ = fetch_status(base)
    except (OSError, ValueError):
        return []  # no daemon there: the daemon check says so
    if status.dir is None or status.state_dir is None:
        return [(WARN, f"the daemon at {base} has not scanned yet: cannot tell which "
                       "directories it watches; run doctor again in a moment")]
    wrong = [f"{what} {theirs} (this config names {ours})"
             for what, theirs, ours in (("records in", status.dir, record_dir),
                                        ("state in", status.state_dir, state_dir))
             if os.path.abspath(theirs) != os.path.abspath(ours)]
    if wrong:
        return [(FAIL, f"the daemon at {base} (pid {status.daemon_pid}) watches "
                       f"{'; '.join(wrong)}: ranks publishing to {record_dir} are not "
                       "watched; restart the service with this config, or pass doctor "
                       "the config the daemon runs with (--config)")]
    return [(OK, f"the daemon at {base} (pid {status.daemon_pid}) watches {record_dir} "
                 f"(state {state_dir}), as this config names")]


def _skipped_self(path: str | None, listen: str) -> tuple[str, ...]:
    """The file's peers that are this node itself (dropped at load: config.own_peers)."""
    if not path:
        return ()
    try:
        raw = load_file(path).get("peers")
    except ConfigError:
        return ()
    listed = tuple(p for p in raw if isinstance(p, str)) if isinstance(raw, list) else ()
    return own_peers(listen, listed)


def check_peers(settings: Settings, path: str | None = None) -> list[Line]:
    """Each peer: its name resolves, its daemon answers, and its clock is within the
    fences' window of ours (a fence older than WINDOW by the receiver's clock is
    refused). This node among the file's peers is skipped, and said so."""
    lines: list[Line] = [(OK, f"peer {peer} is this node (its listen {settings.listen}): "
                              "skipped, as the daemon skips it")
                         for peer in _skipped_self(path, settings.listen)]
    for peer in settings.peers:
        try:
            host, port = parse_listen(peer)
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (ConfigError, OSError) as err:
            lines.append((FAIL, f"peer {peer} does not resolve ({err}): fix its name in "
                                "peers (or /etc/hosts)"))
            continue
        try:
            status, offset = fetch_status(_base(peer), settings.peer_timeout)
        except urllib.error.HTTPError as err:
            lines.append((FAIL, f"peer {peer} answered HTTP {err.code}: is mlx-watchdog "
                                "listening there?"))
            continue
        except (OSError, ValueError) as err:
            why = getattr(err, "reason", err)
            lines.append((WARN, f"peer {peer} does not answer ({why}): its daemon is down "
                                "or listens on loopback (its listen must be an address this "
                                "node reaches), or a firewall is in the way"))
            continue
        who = f"peer {peer} answers ({status.host or 'unnamed'}, mlx-watchdog " \
              f"{status.version or '?'})"
        if offset is None:
            lines.append((WARN, f"{who}; its clock cannot be read (no Date header)"))
        elif abs(offset) > WINDOW:
            lines.append((FAIL, f"{who}; its clock is {offset:+.0f}s off ours, more than the "
                                f"fences' {WINDOW:g}s window: fences between the two are "
                                "refused; sync both clocks (NTP)"))
        elif abs(offset) > CLOCK_WARN:
            lines.append((WARN, f"{who}; its clock is {offset:+.0f}s off ours (a fence is "
                                f"valid {WINDOW:g}s): sync both clocks (NTP)"))
        else:
            lines.append((OK, f"{who}; clock within {max(abs(offset), 1.0):.0f}s of ours"))
        if settings.secret and not settings.secret.strip().upper().startswith(PLACEHOLDER):
            lines.append(check_secret(peer, settings))
    return lines


def check_secret(peer: str, settings: Settings) -> Line:
    """Our fence secret proven by the peer: it answers a random challenge with a proof
    only the secret makes (`fence.prove`); nothing signed is sent, so an answerer that
    cannot prove the secret is handed no fence. A peer whose secret differs refuses
    every fence of ours."""
    from watchdog.net import fence

    sent, proven = fence.prove(peer, settings.secret or "",
                               f"{socket.gethostname()} (doctor)", settings.peer_timeout)
    answer = sent.answer
    error = answer.error if answer is not None else sent.error
    if proven:
        return (OK, f"peer {peer} accepts this node's fences (it proved the secret: the "
                    "secrets match)")
    if answer is not None and answer.proof:
        return (FAIL, f"peer {peer} refuses this node's fences: its secret differs from "
                      "this node's (its proof is not ours); set the same secret on every "
                      "node, then reload each (SIGHUP)")
    if error in ("HTTP 405", "HTTP 403") or (error or "").startswith("fences are off"):
        return (FAIL, f"peer {peer} has fences off (no secret set there): a job this node "
                      "ends leaves its ranks there waiting; set the same secret on every "
                      "node")
    if error == "unsigned request":
        return (WARN, f"peer {peer}: cannot prove the secret: its daemon is older (it "
                      "takes no challenge); upgrade it, then run doctor again")
    if answer is not None and not error:
        return (WARN, f"peer {peer} answered without proving the secret: not an "
                      "mlx-watchdog of this version, or not one at all; the secret is "
                      "not proven")
    return (WARN, f"peer {peer}: cannot prove the secret ({error})")
