"""A multi-host test bed: hosts built from Linux network namespaces, each with its own
address, hostname, daemon, record and state directories, joined by a veth pair.

Root only (ip netns, unshare --uts, iptables inside the namespaces). Nothing is
added to the machine's own network namespace: the veth pair is created straight
into the two namespaces, addresses live only inside them, and every namespace
and process the bed made is removed by `Bed.close`, on failure too. Each
process runs as `ip netns exec NS unshare --uts sh -c 'hostname H; exec ...'`,
so its pid is the process's own (the daemon and the ranks see the host name
`socket.gethostname()` gives, as on separate machines).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.ranks import RANK_PROG, REPO, DaemonProc, base_env, wait_for

PORT = 9753  # every host has its own port space: the same port on each
RING_PORT = 5151
SECRET = "bed-secret-not-for-production"
# The bed proves mechanisms, not defaults: short timings keep each fault to seconds.
# The peer timeout is the default's, so a query that waited on an unreachable peer
# would show in the time from the verdict to the first signal; the deadline leaves
# the background ask, started at half of it, the time to finish.
# A slow peer's excuse ends at the blocked deadline: 90 s, because a computation
# sized at 9 s has taken 35 and 90 s on this loaded machine.
TIMINGS: dict[str, object] = dict(deadline=3, interval=0.25, peer_timeout=1.0, grace=1,
                                  kill_timeout=3, evidence_timeout=0.3, blocked_deadline=90,
                                  settle=2)


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done


def health_seen(poller: subprocess.Popen[str]) -> list[tuple[float, int, str]]:
    """What a `Host.watch_health` poller saw, once ended: (wall time, status, state)."""
    if poller.poll() is None:
        poller.kill()
    out, _ = poller.communicate(timeout=10)
    return [(float(t), int(c), state) for t, c, state in
            (line.split() for line in out.splitlines() if len(line.split()) == 3)]


def cannot_build() -> str:
    """Why namespaces cannot be built here, or "" when they can."""
    if os.geteuid() != 0:
        return "the multi-host bed needs root (ip netns, unshare --uts, iptables)"
    missing = [t for t in ("ip", "unshare", "iptables") if shutil.which(t) is None]
    if missing:
        return (f"the multi-host bed needs {', '.join(missing)}: install iproute2, "
                "util-linux and iptables (.ci/run does)")
    return ""


class Host:
    """One "machine": a network namespace with one address and a hostname."""

    def __init__(self, bed: Bed, index: int, address: str) -> None:
        self.bed, self.index, self.address = bed, index, address
        self.ns = f"{bed.tag}h{index}"
        self.name = f"host{index}-{bed.tag}"  # its hostname
        self.root = bed.workdir / self.name
        self.endpoint = f"{address}:{PORT}"
        self.daemon: DaemonProc | None = None

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run on this host: in its namespace, under its own hostname."""
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.name, *argv]

    def sh(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", self.ns, *argv, check=check)

    # -- its daemon ----------------------------------------------------------------

    def new_daemon(self, fences: bool, at_defaults: bool = False, *,
                   self_peer: bool = False, secret: str = SECRET,
                   **options: object) -> DaemonProc:
        """A fresh daemon (new record and state directories) for this host: the bed's
        short timings, or (`at_defaults`) every setting at its default but the
        directories, the address, the peers and the secret, as an operator runs it, and
        the `options` given (a test lowering one default to prove a mechanism).
        `self_peer`: its own address among its peers (one file for every node);
        `secret`: another node's, to prove a mismatch."""
        run = self.root / f"run{self.bed.next_id()}"
        (run / "records").mkdir(parents=True)
        peers = [h.endpoint for h in self.bed.hosts if h is not self or self_peer]
        args = [a for p in peers for a in ("--peers", p)]
        if fences:
            args += ["--secret", secret]
        settings = {**TIMINGS, "listen": self.endpoint, **options}
        daemon = DaemonProc(run / "records", run / "state", *args, **settings)
        if at_defaults:
            daemon.argv = [*daemon.argv[:daemon.argv.index("--log-level") + 2], *args,
                           "--listen", self.endpoint,
                           *(a for k, v in options.items()
                             for a in (f"--{k.replace('_', '-')}", str(v)))]
        daemon.argv = self.wrap(daemon.argv)
        self.daemon = daemon
        return daemon

    def start_daemon(self, fences: bool, at_defaults: bool = False,
                     **options: object) -> DaemonProc:
        daemon = self.new_daemon(fences, at_defaults, **options)  # type: ignore[arg-type]
        daemon.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(daemon.log_path, "ab")  # noqa: SIM115
        daemon.proc = subprocess.Popen(daemon.argv, stdout=log, stderr=subprocess.STDOUT,
                                       env=base_env(daemon.record_dir), cwd=REPO)
        log.close()
        self.bed.procs.append(daemon.proc)
        return daemon

    # -- faults ----------------------------------------------------------------------

    def partition(self) -> None:
        """Every packet in or out of this host dropped (its own loopback too)."""
        self.sh("iptables", "-A", "INPUT", "-j", "DROP")
        self.sh("iptables", "-A", "OUTPUT", "-j", "DROP")

    def block_ring(self, ends: bool = False) -> None:
        """Only the ring's port blocked on this host, the daemons still talking: every
        packet of the ranks' connections dropped, or (`ends`) only the FIN and RST that
        would tell the peer a rank is gone (a backend that never notices a dead peer)."""
        for chain in ("INPUT", "OUTPUT"):
            for side in ("--sport", "--dport"):
                flags = ["--tcp-flags", "FIN", "FIN"] if ends else []
                self.sh("iptables", "-A", chain, "-p", "tcp", side, str(RING_PORT), *flags,
                        "-j", "DROP")
                if ends:
                    self.sh("iptables", "-A", chain, "-p", "tcp", side, str(RING_PORT),
                            "--tcp-flags", "RST", "RST", "-j", "DROP")

    def heal(self) -> None:
        self.sh("iptables", "-F", check=False)
        self.sh("tc", "qdisc", "del", "dev", self.bed.veth(self.index), "root", check=False)
        self.link(True)

    def throttle(self, rate: str) -> None:
        """What this host sends on the bed's link shaped to `rate` ("1mbit"; a token
        bucket: bytes still move, slowly; netem is not in every kernel)."""
        self.sh("tc", "qdisc", "replace", "dev", self.bed.veth(self.index), "root", "tbf",
                "rate", rate, "burst", "32kbit", "latency", "400ms")

    def link(self, up: bool) -> None:
        self.sh("ip", "link", "set", self.bed.veth(self.index), "up" if up else "down")

    # -- what an operator runs on this host ------------------------------------------

    def get(self, path: str) -> tuple[int, str]:
        """GET `path` of this host's daemon, from inside the host: (status, body)."""
        assert self.daemon is not None
        code = ("import sys, urllib.request, urllib.error\n"
                "try:\n r = urllib.request.urlopen(sys.argv[1], timeout=10)\n"
                " print(r.status); print(r.read().decode(), end='')\n"
                "except urllib.error.HTTPError as e:\n"
                " print(e.code); print(e.read().decode(), end='')\n")
        done = self.sh(sys.executable, "-c", code, f"http://{self.endpoint}{path}")
        status, _, body = done.stdout.partition("\n")
        return int(status), body

    def watch_health(self, path: str) -> subprocess.Popen[str]:
        """A poller on this host asking its daemon's `path` every 50 ms, printing
        `<wall time> <status> <state>` at each change (read with `health_seen`)."""
        assert self.daemon is not None
        code = ("import json, sys, time, urllib.request, urllib.error\n"
                "last = None\n"
                "while True:\n"
                " try:\n"
                "  r = urllib.request.urlopen(sys.argv[1], timeout=5); c, b = r.status, r.read()\n"
                " except urllib.error.HTTPError as e:\n"
                "  c, b = e.code, e.read()\n"
                " except OSError:\n"
                "  c, b = 0, b'{}'\n"
                " now = (c, json.loads(b or b'{}').get('state'))\n"
                " if now != last:\n"
                "  print(time.time(), *now, flush=True); last = now\n"
                " time.sleep(0.05)\n")
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, "-c", code,
                                 f"http://{self.endpoint}{path}"], stdout=subprocess.PIPE,
                                text=True)
        self.bed.procs.insert(0, proc)  # type: ignore[arg-type]
        return proc

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`mlx-watchdog ARGS` run on this host against its daemon's directories."""
        assert self.daemon is not None
        argv = [sys.executable, "-m", "watchdog.cli", *args]
        return subprocess.run(self.wrap(argv), capture_output=True, text=True, timeout=60,
                              env=base_env(self.daemon.record_dir), cwd=REPO)

    def cluster_status(self, timeout: float = 0.5) -> tuple[int, dict[str, Any], str]:
        """`mlx-watchdog cluster status --json` run on this host: (exit, view, stderr)."""
        assert self.daemon is not None
        argv = [sys.executable, "-m", "watchdog.cli", "cluster", "status", "--json",
                "--timeout", str(timeout), "--state-dir", str(self.daemon.state_dir),
                *[h.endpoint for h in self.bed.hosts]]
        done = subprocess.run(self.wrap(argv), capture_output=True, text=True, timeout=60,
                              env=base_env(self.daemon.record_dir), cwd=REPO)
        view = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
        return done.returncode, view, done.stderr


