"""The netem back end: every edge of the tree a veth pair between the two
nodes' namespaces, each end shaping what it sends with the kernel's netem
qdisc (delay, jitter, loss, duplication, reordering, rate), for kernels
that have it. The alternative, and the only one on kernels without netem,
is the userspace emulator (linkemu.py).

Per edge, child C (address c) under parent P (address p):

    ip -n P link add wan-C type veth peer name wan-up netns C
    ip -n C addr add c peer p/32 dev wan-up      # and p peer c/32 on wan-C
    ip -n C link set dev wan-up gso_max_segs 1   # one packet per skb (both ends)
    ip -n C link set dev wan-up up
    tc -n C qdisc add dev wan-up root netem limit L delay D [J] [loss X%]
        [duplicate X%] [reorder X%] [rate Rmbit]   # and the same on wan-C

so a node's address sits on each of its veths with a host route to the
peer at the other end. A site behind a relay R (address r; a flat tree's
region, no process) has its edge to R instead of its parent P, and

    ip netns exec R sysctl -q -w net.ipv4.ip_forward=1   # once per relay
    ip -n C route add p/32 via r dev wan-up
    ip -n P route add c/32 via r dev wan-R

carry its packets to P and back through R, over R's edge to P, which the
relay's sites share. `gso_max_segs 1` keeps TCP from handing netem 64 kB
segments, which it would delay, rate and drop as one packet. The queue
limit L covers the packets the link holds in flight over its delay and
jitter plus a bottleneck queue of one round trip's bandwidth-delay product,
at least 64 packets: the emulator's default queue.

Counters: `ip -s link` on each end (the packets and bytes netem passed, the
Ethernet header of each less) and `tc -s qdisc` (what it dropped, loss and
full queue together); the TCP payload comes from the kernel's per-socket
counters (kernel_counters), read at both ends.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import zlib
from typing import Callable, Optional, Sequence

from .profiles import Link, Profile

METHOD = "netem (kernel qdisc, one veth pair per tree edge)"
ETHERNET_HEADER = 14
MIN_QUEUE_PACKETS = 64
PACKET_BITS = 1500 * 8

Runner = Callable[[list], subprocess.CompletedProcess]


def run_command(argv: list) -> subprocess.CompletedProcess:
    """Runs argv; a missing program reads as exit status 127."""
    try:
        return subprocess.run(argv, capture_output=True, text=True)
    except OSError as e:
        return subprocess.CompletedProcess(argv, 127, "", str(e))


def tools() -> tuple[str, str]:
    """The ip and tc programs (full paths where found)."""
    from .netns import ip_tool
    tc = shutil.which("tc") or next(
        (p for p in ("/usr/sbin/tc", "/sbin/tc") if os.access(p, os.X_OK)), "tc")
    return ip_tool() or "ip", tc


def _num(x: float) -> str:
    return f"{x:g}"


def queue_limit(link: Link) -> int:
    """netem's `limit`, in packets: what the link holds over its delay and
    jitter at its rate, plus a bottleneck queue of one round trip's
    bandwidth-delay product, at least 64 packets (the emulator's default
    queue). An unlimited rate: 1000, netem's default."""
    if link.rate_mbit <= 0:
        return 1000
    per_ms = link.rate_mbit * 1e3 / PACKET_BITS  # packets per millisecond
    in_flight = per_ms * (link.delay_ms + link.jitter_ms)
    queue = max(MIN_QUEUE_PACKETS, per_ms * 2 * link.delay_ms)
    return math.ceil(round(in_flight + queue, 6))  # 2000.0000000002 is 2000


def netem_args(link: Link) -> list[str]:
    """The netem options for one direction of `link`."""
    args = ["limit", str(queue_limit(link)), "delay", f"{_num(link.delay_ms)}ms"]
    if link.jitter_ms:
        args.append(f"{_num(link.jitter_ms)}ms")
    for key, value in (("loss", link.loss_percent), ("duplicate", link.duplicate_percent),
                       ("reorder", link.reorder_percent)):
        if value:
            args += [key, f"{_num(value)}%"]
    if link.rate_mbit > 0:
        args += ["rate", f"{_num(link.rate_mbit)}mbit"]
    return args


