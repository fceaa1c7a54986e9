#!/usr/bin/env python3
"""Time per sync of a site driven from Python against one driven from C++.

Each run is one federation of two processes over loopback with mutual TLS:
a root (``fedwan_site_sync --root``, the same C++ aggregator for every run)
and one site, driven by one of

- ``cpp``:  ``fedwan_site_sync``, a C++ ``SiteCore`` over a ``std::vector``
  (the baseline);
- ``core``: ``fedwan.SiteCore`` over a NumPy array;
- ``site``: ``fedwan.Site`` over the parameters of a torch model.

Every driver starts from the synthetic workload's initial model (the root's,
so ``join()`` downloads nothing), runs one synthetic local step per round
outside the timing, and times ``sync()`` alone (wall clock). The drivers take
turns, their order rotating from one repetition to the next. A driver's
figure is the median of all its timed syncs over its runs (the first sync of
each run is left out as warm-up when there are three rounds or more). The
ratio Python / C++ of those medians is gated at 1.1 for each Python driver
(``--gate`` makes a FAIL exit 1).

Exit status: 0 (PASS or FAIL without ``--gate``), 1 (FAIL with ``--gate``),
2 (something could not run). Run ``--help`` for the options.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

GATE = 1.1
SEED = 7
DRIVERS = ("cpp", "core", "site")
LABELS = {"cpp": "C++ SiteCore", "core": "Python SiteCore", "site": "Python Site (torch)"}
SITE, ROOT = "site-0", "root"


class CouldNotRun(Exception):
    """Something the measurement needs is missing or failed (exit 2)."""


# ---- the Python site drivers (one process per run: --serve-site) ----------

def _torch_model(torch, n: int):
    """A model of exactly n fp32 parameters: 1000x1000 linear layers and
    one vector for the rest."""
    width = 1000
    per_layer = width * width + width
    layers = [torch.nn.Linear(width, width) for _ in range(n // per_layer)]
    model = torch.nn.Sequential(*layers)
    rest = n - len(layers) * per_layer
    if rest:
        model.register_parameter("rest", torch.nn.Parameter(torch.zeros(rest)))
    return model


def serve_site(args) -> int:
    import fedwan

    topology = fedwan.Topology.load(args.topology)
    index = topology.node(args.node).index
    initial = fedwan.synthetic_initial_model(args.params, SEED)
    options = dict(join_timeout_s=args.join_timeout, credentials=args.credentials)
    if args.serve_site == "core":
        params = initial
        site = fedwan.SiteCore(topology, args.node, params, **options)
    else:
        import torch

        torch.set_num_threads(1)  # torch does no work in a sync; keep its pool idle
        model = _torch_model(torch, args.params)
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.from_numpy(initial), model.parameters())
        site = fedwan.Site(model, topology=topology, node_id=args.node, **options)
        params = site.flat.numpy()  # the buffer the model's parameters are views of

    t0 = time.perf_counter()
    result = site.join()
    join_s = time.perf_counter() - t0
    sync_s, sent, received = [], [], []
    while not result["finished"]:
        # Local work stays out of the timing; the step makes the delta non-zero.
        fedwan.synthetic_local_steps(params, index, 1, SEED)
        t0 = time.perf_counter()
        result = site.sync()
        sync_s.append(time.perf_counter() - t0)
        sent.append(result["bytes_sent"])
        received.append(result["bytes_received"])
    site.close()
    report = {"role": "site", "impl": args.serve_site, "params": args.params,
              "codec": topology.federation.codec, "join_s": join_s, "sync_s": sync_s,
              "bytes_sent": sent, "bytes_received": received}
    Path(args.out).write_text(json.dumps(report) + "\n")
    return 0


# ---- the harness ----------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_topology(path: Path, endpoint: str, args) -> None:
    path.write_text(
        "job: sync-overhead\n"
        "federation:\n"
        f"  rounds: {args.rounds}\n"
        "  inner_steps: 1\n"
        f"  codec: {args.codec}\n"
        f"  round_timeout_s: {args.round_timeout}\n"
        "nodes:\n"
        f"  - {{id: {ROOT}, role: root, endpoint: \"{endpoint}\"}}\n"
        f"  - {{id: {SITE}, role: site, parent: {ROOT}}}\n")


class Federation:
    """Writes topologies and credentials into a scratch directory and runs
    one federation per call of run()."""

    def __init__(self, args, scratch: Path, binary: Path, env: Dict[str, str]):
        import fedwan

        self.args, self.scratch, self.binary, self.env = args, scratch, binary, env
        self.runs = 0
        self.pki = scratch / "pki"
        first = self._topology()
        try:
            fedwan.provision_credentials(str(first), str(self.pki))  # ids, not endpoints
        except fedwan.Error as e:
            raise CouldNotRun(f"cannot set up the federation: {e}") from None

    def _topology(self) -> Path:
        self.runs += 1
        path = self.scratch / f"topology-{self.runs}.yaml"
        if self.args.transport == "tcp":
            endpoint = f"tcp://127.0.0.1:{_free_port()}"
        else:
            endpoint = f"ipc://{self.scratch}/root-{self.runs}.sock"
        write_topology(path, endpoint, self.args)
        return path

    def run(self, driver: str) -> Dict:
        args = self.args
        topology = self._topology()
        tag = f"{driver}-{self.runs}"
        common = ["--topology", str(topology), "--params", str(args.params),
                  "--join-timeout", str(args.join_timeout)]
        root_out, site_out = self.scratch / f"{tag}.root.json", self.scratch / f"{tag}.site.json"
        root_cmd = [str(self.binary), "--root", "--node", ROOT, "--seed", str(SEED),
                    "--credentials", str(self.pki / ROOT), "--out", str(root_out)] + common
        creds = ["--node", SITE, "--credentials", str(self.pki / SITE), "--out", str(site_out)]
        if driver == "cpp":
            site_cmd = [str(self.binary), "--seed", str(SEED)] + creds + common
        else:
            site_cmd = [sys.executable, os.path.abspath(__file__), "--build", str(args.build),
                        "--serve-site", driver] + creds + common
        limit = args.join_timeout + args.rounds * args.round_timeout + 30
        logs = {}
        procs = []
        try:
            for name, cmd in (("root", root_cmd), ("site", site_cmd)):
                logs[name] = open(self.scratch / f"{tag}.{name}.log", "w+")
                procs.append((name, subprocess.Popen(cmd, env=self.env, stdout=logs[name],
                                                     stderr=subprocess.STDOUT)))
            deadline = time.monotonic() + limit
            for name, p in reversed(procs):  # the site first: it finishes first
                try:
                    rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise CouldNotRun(f"{driver} run: the {name} did not finish in {limit:.0f} s")
                if rc != 0:
                    logs[name].seek(0)
                    raise CouldNotRun(f"{driver} run: the {name} exited with {rc}:\n"
                                      + logs[name].read()[-4000:])
        finally:
            for _, p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in logs.values():
                f.close()
        site = json.loads(site_out.read_text())
        site["root"] = json.loads(root_out.read_text())
        if len(site["sync_s"]) != args.rounds:
            raise CouldNotRun(f"{driver} run: {len(site['sync_s'])} syncs, expected {args.rounds}")
        root = site["root"]
        if root["rejected_frames"] or not root["security"].startswith("mtls/"):
            raise CouldNotRun(f"{driver} run: not a clean mutual-TLS federation (root: "
                              f"{root['security']}, {root['rejected_frames']} frames rejected)")
        return site


def timed_syncs(report: Dict) -> List[float]:
    """The sync times of one run that count: the first (warm-up: buffers
    touched for the first time, a cold link) is left out when two or more
    remain."""
    times = report["sync_s"]
    return times[1:] if len(times) >= 3 else times


def locate(args):
    """Imports fedwan (from <build>/python, else installed) and finds the
    C++ driver; returns (binary, env for the children)."""
    build = Path(args.build).resolve()
    py_dir = build / "python"
    if (py_dir / "fedwan").is_dir():
        sys.path.insert(0, str(py_dir))
    try:
        import fedwan
        import numpy  # noqa: F401
    except ImportError as e:
        raise CouldNotRun(f"cannot import fedwan with NumPy ({e}); build the _fedwan target "
                          f"into {py_dir} or install the package")
    if args.codec not in fedwan.codec_names():
        raise CouldNotRun(f"unknown codec '{args.codec}'; known: "
                          + ", ".join(fedwan.codec_names()))
    binary = Path(args.binary) if args.binary else build / "benchmarks" / "fedwan_site_sync"
    if not binary.is_file():
        raise CouldNotRun(f"{binary} not found; build it: cmake --build {args.build} "
                          "--target fedwan_site_sync")
    env = dict(os.environ)
    if (py_dir / "fedwan").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(
            [str(py_dir)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("FEDWAN_LOG_LEVEL", "error")
    if "site" in args.drivers:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise CouldNotRun("the 'site' driver needs torch; install it or pass "
                              "--drivers cpp,core")
    return binary, env


def measure(args) -> int:
    binary, env = locate(args)
    drivers = [d for d in DRIVERS if d in args.drivers]
    mib = args.params * 4 / 2**20
    print(f"site sync overhead: {args.params} parameters ({mib:.1f} MiB fp32), codec "
          f"{args.codec}, {args.rounds} rounds, {args.repeat} runs per driver, mutual TLS over "
          f"{args.transport} loopback, root and site one process each", flush=True)
    syncs: Dict[str, List[float]] = {d: [] for d in drivers}     # every timed sync
    run_medians: Dict[str, List[float]] = {d: [] for d in drivers}
    wire_bytes: Dict[str, List[int]] = {d: [] for d in drivers}  # per sync, both ways
    reports: List[Dict] = []
    with tempfile.TemporaryDirectory(prefix="fedwan-syncbench-") as tmp:
        fed = Federation(args, Path(tmp), binary, env)
        for rep in range(args.repeat):
            # Each driver takes each place in the order in turn, so a load
            # that drifts during a repetition favours none of them.
            order = drivers[rep % len(drivers):] + drivers[:rep % len(drivers)]
            cells = []
            for d in order:
                report = fed.run(d)
                reports.append(report)
                times = timed_syncs(report)
                syncs[d] += times
                run_medians[d].append(statistics.median(times))
                wire_bytes[d] += [s + r for s, r in zip(report["bytes_sent"],
                                                        report["bytes_received"])]
                cells.append(f"{LABELS[d]} {run_medians[d][-1]:.5f} s")
            print(f"  run {rep + 1}/{args.repeat} (median per sync): " + ", ".join(cells),
                  flush=True)
    if args.raw:
        Path(args.raw).write_text(json.dumps(reports, indent=1) + "\n")

    warmup = "; the first sync of each run left out" if args.rounds >= 3 else ""
    medians = {d: statistics.median(syncs[d]) for d in drivers}
    base = medians.get("cpp")
    print()
    print(f"{'driver':<22}{'syncs':>6}{'median s/sync':>15}{'run medians min..max':>24}"
          f"{'MB/sync':>9}{'x C++':>8}")
    for d in drivers:
        span = f"{min(run_medians[d]):.5f}..{max(run_medians[d]):.5f}"
        ratio = f"{medians[d] / base:.3f}" if base else "-"
        mb = statistics.median(wire_bytes[d]) / 1e6
        print(f"{LABELS[d]:<22}{len(syncs[d]):>6}{medians[d]:>15.5f}{span:>24}{mb:>9.2f}"
              f"{ratio:>8}")
    print(f"(median over every timed sync of the driver{warmup}; MB/sync: on the wire, "
          "sent + received)")
    if base is None or len(drivers) < 2:
        print("info: no ratio (needs the cpp driver and a Python one)")
        return 0
    ratios = {d: medians[d] / base for d in drivers if d != "cpp"}
    for d in ratios:
        paired = [p / c for p, c in zip(run_medians[d], run_medians["cpp"])]
        print(f"info: {LABELS[d]} / C++, run medians per repetition: "
              + ", ".join(f"{r:.3f}" for r in paired) + " (not gated)")
    ok = all(r <= GATE for r in ratios.values())
    detail = ", ".join(f"{LABELS[d]} {r:.3f}x" for d, r in ratios.items())
    print(f"{'PASS' if ok else 'FAIL'}: Python / C++ time per sync <= {GATE} ({detail})")
    return 0 if ok or not args.gate else 1


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Time per sync of Python-driven sites (fedwan.SiteCore, fedwan.Site) "
                    "against a C++-driven one, against the same root, in the same run.")
    p.add_argument("--params", type=int, help="model size in fp32 parameters (10000000)")
    p.add_argument("--rounds", type=int, help="rounds (syncs) per run (10)")
    p.add_argument("--repeat", type=int, help="runs per driver, taking turns (6)")
    p.add_argument("--codec", default="fp16", help="federation codec (fp16)")
    p.add_argument("--build", default="build",
                   help="build directory: <build>/python, <build>/benchmarks (build)")
    p.add_argument("--binary",
                   help="the C++ driver (<build>/benchmarks/fedwan_site_sync)")
    p.add_argument("--drivers", default=",".join(DRIVERS),
                   help="comma-separated subset of cpp,core,site (all)")
    p.add_argument("--transport", choices=("tcp", "ipc"), default="tcp",
                   help="loopback transport between root and site (tcp)")
    p.add_argument("--quick", action="store_true",
                   help="smoke settings: 100000 parameters, 2 rounds, 1 run per driver")
    p.add_argument("--raw", help="also write every run's report (JSON) to this file")
    p.add_argument("--gate", action="store_true", help="exit 1 when the ratio is over the gate")
    p.add_argument("--join-timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--round-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    # Internal: one Python site of a run (started by the harness itself).
    p.add_argument("--serve-site", choices=("core", "site"), help=argparse.SUPPRESS)
    p.add_argument("--topology", help=argparse.SUPPRESS)
    p.add_argument("--node", help=argparse.SUPPRESS)
    p.add_argument("--credentials", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    for name, full, small in (("params", 10_000_000, 100_000), ("rounds", 10, 2),
                              ("repeat", 6, 1)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    args.drivers = [d.strip() for d in args.drivers.split(",") if d.strip()]
    unknown = [d for d in args.drivers if d not in DRIVERS]
    if unknown or not args.drivers:
        p.error(f"--drivers takes a subset of {','.join(DRIVERS)}, got {unknown or 'none'}")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.serve_site:
        py_dir = Path(args.build).resolve() / "python"
        if (py_dir / "fedwan").is_dir():
            sys.path.insert(0, str(py_dir))
        return serve_site(args)
    try:
        return measure(args)
    except CouldNotRun as e:
        print(f"sync_overhead: could not run: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