class Bed:
    """Two hosts on one link: 10.A.B.1 and 10.A.B.2, inside their namespaces only."""

    def __init__(self, workdir: Path, count: int = 2) -> None:
        assert count == 2, "one veth pair joins two hosts"
        self.workdir = Path(workdir)
        self.tag = f"wd{os.getpid()}"  # a veth name fits: at most 15 characters
        self.procs: list[subprocess.Popen[bytes]] = []
        self._ids = 0
        net = os.getpid() % 60000
        self.prefix = f"10.{200 + net // 250 % 50}.{net % 250}"
        self.hosts = [Host(self, i, f"{self.prefix}.{i + 1}") for i in range(count)]
        self.built: list[str] = []

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def veth(self, index: int) -> str:
        return f"{self.tag}v{index}"

    def build(self) -> Bed:
        why = cannot_build()
        if why:
            raise RuntimeError(why)
        self._remove_leftovers()
        for host in self.hosts:
            _run("ip", "netns", "add", host.ns)
            self.built.append(host.ns)
            host.sh("ip", "link", "set", "lo", "up")
        a, b = self.hosts
        _run("ip", "link", "add", self.veth(0), "netns", a.ns, "type", "veth", "peer", "name",
             self.veth(1), "netns", b.ns)
        for host in self.hosts:
            host.sh("ip", "addr", "add", f"{host.address}/24", "dev", self.veth(host.index))
            host.sh("ip", "link", "set", self.veth(host.index), "up")
        return self

    def _remove_leftovers(self) -> None:
        """Namespaces of a bed whose test run was killed before its finalizer ran
        (named after that run's pid, which is gone), and this run's own names."""
        listed = _run("ip", "netns", "list", check=False).stdout.split()
        for name in listed:
            match = re.fullmatch(r"wd(\d+)h\d", name)
            if match and (name.startswith(self.tag + "h")
                          or not os.path.exists(f"/proc/{match.group(1)}")):
                _run("ip", "netns", "del", name, check=False)

    def heal(self) -> None:
        for host in self.hosts:
            host.heal()

    # -- daemons and jobs ------------------------------------------------------------

    def start_daemons(self, fences: bool, at_defaults: bool = False,
                      **options: object) -> list[DaemonProc]:
        daemons = [h.start_daemon(fences, at_defaults, **options) for h in self.hosts]
        for d in daemons:
            status = d.state_dir / "status.json"
            wait_for(lambda d=d, status=status: d.alive() and status.exists(), 30,
                     what="a host's daemon's first scan")
        return daemons

    def ring(self, mode: str = "loop", *args: str,
             env: dict[str, str] | None = None, on: list[Host] | None = None) -> BedJob:
        """One ring rank per host (tests/support/rank_prog.py MODE), rank i on host i
        (or on `on[i]`: a one-node job); `env` added to each rank's environment."""
        return BedJob(self, mode, args, env, on).start()

    def end_process(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    break
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self) -> None:
        """End every process the bed started (daemons, ranks), by pid: the daemons by
        SIGTERM (5 s to go), then whatever is left at once (nothing else was asked to)."""
        daemons = [proc for proc in self.procs if proc.poll() is None and any(
            h.daemon and h.daemon.proc is proc for h in self.hosts)]
        for proc in daemons:
            proc.send_signal(signal.SIGTERM)
        until = time.monotonic() + 5
        for proc in daemons:
            while proc.poll() is None and time.monotonic() < until:
                time.sleep(0.05)
        for proc in self.procs:
            self.end_process(proc)
        self.procs.clear()

    def close(self) -> None:
        try:
            self.stop_all()
        finally:
            for ns in self.built:
                _run("ip", "netns", "del", ns, check=False)
            self.built.clear()