def device(child: str) -> str:
    """The parent's end of the edge to `child` (at most 15 characters)."""
    name = f"wan-{child}"
    if len(name) > 15:
        name = f"wan-{zlib.crc32(child.encode()) % 10**9}"
    return name


UP = "wan-up"  # the child's end: its link to its parent


def edge_commands(nodes: Sequence, namespaces: dict[str, str], profile: Profile,
                  ip: str = "ip", tc: str = "tc") -> list[list[str]]:
    """The commands that build the tree: per edge (federation.Node with a
    parent, in order, to the next host towards the root: its `hop`) the veth
    pair, the addresses, the devices up and the netem qdisc of each end;
    then relay_commands()."""
    address = {n.id: n.address for n in nodes}
    out: list[list[str]] = []
    for n in nodes:
        if not n.parent:
            continue
        link = profile.root_link if n.tier == "root" else profile.site_link
        c, p = namespaces[n.id], namespaces[n.hop]
        down = device(n.id)
        out.append([ip, "-n", p, "link", "add", down, "type", "veth", "peer", "name", UP,
                    "netns", c])
        for ns, dev, mine, theirs in ((c, UP, n.address, address[n.hop]),
                                      (p, down, address[n.hop], n.address)):
            out.append([ip, "-n", ns, "addr", "add", mine, "peer", f"{theirs}/32", "dev", dev])
            out.append([ip, "-n", ns, "link", "set", "dev", dev, "gso_max_segs", "1"])
            out.append([ip, "-n", ns, "link", "set", "dev", dev, "up"])
        for ns, dev in ((c, UP), (p, down)):
            out.append([tc, "-n", ns, "qdisc", "add", "dev", dev, "root", "netem",
                        *netem_args(link)])
    return out + relay_commands(nodes, namespaces, ip)


def relay_commands(nodes: Sequence, namespaces: dict[str, str],
                   ip: str = "ip") -> list[list[str]]:
    """What carries a node's packets through the relay it sits behind (its
    `via`) to its parent and back, once the edges are up: forwarding on in
    each relay's namespace, and per such node a host route to its parent
    through the relay at the node and one back to it through the relay at
    the parent. None for a tree without relays."""
    address = {n.id: n.address for n in nodes}
    out: list[list[str]] = []
    for r in nodes:
        if r.runs:
            continue
        out.append([ip, "netns", "exec", namespaces[r.id], "sysctl", "-q", "-w",
                    "net.ipv4.ip_forward=1"])
    for n in nodes:
        if not n.via:
            continue
        relay = address[n.via]
        out.append([ip, "-n", namespaces[n.id], "route", "add", f"{address[n.parent]}/32",
                    "via", relay, "dev", UP])
        out.append([ip, "-n", namespaces[n.parent], "route", "add", f"{n.address}/32",
                    "via", relay, "dev", device(n.via)])
    return out


def probe(runner: Runner = run_command, ip: str = "ip", tc: str = "tc",
          tag: str = "") -> Optional[str]:
    """None when this kernel can run netem, else why not: adds a netem qdisc
    to a throw-away veth in a temporary namespace, and deletes it."""
    name = f"fwb-netem-probe{tag or os.getpid()}"
    r = runner([ip, "netns", "add", name])
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    try:
        r = runner([ip, "-n", name, "link", "add", "probe0", "type", "veth", "peer", "name",
                    "probe1"])
        if r.returncode != 0:
            return f"cannot create a veth pair: {r.stderr.strip()}"
        r = runner([tc, "-n", name, "qdisc", "add", "dev", "probe0", "root", "netem", "delay",
                    "1ms"])
        if r.returncode == 127:
            return "no tc (iproute2)"
        if r.returncode != 0:
            return f"this kernel has no netem qdisc (tc: {r.stderr.strip() or 'failed'})"
        return None
    finally:
        runner([ip, "netns", "del", name])


SHAPERS = ("auto", "linkemu", "netem")


def choose(asked: str, runner: Runner = run_command) -> tuple[str, Optional[str]]:
    """The shaper to use for `--shaper asked` and, when netem cannot run
    here, why: (kind, reason). auto: netem where the kernel has it, else
    linkemu; netem: the caller refuses to start when reason is set."""
    if asked not in SHAPERS:
        raise ValueError(f"--shaper {asked}: one of {', '.join(SHAPERS)}")
    if asked == "linkemu":
        return "linkemu", None
    ip, tc = tools()
    why = probe(runner, ip, tc)
    if asked == "netem":
        return "netem", why
    return ("linkemu", why) if why else ("netem", None)


