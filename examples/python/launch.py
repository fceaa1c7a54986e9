#!/usr/bin/env python3
"""A whole federation on this machine: C++ aggregators (the `fedwan` tool) and
Python sites running train_fashion.py, over loopback TCP with mutual TLS.

    python3 launch.py --sites 2 --rounds 5
    python3 launch.py --sites 2 --ranks-per-site 2    # each site under torchrun, DDP

It writes a topology (root -> region-0 -> sites), provisions the federation's
credentials (a CA and one bundle per node), gives the root the Python
model's initial parameters (--initial-model), starts every node, and at the
end checks that every rank of every site holds the federation's final model.
Exits non-zero when a node fails or a rank holds another model.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import fedwan

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_fashion import initial_model  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fedwan_tool(given):
    path = given or os.environ.get("FEDWAN_CLI") or shutil.which("fedwan")
    if not path or not os.access(path, os.X_OK):
        raise SystemExit("launch.py: the fedwan command-line tool was not found; build it "
                         "(target fedwan_cli) and pass --cli PATH or set FEDWAN_CLI")
    return path


def torchrun_works():
    """torchrun of torch 1.x fails at start on Python >= 3.11 (its option
    parsing iterates an IntFlag, which 3.11 changed); torch 2.x runs."""
    major = int(torch.__version__.split(".")[0])
    return major >= 2 or sys.version_info < (3, 11)


def write_topology(path, args):
    lines = [
        "job: python-fashion-example",
        f"federation: {{rounds: {args.rounds}, inner_steps: {args.inner_steps}, "
        f"codec: {args.codec}, round_timeout_s: {args.round_timeout}, "
        f"outer_optimizer: {{name: {args.outer}}}}}",
        "nodes:",
        f'  - {{id: root, role: root, endpoint: "tcp://127.0.0.1:{free_port()}"}}',
        f'  - {{id: region-0, role: region, parent: root, '
        f'endpoint: "tcp://127.0.0.1:{free_port()}"}}',
    ]
    for k in range(args.sites):
        lines.append(f"  - {{id: site-{k}, role: site, parent: region-0, weight: 1}}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sites", type=int, default=2)
    ap.add_argument("--ranks-per-site", type=int, default=1,
                    help="ranks per site; above 1 each site runs under torchrun with DDP")
    ap.add_argument("--launcher", choices=["auto", "torchrun", "env"], default="auto",
                    help="how a site's ranks start: torchrun, or one process per rank with "
                         "torchrun's environment (env); auto: torchrun unless this torch's "
                         "torchrun cannot run on this Python")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--inner-steps", type=int, default=50)
    ap.add_argument("--codec", default="fp16")
    ap.add_argument("--outer", default="diloco", help="fedavg, diloco or fedadam")
    ap.add_argument("--round-timeout", type=float, default=600)
    ap.add_argument("--max-samples", type=int, default=0, help="cap each site's data (0: all)")
    ap.add_argument("--eval-samples", type=int, default=10000)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cli", help="the fedwan tool (default: $FEDWAN_CLI, then PATH)")
    ap.add_argument("--workdir", help="keep topology, credentials and models here")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds for the whole run")
    args = ap.parse_args()
    cli = fedwan_tool(args.cli)
    work = args.workdir or tempfile.mkdtemp(prefix="fedwan-example-")
    os.makedirs(work, exist_ok=True)

    topo_path = os.path.join(work, "federation.yaml")
    write_topology(topo_path, args)
    pki = os.path.join(work, "pki")
    if os.path.exists(pki):
        shutil.rmtree(pki)
    fedwan.provision_credentials(topo_path, pki)

    model = initial_model(args.seed)
    init = os.path.join(work, "initial.bin")
    torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tofile(init)
    final = os.path.join(work, "final.bin")

    def bundle(node):
        return fedwan.credentials_path(pki, node)

    procs = []
    procs.append(("root", subprocess.Popen(
        [cli, "aggregator", "--topology", topo_path, "--node", "root",
         "--credentials", bundle("root"), "--initial-model", init, "--out", final])))
    procs.append(("region-0", subprocess.Popen(
        [cli, "aggregator", "--topology", topo_path, "--node", "region-0",
         "--credentials", bundle("region-0")])))
    site_args = ["--topology", topo_path, "--data", args.data, "--seed", str(args.seed),
                 "--max-samples", str(args.max_samples),
                 "--eval-samples", str(args.eval_samples)]
    script = os.path.join(HERE, "train_fashion.py")
    use_torchrun = args.launcher == "torchrun" or (args.launcher == "auto" and torchrun_works())
    if args.ranks_per_site > 1:
        print(f"launch.py: each site's {args.ranks_per_site} ranks started by "
              f"{'torchrun' if use_torchrun else 'launch.py (torchrun environment)'}",
              flush=True)
    for k in range(args.sites):
        node = f"site-{k}"
        mine = site_args + ["--site", node, "--credentials", bundle(node),
                            "--save", os.path.join(work, node)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if args.ranks_per_site > 1 and use_torchrun:
            cmd = [sys.executable, "-m", "torch.distributed.run",
                   f"--nproc_per_node={args.ranks_per_site}", "--nnodes=1",
                   "--master_addr=127.0.0.1", f"--master_port={free_port()}", script] + mine
            procs.append((node, subprocess.Popen(cmd, env=env)))
        elif args.ranks_per_site > 1:
            # What torchrun does for one node: one process per rank with the
            # env:// rendezvous variables.
            port = str(free_port())
            for r in range(args.ranks_per_site):
                rank_env = dict(env, RANK=str(r), LOCAL_RANK=str(r),
                                WORLD_SIZE=str(args.ranks_per_site),
                                LOCAL_WORLD_SIZE=str(args.ranks_per_site),
                                MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
                procs.append((f"{node} rank {r}",
                              subprocess.Popen([sys.executable, script] + mine, env=rank_env)))
        else:
            procs.append((node, subprocess.Popen([sys.executable, script] + mine, env=env)))

    def stop_all(sig=signal.SIGTERM):
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    # Wait for every node; the first that fails stops the others (a site
    # that died would otherwise keep the aggregators waiting for it until
    # their join or round timeout).
    failed = []
    deadline = time.monotonic() + args.timeout
    try:
        running = list(procs)
        while running:
            for name, p in list(running):
                code = p.poll()
                if code is None:
                    continue
                running.remove((name, p))
                if code != 0 and not failed:
                    failed.append(f"{name} exited with status {code}")
                    stop_all()
            if running and time.monotonic() > deadline:
                failed.append(f"{', '.join(n for n, _ in running)} still running after "
                              f"{args.timeout:.0f} s")
                stop_all()
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        stop_all(signal.SIGINT)
        raise
    finally:
        for _, p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if failed:
        raise SystemExit("launch.py: " + "; ".join(failed))

    # Every rank of every site holds the same model: the one the federation
    # sent down. With a lossy codec (fp16, int8) that is the root's final
    # model up to the codec's rounding (the root sends the difference to
    # what the sites hold); with fp32 it is the root's, bit for bit.
    root_model = np.fromfile(final, dtype=np.float32)
    held = {(k, r): np.load(os.path.join(work, f"site-{k}.rank{r}.npy"))
            for k in range(args.sites) for r in range(args.ranks_per_site)}
    reference = held[(0, 0)]
    for (k, r), model in held.items():
        if not np.array_equal(model, reference):
            raise SystemExit(f"launch.py: site-{k} rank {r} holds another model than "
                             "site-0 rank 0")
    gap = float(np.max(np.abs(reference - root_model)))
    scale = float(np.max(np.abs(root_model)))
    if args.codec == "fp32" and gap != 0.0:
        raise SystemExit(f"launch.py: the sites' model differs from the root's by {gap:g}")
    if gap > 1e-2 * max(scale, 1.0):
        raise SystemExit(f"launch.py: the sites' model is {gap:g} away from the root's")
    print(f"launch.py: {args.sites} sites x {args.ranks_per_site} rank(s) all hold the "
          f"federation's model ({root_model.size} parameters; max |site - root| = {gap:.2g} "
          f"with codec {args.codec}); files in {work}")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
