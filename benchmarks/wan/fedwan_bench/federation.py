"""Runs one federation of real `fedwan` processes, each node in its own network
namespace, every tree edge an emulated WAN link, and collects what it did:
the root's and the sites' reports, each process's CPU time and peak memory,
and the link emulator's per-link packet counters.

A flat tree measured against a tree with regions (the baselines) runs on the
same links: each region is a relay, a namespace with no process, and a site's
connection to the root crosses its site-tier link to its region's relay,
then the region's root-tier link, which the region's sites share.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Optional

from . import kernel_counters, netem, netns
from .linkemu import LinkEmulator
from .profiles import Profile

_run_counter = itertools.count()
PORT = 7000

# The runs measured against fedwan's, by the names BenchFederation gives them.
BASELINES = ("flat-fp32", "flower")
# How a fedwan federation runs its rounds (`--modes`): "blocking" (a site
# waits in sync() for the next anchor) or "overlap" (it keeps training while
# its update goes up and merges the anchor overlap_steps inner steps later).
MODES = ("blocking", "overlap")


def mode_label(overlap_steps: int) -> str:
    """What a run's rounds were: "blocking", or "overlap tau=N"."""
    return "blocking" if not overlap_steps else f"overlap tau={overlap_steps}"


# federation.streams: TCP connections per tree link, 1 to this, or AUTO.
MAX_STREAMS = 16
AUTO_STREAMS = 0  # `streams: auto`, fedwan's default: as many as pay


def parse_streams(text: str) -> int:
    """`auto` (AUTO_STREAMS) or a count, for --streams and --sweep streams=."""
    return AUTO_STREAMS if str(text).strip() == "auto" else int(text)


def streams_suffix(streams: int) -> str:
    """How a run's links are named after its mode: "" for one TCP connection
    per link, ", auto streams" for `streams: auto` (fedwan's default), else
    ", N streams"."""
    if streams == AUTO_STREAMS:
        return ", auto streams"
    return "" if streams == 1 else f", {streams} streams"


def tree_label(regions: int, sites_per_region: int, via_regions: int = 0) -> str:
    """A run's tree in words: "2x2" (2 regions of 2 sites), "flat" (every
    site its own link to the root) or "flat via 2 regions" (a flat tree
    behind the links of 2 regions, sites_per_region sites each)."""
    if regions:
        return f"{regions}x{sites_per_region}"
    if via_regions:
        return f"flat via {via_regions} region{'s' if via_regions > 1 else ''}"
    return "flat"