def unavailable_message(why: str) -> str:
    return f"--shaper netem: {why}; use --shaper linkemu (the userspace emulator)"


def add_shaper_flag(p) -> None:
    p.add_argument("--shaper", choices=SHAPERS, default="auto",
                   help="how links are emulated: netem (the kernel's qdisc on veth pairs), "
                        "linkemu (the userspace emulator), auto (default: netem where the "
                        "kernel has it, else linkemu)")


def pick(asked: str, prog: str = "fedwan bench", runner: Runner = run_command) -> Optional[str]:
    """The shaper for --shaper `asked`; None, after saying why, when netem
    was asked for and this kernel cannot run it (nothing has started)."""
    kind, why = choose(asked, runner)
    if kind == "netem" and why:
        print(f"{prog}: cannot run here: {unavailable_message(why)}", file=sys.stderr)
        return None
    if asked == "auto":
        print(f"{prog}: shaping with {kind}" + (f" ({why})" if why else ""), flush=True)
    return kind


def _json(r: subprocess.CompletedProcess):
    try:
        return json.loads(r.stdout) if r.returncode == 0 else None
    except ValueError:
        return None


def direction_counters(link_json, qdisc_json) -> dict:
    """One end's counters, in the emulator's shape: what netem passed
    (`ip -s -j link show dev D`: packets, IP bytes) and dropped (`tc -s -j
    qdisc show dev D`); the TCP fields are left to the kernel's counters."""
    tx = {}
    if link_json:
        tx = (link_json[0].get("stats64") or link_json[0].get("stats") or {}).get("tx", {})
    drops = None
    for q in qdisc_json or []:
        if q.get("kind") == "netem":
            drops = q.get("drops")
    packets = tx.get("packets")
    return {"packets": packets,
            "bytes": tx["bytes"] - ETHERNET_HEADER * packets if packets is not None else None,
            "tcp_payload_bytes": None, "tcp_new_payload_bytes": None,
            "tcp_retransmitted_bytes": None, "lost_packets": None, "queue_drop_packets": None,
            "dropped_packets": drops}


class NetemLinks:
    """Builds the tree's veth pairs and netem qdiscs (see the module's
    docstring); stop() reads their counters, in the shape of the emulator's
    statistics. The pairs go with the namespaces."""

    method = METHOD
    proc = None  # no process: the kernel does the work

    def __init__(self, nodes: Sequence, namespaces: dict[str, str], profile: Profile,
                 workdir: str, runner: Runner = run_command):
        self.nodes = [n for n in nodes if n.parent]
        self.namespaces = namespaces
        self.runner = runner
        self.ip, self.tc = tools()
        commands = edge_commands(nodes, namespaces, profile, self.ip, self.tc)
        with open(os.path.join(workdir, "netem.sh"), "w") as f:
            f.write("".join(" ".join(c) + "\n" for c in commands))
        for argv in commands:
            r = runner(argv)
            if r.returncode != 0:
                raise RuntimeError(f"netem: {' '.join(argv)}: {r.stderr.strip()}")

    def cpu_seconds(self) -> float:
        return 0.0

    def _end(self, namespace: str, dev: str) -> dict:
        link = _json(self.runner([self.ip, "-n", namespace, "-s", "-j", "link", "show", "dev",
                                  dev]))
        qdisc = _json(self.runner([self.tc, "-n", namespace, "-s", "-j", "qdisc", "show", "dev",
                                   dev]))
        return direction_counters(link, qdisc)

    def stop(self) -> dict:
        links = []
        for n in self.nodes:
            links.append({"a": n.id, "b": n.hop,
                          "a_to_b": {"counters": self._end(self.namespaces[n.id], UP)},
                          "b_to_a": {"counters": self._end(self.namespaces[n.hop],
                                                           device(n.id))}})
        return {"links": links, "source": "ip -s link (IP bytes netem passed), tc -s qdisc "
                                          "(drops); TCP payload from ss"}

    def __enter__(self) -> "NetemLinks":
        return self

    def __exit__(self, *exc) -> None:
        pass
