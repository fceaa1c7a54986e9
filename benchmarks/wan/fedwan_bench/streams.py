"""`fedwan bench streams`: how many parallel TCP connections one emulated WAN
link wants. Over a single link of a profile (its root tier, or custom
flags), bulk transfers from one namespace to another with 1, 2, 4, ...
parallel streams under each congestion control, each for a fixed time; per
case the goodput against the shaped rate, what was retransmitted, what the
link dropped, how evenly the streams shared it and their round-trip time.

    fedwan bench streams --profile intercontinental --streams 1,2,4 --cc bbr,cubic
    fedwan bench streams --quick          # seconds: proves the probe works
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import threading
import time
from typing import Optional

from . import kernel_counters, netns, profiles
from .federation import CpuSampler
from .host import SKIP, find_tool, machine

PORT = 5301
MSS = 1448  # TCP payload of a 1500-byte packet with timestamps
SENDER, RECEIVER = "10.76.0.1", "10.76.0.2"
CPU_BOUND_SHARE = 0.9  # as metrics.py: above it the machine, not the link, set the pace


def add_parser(sub) -> None:
    p = sub.add_parser("streams", help="goodput of 1, 2, 4, ... parallel TCP streams over one "
                                       "emulated WAN link, per congestion control")
    p.add_argument("--profile", default="intercontinental",
                   help="its root tier is the link: lan, cross-region, intercontinental "
                        "(default), degraded, custom")
    p.add_argument("--rate-mbit", type=float, help="custom: the link's rate")
    p.add_argument("--delay-ms", type=float, help="custom: one-way delay")
    p.add_argument("--jitter-ms", type=float, help="custom: jitter")
    p.add_argument("--loss-percent", type=float, help="custom: loss")
    p.add_argument("--streams", default="1,2,4", metavar="N,...",
                   help="parallel TCP connections per case (default 1,2,4)")
    p.add_argument("--cc", default="bbr,cubic", metavar="CC,...",
                   help="congestion controls, set per socket (TCP_CONGESTION; default bbr,cubic)")
    p.add_argument("--seconds", type=float, default=10.0, help="each case's transfer (default 10)")
    p.add_argument("--quick", action="store_true",
                   help="a few seconds: 1 and 2 streams, bbr and cubic, 1 s each")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default="bench-streams", help="directory for streams.json, .md, .png")
    p.add_argument("--no-plots", action="store_true", help="write no PNG chart")
    p.add_argument("--linkemu", help="the fedwan-linkemu binary")
    from .netem import add_shaper_flag
    add_shaper_flag(p)
    p.set_defaults(func=cmd_streams)


def parse_list(text: str, kind, what: str) -> list:
    """'1,2,4' -> [1, 2, 4]: distinct, in the order given."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            value = kind(item)
        except ValueError:
            raise SystemExit(f"fedwan bench streams: {what} {text!r}: '{item}' is not valid") \
                from None
        if value not in out:
            out.append(value)
    if not out:
        raise SystemExit(f"fedwan bench streams: {what} is empty")
    return out


def plan(args: argparse.Namespace) -> tuple[profiles.Link, str, list[tuple[str, int]]]:
    """The link, its profile's name and the cases, (cc, streams), checked
    before anything starts."""
    if args.quick:
        args.streams, args.cc, args.seconds = "1,2", "bbr,cubic", 1.0
    try:
        base = profiles.named(args.profile) if args.profile != "custom" else None
        profile = profiles.custom(base, rate_mbit=args.rate_mbit, delay_ms=args.delay_ms,
                                  jitter_ms=args.jitter_ms, loss_percent=args.loss_percent)
    except ValueError as e:
        raise SystemExit(f"fedwan bench streams: {e}") from None
    counts = parse_list(args.streams, int, "--streams")
    if any(not 1 <= n <= 64 for n in counts):
        raise SystemExit(f"fedwan bench streams: --streams {args.streams}: 1 to 64 each")
    ccs = parse_list(args.cc, str, "--cc")
    if not args.seconds > 0:
        raise SystemExit("fedwan bench streams: --seconds must be positive")
    return profile.root_link, profile.name, [(cc, n) for cc in ccs for n in counts]


def check_congestion_controls(ccs: list[str]) -> Optional[str]:
    """None when every socket can be given each of `ccs`, else why not."""
    for cc in ccs:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        except OSError as e:
            try:
                with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
                    have = f.read().strip()
            except OSError:
                have = "unknown"
            return f"--cc {cc}: {e.strerror} (this kernel has: {have})"
        finally:
            s.close()
    return None


def jain(values: list[float]) -> Optional[float]:
    """Jain's fairness index: 1 when every stream got the same, 1/n when one
    got everything."""
    total = sum(values)
    if not values or total <= 0:
        return None
    return total * total / (len(values) * sum(v * v for v in values))