@dataclass(frozen=True)
class BenchFederation:
    """One federation the harness runs and measures: its tree, settings and
    baseline (not fedwan.FederationSpec, a topology's round settings)."""

    name: str  # how the report calls this run ("fedwan", "flat-fp32", ...)
    regions: int = 2  # 0: every site straight under the root (a flat tree)
    sites_per_region: int = 2
    sites: int = 0  # flat trees: how many sites (regions * sites_per_region when 0)
    codec: str = "fp16"
    rounds: int = 4
    inner_steps: int = 10
    step_time_ms: float = 50.0  # synthetic trainer: one GPU step, in wall time
    params: int = 1_000_000
    chunk_bytes: int = 1 << 20
    trainer: str = "synthetic"  # or fashion-cnn (the demo's model and data)
    seed: int = 7
    secure: bool = True  # mutual TLS (the product's default), or plaintext
    round_timeout_s: float = 600.0
    outer_optimizer: str = "fedavg"
    # Kernel settings applied in every node's namespace, ("net.ipv4.x", "v").
    sysctls: tuple = ()
    # "fedwan", or "flower": the same tree run by Flower's FedAvg (flat:
    # its server in the root's namespace), with `flower_python` (has flwr).
    system: str = "fedwan"
    flower_python: str = ""
    # The topology's federation.tcp_congestion ("" = fedwan's default, bbr;
    # "system" = the hosts' own).
    tcp_congestion: str = ""
    # The topology's federation.overlap_steps (tau): 0 = blocking rounds;
    # 1..inner_steps = a site merges the next anchor tau inner steps after it
    # sent its update, training meanwhile.
    overlap_steps: int = 0
    # The topology's federation.streams: TCP connections each child opens to
    # its parent, its frames striped over them (1 to MAX_STREAMS; above 1
    # needs the secure channel), or AUTO_STREAMS (as many as pay, fedwan's
    # default). Baselines keep one.
    streams: int = 1
    # Emulates a host where fedwan may not pick its congestion control
    # (a pod without CAP_NET_ADMIN): the host allows only reno and this one
    # (net.ipv4.tcp_allowed_congestion_control, set for the run and put
    # back after), every namespace defaults to it, and the nodes run
    # without CAP_NET_ADMIN, so setting BBR fails with EPERM. "" = off.
    unprivileged_cc: str = ""
    # Flat trees: the regions whose links the sites sit behind, as in the
    # tree with regions they are measured against (sites_per_region each):
    # a site's connection to the root crosses its site-tier link to its
    # region's relay namespace, then the region's root-tier link, shared
    # with the region's other sites. 0: every site has its own root-tier
    # link straight to the root.
    via_regions: int = 0

    def __post_init__(self) -> None:
        if self.via_regions and (not self.flat or self.sites not in (
                0, self.via_regions * self.sites_per_region)):
            raise ValueError(f"{self.name}: via_regions is for flat trees of via_regions x "
                             f"sites_per_region sites")

    @property
    def flat(self) -> bool:
        return self.regions == 0

    @property
    def mode(self) -> str:
        return mode_label(self.overlap_steps)

    def site_count(self) -> int:
        if self.flat:
            return self.sites or self.via_regions * self.sites_per_region
        return self.regions * self.sites_per_region

    def tree(self) -> str:
        return tree_label(self.regions, self.sites_per_region, self.via_regions)


@dataclass
class Node:
    id: str
    # root, region, site; or relay: a host on other nodes' paths, with a
    # namespace and links but no process (a region of a flat tree).
    role: str
    parent: Optional[str]  # the node it connects to; a relay's: the other end of its link
    address: str
    tier: Optional[str]  # the tier of its link towards the root: "site" or "root"
    # The relay its link goes to when that is not its parent (a flat tree's
    # site behind its region): its packets to the parent cross the relay's
    # link too.
    via: Optional[str] = None

    @property
    def hop(self) -> Optional[str]:
        """The host at the other end of its link towards the root."""
        return self.via or self.parent

    @property
    def runs(self) -> bool:
        """Whether a process runs in its namespace (all but relays)."""
        return self.role != "relay"


def plan_nodes(spec: BenchFederation) -> list[Node]:
    """Every host of the run: the root, the regions (a flat tree's: relays,
    `via_regions` of them) and the sites, with the same names and addresses
    in a tree with regions and in a flat tree over its links."""
    nodes = [Node("root", "root", None, "10.77.0.1", None)]
    if spec.flat and not spec.via_regions:
        for s in range(spec.site_count()):
            nodes.append(Node(f"site-{s}", "site", "root", f"10.77.2.{s + 1}", "root"))
        return nodes
    for r in range(spec.via_regions if spec.flat else spec.regions):
        region = f"region-{r}"
        nodes.append(Node(region, "relay" if spec.flat else "region", "root",
                          f"10.77.1.{r + 1}", "root"))
        for k in range(spec.sites_per_region):
            s = r * spec.sites_per_region + k
            if spec.flat:
                nodes.append(Node(f"site-{s}", "site", "root", f"10.77.2.{s + 1}", "site",
                                  via=region))
            else:
                nodes.append(Node(f"site-{s}", "site", region, f"10.77.2.{s + 1}", "site"))
    return nodes