class BedJob:
    """A ring job across the bed's hosts: rank i on host i, its record in host i's
    daemon's record directory."""

    def __init__(self, bed: Bed, mode: str, args: tuple[str, ...],
                 env: dict[str, str] | None = None, on: list[Host] | None = None) -> None:
        self.bed, self.mode, self.args, self.env = bed, mode, args, env or {}
        self.hosts = on or bed.hosts
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self) -> BedJob:
        run = self.bed.workdir / f"job{self.bed.next_id()}"
        run.mkdir(parents=True)
        hostfile = run / "hosts.json"
        # Two ranks on one host listen on two ports: the second RING_PORT + 1.
        hostfile.write_text(json.dumps([[f"{h.address}:{RING_PORT + self.hosts[:rank].count(h)}"]
                                        for rank, h in enumerate(self.hosts)]))
        for rank, host in enumerate(self.hosts):
            assert host.daemon is not None, "start the daemons first"
            env = base_env(host.daemon.record_dir, MLX_HOSTFILE=str(hostfile),
                           MLX_RANK=str(rank), **self.env)
            self.logs.append(run / f"rank{rank}.log")
            with open(self.logs[-1], "wb") as log:
                proc = subprocess.Popen(
                    host.wrap([sys.executable, str(RANK_PROG),
                               self.mode, *self.args]),
                    env=env, stdout=log, stderr=subprocess.STDOUT, cwd=run)
            self.procs.append(proc)
            self.bed.procs.append(proc)
        return self

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text(errors="replace")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def wait_running(self, timeout: float = 60, collectives: int = 3) -> None:
        def ready() -> bool:
            for rank, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise AssertionError(f"rank {rank} exited early ({p.returncode}):\n"
                                         + self.log(rank))
            shown = [h.daemon.ranks().get(pid) if h.daemon else None
                     for h, pid in zip(self.hosts, self.pids, strict=True)]
            return all(r and r["collectives"] >= collectives for r in shown)
        wait_for(ready, timeout, what="a ring rank running on each host")

    def gone(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def signal(self, rank: int, signum: int) -> None:
        os.kill(self.procs[rank].pid, signum)
