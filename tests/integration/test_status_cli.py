#!/usr/bin/env python3
"""`fedwan status` shows a running demo's tree and a hung site as unhealthy.

usage: test_status_cli.py FEDWAN_BINARY WORKDIR

Runs `fedwan demo --metrics` (enough rounds to look at it while it runs),
waits until `fedwan status --topology DIR/topology.yaml --json` lists every
node of the topology as healthy, then stops one site with SIGSTOP (a hung
node: its process is there, nothing answers) and checks that status reports
it unhealthy (exit 3, the site named) within the federation's heartbeat
timeout; then the site goes on (SIGCONT), and the federation must still
finish. The text tree must name every node. Exits 0 when all of that holds.

A stopped site rather than a killed one: the demo's supervisor restarts a
killed site at once, and whether a status poll lands in the moment before
it answers again is a race the machine's load decides (a busy machine lost
it). A stopped process stays unanswering until the test lets it go on.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

SITE = "site-1"
TOPOLOGY_WAIT_S = 180
HEALTHY_WAIT_S = 120
HEARTBEAT_TIMEOUT_S = 10  # the demo's federation.heartbeat_timeout_s (the default)


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def status(fedwan, topology):
    r = subprocess.run([fedwan, "status", "--topology", topology, "--json", "--timeout", "1"],
                       capture_output=True, text=True, timeout=60)
    try:
        return r.returncode, json.loads(r.stdout)
    except json.JSONDecodeError:
        fail(f"fedwan status --json printed no JSON (exit {r.returncode}): {r.stdout!r} "
             f"{r.stderr!r}")


def site_pids(node):
    """PIDs of `fedwan site ... --node NODE` processes."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"site" in args and b"--node" in args:
            i = args.index(b"--node")
            if i + 1 < len(args) and args[i + 1] == node.encode():
                out.append(int(pid))
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    fedwan, work = sys.argv[1], sys.argv[2]
    demo_dir = os.path.join(work, "demo")
    os.makedirs(work, exist_ok=True)
    log = open(os.path.join(work, "demo.log"), "w")
    demo = subprocess.Popen([fedwan, "demo", "--rounds", "20", "--inner-steps", "20",
                             "--no-baseline", "--metrics", "--dir", demo_dir, "--force",
                             "--report", os.path.join(work, "report.json")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        topology = os.path.join(demo_dir, "topology.yaml")
        deadline = time.time() + TOPOLOGY_WAIT_S
        while not os.path.exists(topology):
            if demo.poll() is not None or time.time() > deadline:
                fail("the demo wrote no topology")
            time.sleep(0.2)
        time.sleep(0.5)  # written whole: the demo writes it before starting nodes
        with open(topology) as f:
            nodes = re.findall(r'id: "?([A-Za-z0-9._-]+)"?', f.read())
        if len(nodes) != 7:
            fail(f"expected 7 nodes in {topology}, found {nodes}")

        deadline = time.time() + HEALTHY_WAIT_S
        while True:
            code, s = status(fedwan, topology)
            if code == 0 and s["healthy"] and all(n["healthy"] for n in s["nodes"]):
                rounds = [n["status"]["round"] for n in s["nodes"] if n["node"] == "root"]
                if rounds and rounds[0] >= 1:
                    break
            if demo.poll() is not None:
                fail("the demo ended before every node was healthy")
            if time.time() > deadline:
                fail(f"not every node healthy within {HEALTHY_WAIT_S} s: "
                     + json.dumps([(n["node"], n["health"]) for n in s["nodes"]]))
            time.sleep(0.5)
        listed = sorted(n["node"] for n in s["nodes"])
        if listed != sorted(nodes):
            fail(f"status lists {listed}, the topology {sorted(nodes)}")
        text = subprocess.run([fedwan, "status", "--topology", topology], capture_output=True,
                              text=True, timeout=60)
        print(text.stdout, flush=True)
        for n in nodes:
            if n not in text.stdout:
                fail(f"the tree does not show {n}")

        pids = site_pids(SITE)
        if not pids:
            fail(f"no process of {SITE} found")
        stopped_at = time.time()
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        seen = None
        try:
            while time.time() - stopped_at < HEARTBEAT_TIMEOUT_S:
                code, s = status(fedwan, topology)
                site = next(n for n in s["nodes"] if n["node"] == SITE)
                if code == 3 and not site["healthy"]:
                    seen = time.time() - stopped_at
                    print(f"{SITE} unhealthy {seen:.1f} s after SIGSTOP: {site['health']}",
                          flush=True)
                    break
                time.sleep(0.2)
        finally:
            for p in pids:
                try:
                    os.kill(p, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        if seen is None:
            fail(f"{SITE} was not reported unhealthy within the heartbeat timeout "
                 f"({HEARTBEAT_TIMEOUT_S} s)")
        others = [n["node"] for n in s["nodes"] if n["node"] != SITE and not n["healthy"]]
        if others:
            fail(f"nodes other than {SITE} reported unhealthy: {others}")

        try:
            rc = demo.wait(timeout=900)
        except subprocess.TimeoutExpired:
            fail("the demo did not finish")
        if rc != 0:
            fail(f"the demo failed ({rc}); see {log.name}")
        print("ok: fedwan status showed every node and the hung site as unhealthy", flush=True)
        return 0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
            try:
                demo.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