def topology_yaml(spec: BenchFederation, nodes: list[Node]) -> str:
    lines = [
        "job: fedwan-bench",
        "federation:",
        f"  rounds: {spec.rounds}",
        f"  inner_steps: {spec.inner_steps}",
        f"  codec: {spec.codec}",
        f"  chunk_bytes: {spec.chunk_bytes}",
        f"  round_timeout_s: {spec.round_timeout_s}",
        f"  outer_optimizer: {{name: {spec.outer_optimizer}}}",
    ]
    if spec.tcp_congestion:
        lines.append(f"  tcp_congestion: {spec.tcp_congestion}")
    if spec.overlap_steps:
        lines.append(f"  overlap_steps: {spec.overlap_steps}")
    if spec.streams != AUTO_STREAMS:
        lines.append(f"  streams: {spec.streams}")
    lines += [
        "nodes:",
    ]
    for n in nodes:
        if not n.runs:
            continue
        fields = [f"id: {n.id}", f"role: {n.role}"]
        if n.parent:
            fields.append(f"parent: {n.parent}")
        if n.role != "site":
            fields.append(f'endpoint: "tcp://{n.address}:{PORT}"')
        lines.append("  - {" + ", ".join(fields) + "}")
    return "\n".join(lines) + "\n"


def emulator_config(nodes: list[Node], namespaces: dict[str, netns.Namespace],
                    profile: Profile, seed: int) -> dict:
    """fedwan-linkemu's configuration: every node a host, relays included;
    per node with a parent, a link of its tier to the next host towards the
    root; per node behind a relay, a path to its parent through it (one
    entry: the emulator takes the way back over the same hops)."""
    links = []
    for n in nodes:
        if n.parent is None:
            continue
        link = profile.root_link if n.tier == "root" else profile.site_link
        links.append({"a": n.id, "b": n.hop, "profile": link.emulator_profile()})
    config = {"hosts": [{"name": n.id, "netns": namespaces[n.id].name, "address": n.address}
                        for n in nodes],
              "links": links}
    paths = [{"from": n.id, "to": n.parent, "via": [n.via]} for n in nodes if n.via]
    if paths:
        config["paths"] = paths
    config["seed"] = seed
    return config


FLOWER_PORT = 8080


def _flower_argv(spec: BenchFederation, node: Node, work: str) -> list[str]:
    argv = [spec.flower_python, "-m", "fedwan_bench.flower_node",
            "server" if node.role == "root" else "client",
            "--address", f"10.77.0.1:{FLOWER_PORT}", "--params", str(spec.params),
            "--seed", str(spec.seed)]
    if node.role == "root":
        return argv + ["--clients", str(spec.site_count()), "--rounds", str(spec.rounds),
                       "--report", os.path.join(work, "root-report.json")]
    return argv + ["--site", node.id.split("-")[1], "--inner-steps", str(spec.inner_steps),
                   "--step-time-ms", str(spec.step_time_ms),
                   "--report", os.path.join(work, f"{node.id}-report.json")]


ALLOWED_CC = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"


def _write_allowed_congestion(value: str) -> None:
    with open(ALLOWED_CC, "w") as f:
        f.write(value + "\n")


def _restrict_congestion(cc: str) -> str | None:
    """With `cc`, allows only reno and `cc` host-wide (a namespace may only
    default to an allowed algorithm, and that list is the host's) and
    returns what was allowed before, for the caller to put back."""
    if not cc:
        return None
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        if cc not in f.read().split():
            raise RuntimeError(f"unprivileged_cc {cc}: the kernel does not have it")
    with open(ALLOWED_CC) as f:
        before = f.read().strip()
    _write_allowed_congestion(f"reno {cc}")
    return before


def _program(fedwan: str, node: Node, spec: BenchFederation) -> str:
    """fedwan-aggregator (no LibTorch) beside `fedwan` for a synthetic run's
    aggregators: their memory is then their model's, not LibTorch's too."""
    if node.role == "site" or spec.trainer != "synthetic":
        return fedwan
    torch_free = os.path.join(os.path.dirname(fedwan), "fedwan-aggregator")
    return torch_free if os.access(torch_free, os.X_OK) else fedwan


