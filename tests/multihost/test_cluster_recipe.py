"""docs/cluster.md's recipe, run on the multi-host bed: its shared config block (read
from the page, the four Macs' names mapped onto the bed's two hosts), each host's
daemon started from that one file, the rollout from observe to enforce by SIGHUP,
`node wait-healthy`, every node's /metrics read from another host, `doctor` in the
job's environment, a frozen rank ended on both hosts while each lists itself among its
peers, `cluster status` from the file alone, and one daemon restarted while the other
watches (the rolling upgrade's step). One test, well under 90 s."""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.netbed import PORT, TIMINGS, Bed, Host
from tests.support.ranks import REPO, DaemonProc, base_env, wait_for

pytestmark = pytest.mark.ranks

PAGE = REPO / "docs" / "cluster.md"
MARKER = "<!-- the shared config"


def shared_config(bed: Bed) -> str:
    """The page's config block, its Macs mapped onto the bed's hosts (studio-1 -> the
    first, studio-2 -> the second; the entries of the other two dropped)."""
    text = PAGE.read_text(encoding="utf-8")
    block = re.search(r"```toml\n(.*?)```", text[text.index(MARKER):], re.S)
    assert block, "docs/cluster.md has no config block after its marker"
    toml = block.group(1)
    for n, host in enumerate(bed.hosts, start=1):
        toml = toml.replace(f"studio-{n}.local:9753", host.endpoint)
    toml = re.sub(r',?\s*"studio-\d\.local:9753"', "", toml)
    assert "studio-" not in toml and f":{PORT}" in toml, toml
    # The page's placeholder, which the daemon refuses: a secret made as the page says.
    assert 'secret = "REPLACE-' in toml, toml
    return re.sub(r'"REPLACE[^"]*"', f'"{secrets.token_urlsafe(24)}"', toml)