def summarise_case(cc: str, streams: int, seconds: float, link: dict, per_stream: list[int],
                   series: list[tuple[float, int]], counters: Optional[dict],
                   kernel: list[dict], busy: Optional[float], emulator_busy: Optional[float]
                   ) -> dict:
    """One case's figures from what was measured: the bytes each stream
    delivered in the window, the received total over time [(s, bytes)],
    the link's counters for the sender's direction (linkemu's shape, or
    None) and the sender's sockets as `ss` read them at the end."""
    received = sum(per_stream)
    goodput = received * 8 / seconds / 1e6
    steady = None
    half = [p for p in series if p[0] >= seconds / 2]
    if len(half) >= 2 and half[-1][0] > half[0][0]:
        steady = (half[-1][1] - half[0][1]) * 8 / (half[-1][0] - half[0][0]) / 1e6
    rate = link.get("rate_mbit") or 0
    c = counters or {}
    sent = sum(k["bytes_sent"] for k in kernel)
    retrans = sum(k["bytes_retrans"] for k in kernel)
    rtts = [k["rtt_ms"] for k in kernel if k.get("rtt_ms") is not None]
    packets = c.get("packets")
    dropped = c.get("dropped_packets")
    if dropped is None and c.get("lost_packets") is not None:
        dropped = c["lost_packets"] + c["queue_drop_packets"]
    return {
        "cc": cc, "streams": streams, "seconds": seconds,
        "received_bytes": received, "per_stream_bytes": per_stream,
        "goodput_mbit": goodput, "steady_mbit": steady,
        # Payload to IP bytes at full-size segments: 1.0 is the link full.
        "share_of_rate": goodput * 1500 / MSS / rate if rate else None,
        "steady_share_of_rate": steady * 1500 / MSS / rate if rate and steady else None,
        "fairness": jain([float(x) for x in per_stream]),
        "kernel_bytes_sent": sent, "kernel_bytes_retrans": retrans,
        "kernel_retrans_share": retrans / sent if sent else None,
        "rtt_ms_mean": sum(rtts) / len(rtts) if rtts else None,
        "emulator_retransmitted_bytes": c.get("tcp_retransmitted_bytes"),
        "emulator_new_payload_bytes": c.get("tcp_new_payload_bytes"),
        "lost_packets": c.get("lost_packets"), "queue_drop_packets": c.get("queue_drop_packets"),
        "dropped_packets": dropped, "packets": packets,
        # linkemu counts the packets offered to the link, netem those it passed.
        "drop_share": dropped / packets if packets and dropped is not None else None,
        "machine_busy": busy, "emulator_busy": emulator_busy,
        "cpu_bound": any(b is not None and b > CPU_BOUND_SHARE for b in (busy, emulator_busy)),
    }