def _node_argv(spec: BenchFederation, node: Node, fedwan: str, work: str) -> list[str]:
    if spec.system == "flower":
        return _flower_argv(spec, node, work)
    command = "site" if node.role == "site" else "aggregator"
    # Without CAP_NET_ADMIN a process may only pick an allowed algorithm.
    argv = (["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin"]
            if spec.unprivileged_cc else [])
    argv += [_program(fedwan, node, spec), command, "--topology", os.path.join(work, "topology.yaml"),
            "--node", node.id, "--trainer", spec.trainer, "--seed", str(spec.seed),
            "--join-timeout", "120"]
    if spec.trainer == "synthetic":
        argv += ["--synthetic-size", str(spec.params)]
    if spec.secure:
        argv += ["--credentials", os.path.join(work, "pki", node.id)]
    else:
        argv += ["--insecure-plaintext"]
    if node.role == "root":
        argv += ["--report", os.path.join(work, "root-report.json")]
        if spec.trainer == "fashion-cnn":
            argv += ["--eval"]
    if node.role == "site":
        argv += ["--report", os.path.join(work, f"{node.id}-report.json")]
        if spec.trainer == "synthetic":
            argv += ["--step-time-ms", str(spec.step_time_ms)]
    return argv


def _rusage_wait(procs: dict[str, subprocess.Popen], timeout: float) -> dict[str, dict]:
    """Waits for every process (or the timeout) and returns each one's exit
    status, CPU seconds and peak RSS, from wait4()."""
    done: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(procs):
        for name, p in procs.items():
            if name in done:
                continue
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == 0:
                continue
            p.returncode = os.waitstatus_to_exitcode(status)
            done[name] = {"exit": p.returncode, "cpu_s": ru.ru_utime + ru.ru_stime,
                          "peak_rss_mb": ru.ru_maxrss / 1024, "ended": time.monotonic()}
        if len(done) == len(procs):
            break
        if time.monotonic() > deadline:
            for name, p in procs.items():
                if name not in done:
                    p.kill()
            raise TimeoutError(f"nodes still running after {timeout:.0f} s: "
                               f"{', '.join(sorted(set(procs) - set(done)))}")
        time.sleep(0.05)
    return done


class CpuSampler:
    """Samples the whole machine's CPU use (/proc/stat) every `period` s in a
    thread, so a report can say whether the CPU rather than the links was
    the limit while a federation ran."""

    def __init__(self, emulator_pid: Optional[int], period: float = 0.25):
        import threading
        self.period = period
        self.pid = emulator_pid
        # (Unix time, machine busy share, emulator's share of one core)
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def _process_ticks(self) -> int:
        if self.pid is None:  # netem: no emulator process
            return 0
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            return 0

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        busy0, total0 = self._read()
        proc0, t0 = self._process_ticks(), time.monotonic()
        while not self._stop.wait(self.period):
            busy, total = self._read()
            proc, t = self._process_ticks(), time.monotonic()
            if total > total0 and t > t0:
                self.samples.append((time.time(), (busy - busy0) / (total - total0),
                                     (proc - proc0) / tick / (t - t0)))
            busy0, total0, proc0, t0 = busy, total, proc, t

    def stop(self) -> list[tuple[float, float, float]]:
        self._stop.set()
        self._thread.join()
        return self.samples