def command(host: Host, *args: object) -> subprocess.CompletedProcess[str]:
    """`mlx-watchdog ARGS` run on `host`, as an operator there would."""
    argv = host.wrap([sys.executable, "-m", "watchdog.cli", *map(str, args)])
    env = {k: v for k, v in base_env("unused").items() if not k.startswith("MLX_")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


def start(bed: Bed, host: Host, config: Path, run: Path) -> DaemonProc:
    """The service's command on this host, `run --config FILE`, with the bed's short
    timings as flags (the bed proves the recipe, not the defaults) and this host's own
    directories (the bed's hosts share one disk; the Macs do not)."""
    timings = {k: v for k, v in TIMINGS.items() if k != "listen"}
    daemon = DaemonProc(run / "records", run / "state", "--config", str(config), **timings)
    at = daemon.argv.index("--listen")  # DaemonProc's loopback default: the file's instead
    del daemon.argv[at:at + 2]
    daemon.argv = host.wrap(daemon.argv)
    (run / "records").mkdir(parents=True, exist_ok=True)
    daemon.state_dir.mkdir(parents=True, exist_ok=True)
    (daemon.state_dir / "status.json").unlink(missing_ok=True)  # a restart's: this one's
    env = {k: v for k, v in base_env(daemon.record_dir).items() if k != "MLX_WATCHDOG_DIR"}
    with open(daemon.log_path, "ab") as log:
        daemon.proc = subprocess.Popen(daemon.argv, stdout=log, stderr=subprocess.STDOUT,
                                       env=env, cwd=REPO)
    bed.procs.append(daemon.proc)
    host.daemon = daemon
    wait_for(lambda: daemon.alive() and (daemon.state_dir / "status.json").exists(), 30,
             what=f"{host.name}'s daemon's first scan")
    return daemon


def metrics_from(host: Host, other: Host) -> str:
    code = (f"import urllib.request; print(urllib.request.urlopen("
            f"'http://{other.endpoint}/metrics', timeout=10).read().decode())")
    done = subprocess.run(host.wrap([sys.executable, "-c", code]), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_four_mac_recipe_on_the_bed(bed, tmp_path):
    began = time.monotonic()
    bed.heal()
    try:
        config = tmp_path / "mlx-watchdog.toml"  # the one file every node reads
        config.write_text(shared_config(bed))
        config.chmod(0o600)  # it holds the secret (the page says so)
        assert 'mode = "observe"' in config.read_text()
        runs = [tmp_path / h.name for h in bed.hosts]
        daemons = [start(bed, h, config, run) for h, run in zip(bed.hosts, runs, strict=True)]
        for daemon in daemons:
            log = daemon.log()
            assert f"settings from {config}" in log, log
            assert "fences on" in log and "loopback" not in log, log
            assert "(mode observe," in log, log

        # Step 4: observe -> enforce, the file edited and every daemon reloaded.
        config.write_text(config.read_text().replace('mode = "observe"', 'mode = "enforce"'))
        for daemon in daemons:
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGHUP)
        for daemon in daemons:
            wait_for(lambda d=daemon: "SIGHUP: reloaded" in d.log(), 30, what="the reload")
            assert "mode observe -> enforce" in daemon.log(), daemon.log()

        # Step 5's first command: the node and its peers (from the file) are fit.
        for host, daemon in zip(bed.hosts, daemons, strict=True):
            done = command(host, "--config", config, "node", "wait-healthy", "--timeout", 10,
                           "--state-dir", daemon.state_dir)
            assert done.returncode == 0 and "node fit" in done.stderr, done

        # Step 6: each node's /metrics from the other host: the mode, the version.
        for host, other in ((bed.hosts[0], bed.hosts[1]), (bed.hosts[1], bed.hosts[0])):
            text = metrics_from(host, other)
            assert 'mlx_watchdog_mode{mode="enforce"} 1.0' in text, text[-2000:]
            assert "mlx_watchdog_build_info{" in text

        # A job over both hosts; step 7: doctor in the job's environment.
        job = bed.ring("loop")
        job.wait_running(timeout=60)
        done = command(bed.hosts[0], "--config", config, "doctor",
                       "--dir", daemons[0].record_dir, "--state-dir", daemons[0].state_dir,
                       "--listen", f"{bed.hosts[0].address}:{PORT}")
        assert "(the hook its ranks load) is the daemon's" in done.stdout, done.stdout
        # Issue 38, item 9: the daemon on the port watches this config's directories,
        # and every peer of the file answers with a clock inside the fences' window.
        assert f"watches {daemons[0].record_dir} (state {daemons[0].state_dir}), as this " \
            "config names" in done.stdout, done.stdout
        for other in bed.hosts:
            # Itself among the file's peers: skipped, as its daemon skips it (issue 56).
            said = (f"[OK  ] peer {other.endpoint} is this node (its listen " if other is
                    bed.hosts[0] else f"[OK  ] peer {other.endpoint} answers ({other.name}")
            assert said in done.stdout, done.stdout
        assert "[OK  ] fences on: a secret of 32 characters" in done.stdout, done.stdout
        assert "may read it" not in done.stdout, done.stdout
        text = metrics_from(bed.hosts[1], bed.hosts[0])
        assert re.search(r'mlx_watchdog_rank_state\{mlx_job="[^"]+",rank="0",'
                         r'state="running",uid="\d+"\} 1\.0', text), text[-2000:]

        # A frozen rank: ended on both hosts, each listing itself among its peers.
        job.signal(1, signal.SIGSTOP)
        frozen = time.monotonic()
        wait_for(job.gone, 45, what="both ranks of the frozen job ended")
        ended_in = time.monotonic() - frozen
        # Journaled once each node's response is done, a moment after the ranks are gone:
        # the verdict's on host 0, the fence's on host 1.
        wait_for(lambda: all(d.incidents() for d in daemons), 20, what="each node's incident")
        incidents = [d.incidents() for d in daemons]
        # One response for the job on each node, not one more for each time a node is
        # in `peers`.
        assert [len(host) for host in incidents] == [1, 1], incidents
        assert [i["action"] for host in incidents for i in host] == ["ended", "ended"]
        assert [i["verdict"] for host in incidents for i in host] == ["stalled", "fenced"]
        for daemon in daemons:
            log = daemon.log()
            assert "Traceback" not in log and "refused a fence" not in log, log
        # Issue 38, item 4: the log as a person reads it. The verdict names its incident,
        # one line tells how the response ended, the fence is one line in words (sent
        # once: not again when rank 0 exits of it), and no WARNING needs no person.
        # Each node's line on how its response ended follows its incident's journal write.
        for daemon, (incident, *_) in zip(daemons, incidents, strict=True):
            wait_for(lambda d=daemon, i=incident: f"INFO incident {i['id']}," in d.log(), 10,
                     what="each node's line on how its response ended")
        logs = [d.log() for d in daemons]
        said = [line for log in logs for line in log.splitlines() if " INFO " in line
                or " WARNING " in line or " ERROR " in line]
        assert not [line for line in said if "{'" in line or "FenceSent(" in line], said
        assert not [line for line in said if " WARNING " in line], said
        job_id = incidents[0][0]["job"]
        assert len([line for line in said if f"fenced job {job_id} " in line]) == 1, said
        for (incident,), how in zip(incidents, ("rank 0 ended", "rank 1 ended by SIGTERM"),
                                    strict=True):
            ends = [line for line in said if f"INFO incident {incident['id']}, job {job_id}: "
                    in line and "read it: " in line]
            assert len(ends) == 1 and how in ends[0], said
            assert any(f"ERROR incident {incident['id']}, job {job_id}: " in line
                       for line in said), said
        print("\n".join(line for line in said if job_id in line))

        # Step 7: cluster status from the file's peers alone, on either host.
        done = command(bed.hosts[1], "--config", config, "cluster", "status", "--json",
                       "--state-dir", daemons[1].state_dir)
        view = json.loads(done.stdout)
        assert done.returncode == 0, (done.returncode, done.stderr, view)
        assert [j["state"] for j in view["jobs"]] == ["ended"], view
        assert all(n["ok"] for n in view["nodes"]), view["nodes"]

        # Step 8: one node's daemon restarted (its upgrade) while the other watches.
        assert daemons[1].stop() == 0
        daemons[1] = start(bed, bed.hosts[1], config, runs[1])
        done = command(bed.hosts[0], "--config", config, "cluster", "status", "--json",
                       "--state-dir", daemons[0].state_dir)
        view = json.loads(done.stdout)
        assert done.returncode == 0 and all(n["ok"] for n in view["nodes"]), (
            done.returncode, view["nodes"], [j["state"] for j in view["jobs"]])
    finally:
        bed.stop_all()
        bed.heal()
    took = time.monotonic() - began
    print(f"\ncluster recipe on the bed: {took:.1f}s in all; frozen rank to both ended "
          f"{ended_in:.1f}s")
    assert took < 90, f"the recipe's bed test took {took:.0f}s (keep it under 90 s)"
