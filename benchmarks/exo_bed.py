"""The real exo on the bed (../shared/exo-bed): a runner frozen, does exo answer again?

    sudo EXO_BASE=/tmp/exo-i46 python3 -m benchmarks.exo_bed --scenario mid --runs 10
    sudo EXO_BASE=/tmp/exo-i46 python3 -m benchmarks.exo_bed --scenario idle --runs 5
    sudo EXO_BASE=/tmp/exo-i46 python3 -m benchmarks.exo_bed --scenario healthy

Not a CI test: it needs the bed built by ../shared/exo-bed/setup.sh (run from this
checkout, so the chroot's mlx-watchdog is this one), root, and minutes per run. Each run
is a fresh bed (namespaces exo1/exo2, a daemon per node at the defaults plus peers and a
secret, exo on each node, one 2-node MlxRing instance), torn down by pid after.

Per run it prints one JSON line: the rank frozen, when every runner of the instance ended
(s after the freeze), when exo answered a new request again (s after the freeze, None if
not within --answer-within), and how many times each node's worker planned CreateRunner
and Shutdown after the freeze (the loop of issue 46 shows as many of both)."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
BED = REPO.parent / "shared" / "exo-bed"
MODEL = "mlx-community/Llama-3.2-1B-Instruct-4bit"
SECRET = "exo-bed-secret-0123456789"
ADDR = {1: "10.77.0.1", 2: "10.77.0.2"}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


class Bed:
    def __init__(self, base: Path, out: Path, daemon_repo: Path = REPO) -> None:
        self.base, self.root, self.out = base, base / "trixie", out
        self.daemon_repo = daemon_repo
        self.procs: list[subprocess.Popen[bytes]] = []
        self.mounted: list[Path] = []
        self.nodes: dict[int, subprocess.Popen[bytes]] = {}
        self.daemons: dict[int, subprocess.Popen[bytes]] = {}

    # -- up ------------------------------------------------------------------------
    def up(self) -> None:
        for m in ("proc", "dev", "sys"):
            p = self.root / m
            if sh("mountpoint", "-q", str(p), check=False).returncode == 0:
                continue
            if m == "proc":
                sh("mount", "-t", "proc", "proc", str(p))
            else:
                sh("mount", "--bind", f"/{m}", str(p))
            self.mounted.append(p)
        for n in (1, 2):
            sh("ip", "netns", "del", f"exo{n}", check=False)
        sh("ip", "netns", "add", "exo1")
        sh("ip", "netns", "add", "exo2")
        sh("ip", "link", "add", "exoveth1", "netns", "exo1", "type", "veth",
           "peer", "name", "exoveth2", "netns", "exo2")
        for n in (1, 2):
            ns = ("ip", "netns", "exec", f"exo{n}")
            sh(*ns, "ip", "addr", "add", f"{ADDR[n]}/24", "dev", f"exoveth{n}")
            sh(*ns, "ip", "link", "set", f"exoveth{n}", "up")
            sh(*ns, "ip", "link", "set", "lo", "up")
        for n in (1, 2):
            rec = self.root / "opt" / f"rec{n}"
            subprocess.run(["rm", "-rf", str(rec), str(self.out / f"state{n}")], check=False)
            rec.mkdir(parents=True)
            other = ADDR[3 - n]
            argv = ["ip", "netns", "exec", f"exo{n}", "unshare", "--uts", "sh", "-c",
                    'hostname "$0" && exec "$@"', f"exo{n}", sys.executable, "-m",
                    "watchdog.cli", "run", "--dir", str(rec), "--state-dir",
                    str(self.out / f"state{n}"), "--log-level", "debug",
                    "--peers", f"{other}:9753", "--secret", SECRET,
                    "--listen", f"{ADDR[n]}:9753"]
            env = {**os.environ, "PYTHONPATH": str(self.daemon_repo)}
            with open(self.out / f"daemon{n}.log", "wb") as log:
                self.daemons[n] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                   env=env, cwd=self.daemon_repo)
            self.procs.append(self.daemons[n])
        env = {**os.environ, "EXO_BASE": str(self.base)}
        for n in (1, 2):
            with open(self.out / f"exo{n}.log", "wb") as log:
                self.nodes[n] = subprocess.Popen(
                    ["bash", str(BED / "run-node.sh"), str(n), "MLX_WATCHDOG=1",
                     f"MLX_WATCHDOG_DIR=/opt/rec{n}"],
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            self.procs.append(self.nodes[n])

    # -- the API, from inside node 1's namespace -------------------------------------
    def api(self, method: str, path: str, body: Any = None, node: int = 1,
            timeout: float = 10) -> Any:
        argv = ["ip", "netns", "exec", f"exo{node}", "curl", "-sS", "-m", str(timeout),
                "-X", method, f"http://{ADDR[node]}:52415{path}"]
        if body is not None:
            argv += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None
        try:
            return json.loads(done.stdout)
        except ValueError:
            return done.stdout

    def chat(self, max_tokens: int = 8, timeout: float = 15) -> bool:
        reply = self.api("POST", "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens}, timeout=timeout)
        return isinstance(reply, dict) and bool(reply.get("choices"))

    def stream(self, max_tokens: int) -> subprocess.Popen[str]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "tell a story"}],
                "max_tokens": max_tokens, "stream": True}
        return subprocess.Popen(
            ["ip", "netns", "exec", "exo1", "curl", "-sS", "-N", "-m", "300", "-X", "POST",
             f"http://{ADDR[1]}:52415/v1/chat/completions", "-H",
             "Content-Type: application/json", "-d", json.dumps(body)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def wait(self, what: str, cond: Any, timeout: float, step: float = 1.0) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = cond()
            if got:
                return got
            time.sleep(step)
        raise TimeoutError(what)

    def ready(self) -> dict[str, Any]:
        ids = self.wait("node ids", lambda: all(
            isinstance(self.api("GET", "/node_id", node=n), str) for n in (1, 2)), 240)
        del ids
        streak = [0]

        def settled() -> bool:
            topo = json.dumps(self.api("GET", "/state/topology"))
            mem = json.dumps(self.api("GET", "/state/nodeMemory"))
            both = all(str(self.api("GET", "/node_id", node=n)).strip('"') in topo
                       and str(self.api("GET", "/node_id", node=n)).strip('"') in mem
                       for n in (1, 2))
            streak[0] = streak[0] + 1 if both else 0
            return streak[0] >= 3
        self.wait("topology", settled, 240)
        placed_at = self.out / "exo1.log"
        seen = 0
        body = {"model_id": MODEL, "sharding": "Pipeline", "instance_meta": "MlxRing",
                "min_nodes": 2}
        self.api("POST", "/place_instance", body)
        placed = time.monotonic()
        end = placed + 300
        while time.monotonic() < end:
            runners = self.api("GET", "/state/runners")
            if isinstance(runners, dict) and len(runners) == 2 and all(
                    "RunnerReady" in json.dumps(s) for s in runners.values()):
                return runners
            # Refused while the election settles ("No cycles found", in its log), or
            # lost to a master that was replaced: placed again, only with no instance.
            refusals = placed_at.read_text(errors="replace").count("No cycles found")
            if (refusals > seen or time.monotonic() - placed > 30) \
                    and not self.api("GET", "/state/instances"):
                seen = refusals
                self.api("POST", "/place_instance", body)
                placed = time.monotonic()
            time.sleep(1)
        raise TimeoutError("runners ready")

    def runner_pids(self) -> dict[int, int]:
        """Node -> its runner's pid (the exo node's descendant that is no helper)."""
        found: dict[int, int] = {}
        for n, node in self.nodes.items():
            try:
                kids = psutil.Process(node.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for kid in kids:
                try:
                    cmd = " ".join(kid.cmdline())
                except psutil.Error:
                    continue
                if "spawn_main" in cmd or "multiprocessing" in cmd and "tracker" not in cmd:
                    if "resource_tracker" in cmd or "forkserver" in cmd:
                        continue
                    found[n] = kid.pid
        return found

    def count(self, n: int, what: str, since: int) -> int:
        return (self.out / f"exo{n}.log").read_text(errors="replace")[since:].count(what)

    # -- down ----------------------------------------------------------------------
    def down(self) -> None:
        for n, node in self.nodes.items():
            try:
                procs = [psutil.Process(node.pid), *psutil.Process(node.pid).children(True)]
            except psutil.NoSuchProcess:
                procs = []
            for p in procs:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            del n
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        sh("ip", "netns", "del", "exo1", check=False)
        sh("ip", "netns", "del", "exo2", check=False)
        for m in reversed(self.mounted):
            if sh("umount", str(m), check=False).returncode != 0:
                sh("umount", "-l", str(m), check=False)


def one_run(args: argparse.Namespace, index: int) -> dict[str, Any]:
    out = Path(args.out) / f"{args.scenario}-{index}"
    out.mkdir(parents=True, exist_ok=True)
    bed = Bed(Path(os.environ.get("EXO_BASE", "/tmp/exo-try")), out, Path(args.daemon_repo))
    result: dict[str, Any] = {"scenario": args.scenario, "run": index,
                              "at": time.strftime("%H:%M:%S", time.gmtime())}
    try:
        bed.up()
        bed.ready()
        assert bed.chat(), "the first request"
        pids = bed.runner_pids()
        result["runners"] = pids
        if args.scenario == "healthy":
            end = time.monotonic() + args.healthy_seconds
            answered = 0
            while time.monotonic() < end:
                answered += bed.chat()
                time.sleep(random.uniform(3, 20))
            result["answered"] = answered
            result["load_after"] = round(os.getloadavg()[0], 2)  # the machine is shared
            # Each incident is one "incident <id>, job ..." line in its daemon's log.
            result["incidents"] = sum(
                line.count(" INFO incident ") + line.count(" WARNING incident ")
                for n in (1, 2)
                for line in (bed.out / f"daemon{n}.log").read_text(errors="replace")
                .splitlines())
            result["runners_alive"] = all(psutil.pid_exists(p) for p in pids.values())
            return result
        victim = random.choice([1, 2]) if args.victim == 0 else args.victim
        result["frozen_node"] = victim
        offsets = {n: (bed.out / f"exo{n}.log").stat().st_size for n in (1, 2)}
        stream = None
        if args.scenario == "mid":
            stream = bed.stream(max_tokens=100000)
            assert stream.stdout is not None
            chunks = 0
            for _ in stream.stdout:
                chunks += 1
                if chunks >= 5:
                    break
            time.sleep(random.uniform(0, 0.5))
        burners: list[subprocess.Popen[bytes]] = []
        os.kill(pids[victim], signal.SIGSTOP)
        frozen = time.monotonic()
        result["load_at_freeze"] = round(os.getloadavg()[0], 2)
        if args.scenario == "idle":
            # Frozen while idle: nothing waits on it until a request comes (exo hands it
            # to both runners; the other waits on the frozen one in the first step).
            stream = bed.stream(max_tokens=64)
        if stream is not None:  # read to its end (an error chunk) in the background
            threading.Thread(target=lambda: stream.communicate(), daemon=True).start()
        ended: dict[int, float] = {}
        answered_at = None
        deadline = frozen + args.answer_within
        while time.monotonic() < deadline:
            now = time.monotonic()
            for n, pid in pids.items():
                if n not in ended and not psutil.pid_exists(pid):
                    ended[n] = round(now - frozen, 1)
            if len(ended) == len(pids):
                if args.load and not burners:  # a busy machine while exo recovers
                    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                               for _ in range(args.load)]
                if bed.chat(timeout=10):
                    answered_at = round(time.monotonic() - frozen, 1)
                    break
            time.sleep(1)
        for burner in burners:
            burner.kill()
            burner.wait()
        result["ended"] = ended
        result["answered"] = answered_at
        result["load_after"] = round(os.getloadavg()[0], 2)  # the machine is shared
        result["create_runner"] = {n: bed.count(n, "Worker plan: CreateRunner", offsets[n])
                                   for n in (1, 2)}
        result["shutdown"] = {n: bed.count(n, "Worker plan: Shutdown", offsets[n])
                              for n in (1, 2)}
        if stream is not None and stream.poll() is None:
            stream.kill()
        return result
    except Exception as exc:  # noqa: BLE001 - a failed run is a result, the next one runs
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    finally:
        bed.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["mid", "idle", "healthy"], default="mid")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--victim", type=int, default=0, help="node to freeze (0: random)")
    parser.add_argument("--answer-within", type=float, default=180.0)
    parser.add_argument("--healthy-seconds", type=float, default=120.0)
    parser.add_argument("--out", default="/tmp/exo-bed-runs")
    parser.add_argument("--load", type=int, default=0,
                        help="busy processes while exo recovers (slow runner start-up)")
    parser.add_argument("--daemon-repo", default=str(REPO),
                        help="the mlx-watchdog checkout the daemons run (a baseline)")
    args = parser.parse_args()
    # SIGTERM (or SIGINT, ignored in a background job) still tears the bed down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for i in range(args.runs):
        print(json.dumps(one_run(args, i)), flush=True)


if __name__ == "__main__":
    main()