class NodeFailed(RuntimeError):
    """A node of the federation exited with an error; `usage` has every
    node's exit status, CPU time and peak RSS."""

    def __init__(self, message: str, usage: dict):
        super().__init__(message)
        self.usage = usage


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def run(spec: BenchFederation, profile: Profile, fedwan: str, linkemu: str, work: str,
        timeout: float = 1800.0, kernel_period: float = 1.0, shaper: str = "linkemu") -> dict:
    """Runs the federation under `profile` and returns its raw record (what
    metrics.summarise() reads). Raises RuntimeError with the failing node's
    log tail when a node fails. `kernel_period`: seconds between samples of
    the kernel's per-socket counters (kernel_counters; 0: none). `shaper`:
    "linkemu" (the userspace emulator, the `linkemu` binary) or "netem"
    (netem.py; the caller has checked that the kernel has it)."""
    os.makedirs(work, exist_ok=True)
    nodes = plan_nodes(spec)
    with open(os.path.join(work, "topology.yaml"), "w") as f:
        f.write(topology_yaml(spec, nodes))
    if spec.secure and spec.system == "fedwan":
        subprocess.run([fedwan, "certs", "init", "--topology", os.path.join(work, "topology.yaml"),
                        "--out", os.path.join(work, "pki"), "--force"],
                       check=True, capture_output=True)
    tag = f"fwb-{os.getpid() % 100000}-{next(_run_counter)}"
    namespaces: dict[str, netns.Namespace] = {}
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, str] = {}
    allowed = _restrict_congestion(spec.unprivileged_cc)
    try:
        for k, n in enumerate(nodes):
            namespaces[n.id] = netns.Namespace(f"{tag}-{k}")
            sysctls = list(spec.sysctls)
            if spec.unprivileged_cc:
                sysctls.insert(0, ("net.ipv4.tcp_congestion_control", spec.unprivileged_cc))
            for key, value in sysctls:
                r = namespaces[n.id].run(["sysctl", "-q", "-w", f"{key}={value}"],
                                         capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError(f"sysctl {key}={value}: {r.stderr.strip()}")
        if shaper == "netem":
            emulator = netem.NetemLinks(nodes, {k: v.name for k, v in namespaces.items()},
                                        profile, work)
        else:
            emulator = LinkEmulator(linkemu, emulator_config(nodes, namespaces, profile,
                                                             spec.seed), work)
        env = dict(os.environ, FEDWAN_LOG_LEVEL=os.environ.get("FEDWAN_LOG_LEVEL", "warn"))
        if spec.system == "flower":  # flower_node is a module of this package
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        # With netem no emulator counts the payload: the kernel's counters
        # at both ends of each edge do.
        kernel = kernel_counters.Sampler(
            kernel_counters.watches_for(nodes, {k: v.name for k, v in namespaces.items()},
                                        both_ends=shaper == "netem"),
            period=kernel_period)
        started = time.monotonic()
        sampler = CpuSampler(emulator.proc.pid if emulator.proc else None)
        try:
            # Parents first: children retry until their parent binds. Relays
            # run nothing.
            for n in [n for n in nodes if n.runs]:
                logs[n.id] = os.path.join(work, f"{n.id}.log")
                with open(logs[n.id], "w") as log:
                    procs[n.id] = namespaces[n.id].popen(_node_argv(spec, n, fedwan, work),
                                                         stdout=log, stderr=subprocess.STDOUT,
                                                         env=env)
            usage = _rusage_wait(procs, timeout)
            wall = max(u["ended"] for u in usage.values()) - started
            emulator_cpu = emulator.cpu_seconds()
        finally:
            kernel_record = kernel.stop()
            stats = emulator.stop()
            cpu_samples = sampler.stop()
    finally:
        for p in procs.values():
            if p.returncode is None:
                p.kill()
                p.wait()
        for ns in namespaces.values():
            ns.close()
        if allowed is not None:
            _write_allowed_congestion(allowed)
    failed = [n for n in nodes if n.runs and usage[n.id]["exit"] != 0]
    if failed:
        n = failed[0]
        u = usage[n.id]
        why = f"exited {u['exit']}"
        if u["exit"] == -9:
            why = (f"was killed (SIGKILL) at {u['peak_rss_mb']:.0f} MB peak RSS: out of memory? "
                   f"(dmesg says)")
        raise NodeFailed(f"{spec.name}: node {n.id} {why}:\n{_tail(logs[n.id])}", usage)
    with open(os.path.join(work, "root-report.json")) as f:
        root_report = json.load(f)
    site_reports = {}
    for n in nodes:
        if n.role == "site":
            with open(os.path.join(work, f"{n.id}-report.json")) as f:
                site_reports[n.id] = json.load(f)
    return {"spec": asdict(spec), "profile": profile.to_json(),
            "nodes": [asdict(n) for n in nodes], "usage": usage, "wall_s": wall,
            "cpu_samples": cpu_samples,
            "root_report": root_report, "site_reports": site_reports,
            "kernel": kernel_record if kernel_period > 0 else None,
            "emulator": {"stats": stats, "cpu_s": emulator_cpu, "method": emulator.method,
                         "kind": shaper}}