def _fmt(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def drops(c: dict) -> str:
    """'96 + 234' (the emulator: loss model + full queue), '330' (netem
    counts them together), '-' (not counted)."""
    if c.get("lost_packets") is not None:
        return f"{c['lost_packets']} + {c['queue_drop_packets']}"
    return _fmt(c.get("dropped_packets"), "d")


def markdown(doc: dict) -> str:
    link = doc["link"]
    lines = [
        f"# fedwan bench streams: {doc['profile']}",
        "",
        f"Link: {link['text']}, one way; sender -> receiver, {doc['seconds']:g} s per case. "
        f"Shaping: {doc['shaping']}. Machine: {doc['machine']['cores']} cores, kernel "
        f"{doc['machine']['kernel']}; tcp_wmem {doc['machine'].get('tcp_wmem', '?')}, "
        f"tcp_rmem {doc['machine'].get('tcp_rmem', '?')}.",
        "",
        "| cc | streams | goodput Mbit/s | share of rate | steady share | retrans % "
        "| drops (loss + queue) | fairness | RTT ms | busy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cases"]:
        busy = _fmt(c["machine_busy"], ".2f") + " / " + _fmt(c["emulator_busy"], ".2f") + \
            (" CPU-bound" if c["cpu_bound"] else "")
        retrans = None if c["kernel_retrans_share"] is None else 100 * c["kernel_retrans_share"]
        lines.append(
            f"| {c['cc']} | {c['streams']} | {_fmt(c['goodput_mbit'], '.1f')} "
            f"| {_fmt(c['share_of_rate'], '.2f')} | {_fmt(c['steady_share_of_rate'], '.2f')} "
            f"| {_fmt(retrans, '.2f')} | {drops(c)} | {_fmt(c['fairness'], '.3f')} "
            f"| {_fmt(c['rtt_ms_mean'], '.1f')} | {busy} |")
    lines += ["", "goodput = payload received in the window / its length; share of rate = "
              "goodput x 1500/1448 (TCP/IP headers of full segments) / the shaped rate; steady = "
              "over the window's second half; retrans % = bytes_retrans / bytes_sent of the "
              "sender's sockets (ss, at the end); drops = packets the link's loss model + its "
              "full queue dropped on the way there (netem: both together); fairness = Jain's "
              "index of the streams' bytes; RTT = the sockets' smoothed RTT at the end "
              "(queueing included); busy = the machine's CPU busy share / the emulator's share "
              "of its core (netem: none)."]
    return "\n".join(lines) + "\n"


def plot(doc: dict, out_dir: str) -> str:
    """Grouped bars: share of the rate per stream count, one bar per cc."""
    from .plots import _pyplot, _save
    plt = _pyplot()
    ccs = list(dict.fromkeys(c["cc"] for c in doc["cases"]))
    counts = list(dict.fromkeys(c["streams"] for c in doc["cases"]))
    width = 0.8 / len(ccs)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, cc in enumerate(ccs):
        by_n = {c["streams"]: c for c in doc["cases"] if c["cc"] == cc}
        ys = [(by_n[n]["share_of_rate"] if n in by_n else None) or 0 for n in counts]
        ax.bar([k + (i - (len(ccs) - 1) / 2) * width for k in range(len(counts))], ys, width,
               label=cc)
    ax.set_xticks(range(len(counts)))
    ax.set_xticklabels([str(n) for n in counts])
    ax.set_xlabel("parallel TCP streams")
    ax.set_ylabel("goodput / shaped rate")
    ax.set_ylim(0, 1.1)
    ax.set_title(f"{doc['link']['text']} ({doc['seconds']:g} s per case)")
    ax.legend()
    return _save(fig, out_dir, "streams.png", plt)


class Sink:
    """Accepts connections in the receiver's namespace and counts, per
    connection, the bytes received."""

    def __init__(self, ns: netns.Namespace):
        self.listener = ns.inside(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("0.0.0.0", PORT))
        self.listener.listen(64)
        self.lock = threading.Lock()
        self.counts: dict[int, int] = {}  # the sender's port -> bytes
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, peer = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.counts[peer[1]] = 0
                self.conns.append(c)
            threading.Thread(target=self._drain, args=(c, peer[1]), daemon=True).start()

    def _drain(self, c: socket.socket, port: int) -> None:
        buf = bytearray(1 << 20)
        while True:
            try:
                n = c.recv_into(buf)
            except OSError:
                return
            if not n:
                return
            with self.lock:
                self.counts[port] += n

    def accepted(self, ports: list[int]) -> bool:
        with self.lock:
            return all(p in self.counts for p in ports)

    def total(self, ports: list[int]) -> list[int]:
        with self.lock:
            return [self.counts.get(p, 0) for p in ports]

    def drop_all(self) -> None:
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            c.close()

    def close(self) -> None:
        self.listener.close()
        self.drop_all()


def _sender(s: socket.socket, stop: threading.Event) -> None:
    data = memoryview(b"\x5a" * (1 << 20))
    while not stop.is_set():
        try:
            s.send(data)
        except socket.timeout:
            continue
        except OSError:
            return


def run_case(a: netns.Namespace, sink: Sink, cc: str, streams: int, seconds: float
             ) -> tuple[list[int], list[tuple[float, int]], list[dict], float]:
    """Opens `streams` connections with `cc` from `a` to the sink, sends for
    `seconds`; returns each stream's bytes received in the window, the total
    over time, the sender's sockets as ss read them at the end, and the
    machine's CPU busy share in the window."""
    socks = []
    for _ in range(streams):
        s = a.inside(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        s.settimeout(10)
        s.connect((RECEIVER, PORT))
        s.settimeout(0.2)
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    deadline = time.monotonic() + 5
    while not sink.accepted(ports) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop = threading.Event()
    cpu0 = CpuSampler._read()
    base = sink.total(ports)
    t0 = time.monotonic()
    threads = [threading.Thread(target=_sender, args=(s, stop), daemon=True) for s in socks]
    for t in threads:
        t.start()
    series = [(0.0, 0)]
    while True:
        now = time.monotonic() - t0
        if now >= seconds:
            break
        time.sleep(min(0.1, seconds - now))
        series.append((time.monotonic() - t0, sum(sink.total(ports)) - sum(base)))
    end = sink.total(ports)
    cpu1 = CpuSampler._read()
    kernel = [k for k in kernel_counters.parse_ss(a.run(["ss", "-tinH"], capture_output=True,
                                                         text=True).stdout)
              if k["peer"] == RECEIVER and k["peer_port"] == str(PORT)]
    stop.set()
    for s in socks:  # reset, so nothing of this case is sent again into the next
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    for t in threads:
        t.join(timeout=2)
    sink.drop_all()
    busy = (cpu1[0] - cpu0[0]) / (cpu1[1] - cpu0[1]) if cpu1[1] > cpu0[1] else None
    return [e - b for e, b in zip(end, base)], series, kernel, busy


def _sysctl(ns: netns.Namespace, key: str) -> str:
    r = ns.run(["sysctl", "-n", key], capture_output=True, text=True)
    return " ".join(r.stdout.split()) if r.returncode == 0 else "?"


def measure(cc: str, n: int, seconds: float, link: profiles.Link, shaper: str, linkemu: str,
            seed: int, work: str) -> tuple[dict, dict]:
    """One case in a fresh pair of namespaces (no route metrics or queue left
    by the case before): the case's figures and the namespaces' TCP buffer
    settings."""
    from . import netem
    from .federation import Node
    from .linkemu import LinkEmulator
    tag = f"fwb-st{os.getpid() % 100000}"
    with netns.Namespace(f"{tag}-a") as a, netns.Namespace(f"{tag}-b") as b:
        buffers = {"tcp_wmem": _sysctl(a, "net.ipv4.tcp_wmem"),
                   "tcp_rmem": _sysctl(b, "net.ipv4.tcp_rmem")}
        sink = Sink(b)
        try:
            if shaper == "netem":
                nodes = [Node("receiver", "root", None, RECEIVER, None),
                         Node("sender", "site", "receiver", SENDER, "root")]
                links = netem.NetemLinks(nodes, {"sender": a.name, "receiver": b.name},
                                         profiles.Profile("streams", link, link), work)
            else:
                links = LinkEmulator(linkemu, {
                    "hosts": [{"name": "sender", "netns": a.name, "address": SENDER},
                              {"name": "receiver", "netns": b.name, "address": RECEIVER}],
                    "links": [{"a": "sender", "b": "receiver",
                               "profile": link.emulator_profile()}],
                    "seed": seed}, work)
            with links:
                cpu0 = links.cpu_seconds()
                t = time.monotonic()
                per_stream, series, kernel, busy = run_case(a, sink, cc, n, seconds)
                emu_busy = (links.cpu_seconds() - cpu0) / (time.monotonic() - t) \
                    if shaper == "linkemu" else None
                stats = links.stop()
        finally:
            sink.close()
    counters = stats["links"][0]["a_to_b"]["counters"] if stats else None
    row = summarise_case(cc, n, seconds, link.emulator_profile(), per_stream, series, counters,
                         kernel, busy, emu_busy)
    row["series"] = series
    return row, buffers


def cmd_streams(args: argparse.Namespace) -> int:
    from . import netem
    link, profile_name, cases = plan(args)
    why = netns.unavailable_reason(tun=False) or check_congestion_controls(
        list(dict.fromkeys(cc for cc, _ in cases)))
    if why:
        print(f"fedwan bench streams: cannot run here: {why}", file=sys.stderr)
        return SKIP
    shaper = netem.pick(args.shaper, "fedwan bench streams")
    why = shaper == "linkemu" and netns.unavailable_reason(tun=True)
    if shaper is None or why:
        if why:
            print(f"fedwan bench streams: cannot run here: {why}", file=sys.stderr)
        return SKIP
    linkemu = find_tool("fedwan-linkemu", args.linkemu) if shaper == "linkemu" else ""
    os.makedirs(args.out, exist_ok=True)
    results, info = [], machine()
    for cc, n in cases:
        work = os.path.join(args.out, f"{cc}-{n}")
        os.makedirs(work, exist_ok=True)
        print(f"fedwan bench streams: {cc}, {n} stream{'s' * (n > 1)}, "
              f"{args.seconds:g} s over {link.describe()} ...", flush=True)
        row, buffers = measure(cc, n, args.seconds, link, shaper, linkemu, args.seed, work)
        info.update(buffers)
        results.append(row)
        print(f"fedwan bench streams: {cc} x{n}: {row['goodput_mbit']:.1f} Mbit/s "
              f"({_fmt(row['share_of_rate'], '.2f')} of the rate)", flush=True)
    from .linkemu import LinkEmulator
    doc = {"tool": "fedwan bench streams",
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": info, "profile": profile_name,
           "link": dict(link.emulator_profile(), text=link.describe()),
           "seconds": args.seconds, "shaper": shaper,
           "shaping": netem.METHOD if shaper == "netem" else LinkEmulator.method,
           "cases": results}
    with open(os.path.join(args.out, "streams.json"), "w") as f:
        json.dump(doc, f, indent=2)
    with open(os.path.join(args.out, "streams.md"), "w") as f:
        f.write(markdown(doc))
    print(markdown(doc))
    print(f"fedwan bench streams: wrote {os.path.join(args.out, 'streams.json')} and streams.md")
    if not args.no_plots:
        try:
            print(f"fedwan bench streams: wrote {plot(doc, args.out)}")
        except ImportError:
            print("fedwan bench streams: no chart: matplotlib is not installed")
    return 0
