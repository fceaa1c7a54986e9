#!/usr/bin/env python3
"""The link emulator's own accuracy test (docs/benchmarks.md, "Link emulator").

Two namespaces joined by one emulated link. Over the kernel's real TCP:
  * delay: the shortest TCP connect time (one round trip) of 30 connects,
    halved, is within 5% of the profile's one-way delay (the shortest, not
    the median: a busy machine only ever adds scheduling delay on top of
    the link's, and under load the median drifted past 5%);
  * rate: a UDP flood at 1.25x the profile's rate keeps the bottleneck's
    queue backlogged; the rate at which its datagrams reach the receiver
    (kernel receive timestamps, IP bytes, past the first quarter) is within
    5% of the profile's rate. A flood, not TCP: TCP's goodput over a lossy
    queue (slow start overshoot, CUBIC's backoff, retransmissions, data
    held back behind a hole until it is repaired) moves a second's reading
    by several percent either way, which is TCP's behaviour and not the
    emulator's accuracy. TCP's steady goodput is reported, and must reach
    at least 80% of the rate (TCP fills the emulated link), not counting
    the time TCP waited out a retransmission timeout after the queue
    dropped (a BBR or slow start overshoot can cost a whole window, and
    an RTO of a second or two on a busy host);
  * loss: on a link with 1% loss the emulator drops 1% of the packets
    (within a fifth), and the transfer still completes intact;
  * counting: the TCP payload the emulator saw as new equals the bytes the
    sender wrote, on the lossless and the lossy link.
With --capacity it also reports how many packets per CPU-second the emulator
forwards (its ceiling in Gbit/s at 1500-byte packets); that figure is a
benchmark and is not asserted.

Exit status: 0 pass, 1 fail, 77 skipped (no root, netns or TUN).
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fedwan_bench import netns  # noqa: E402
from fedwan_bench.linkemu import LinkEmulator  # noqa: E402

MSS = 1448  # TCP payload per 1500-byte packet with timestamps (20 IP + 32 TCP)
DATAGRAM = 1472  # UDP payload per 1500-byte packet (20 IP + 8 UDP)
PORT = 5201
FLOOD_PORT = 5202
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)


def config(a: netns.Namespace, b: netns.Namespace, profile: dict) -> dict:
    return {"hosts": [{"name": "a", "netns": a.name, "address": "10.78.0.1"},
                      {"name": "b", "netns": b.name, "address": "10.78.0.2"}],
            "links": [{"a": "a", "b": "b", "profile": profile}]}


def relayed_config(a: netns.Namespace, r: netns.Namespace, b: netns.Namespace,
                   first: dict, second: dict) -> dict:
    """a -> r -> b: two links and a path over them (a and b have no link of
    their own), as a site reaches the root through its region's uplink."""
    return {"hosts": [{"name": "a", "netns": a.name, "address": "10.78.0.1"},
                      {"name": "b", "netns": b.name, "address": "10.78.0.2"},
                      {"name": "r", "netns": r.name, "address": "10.78.0.3"}],
            "links": [{"a": "a", "b": "r", "profile": first},
                      {"a": "r", "b": "b", "profile": second}],
            "paths": [{"from": "a", "to": "b", "via": ["r"]}]}


class Sink:
    """Accepts connections in namespace b; for each, records when every
    received byte arrived (cumulative count, time)."""

    def __init__(self, ns: netns.Namespace):
        self.listener = ns.inside(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("0.0.0.0", PORT))  # before the TUN device has its address
        self.listener.listen(64)
        self.samples: list[tuple[int, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.listener.accept()
            except OSError:
                return
            got = 0
            samples = []
            while True:
                b = c.recv(1 << 20)
                if not b:
                    break
                got += len(b)
                samples.append((got, time.monotonic()))
            c.close()
            if got:
                self.samples = samples
                self.done.set()

    def close(self) -> None:
        self.listener.close()


def flood_rate_bps(a: netns.Namespace, b: netns.Namespace, rate_bps: float,
                   seconds: float = 2.5) -> tuple[float, int, int]:
    """Sends 1500-byte IP packets from a to b at 1.25x rate_bps for `seconds`;
    returns the rate (IP bits per second) at which they reached b past the
    first quarter of the flood, from the kernel's receive timestamps (a
    receiver the scheduler runs late does not move them), with the number
    of datagrams sent and received."""
    rx = b.inside(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    try:
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
    except OSError:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    rx.bind(("0.0.0.0", FLOOD_PORT))
    rx.settimeout(0.2)
    stamps: list[float] = []
    sending_done = threading.Event()

    def receive() -> None:
        idle_since = None
        while True:
            try:
                data, anc, _, _ = rx.recvmsg(2048, socket.CMSG_SPACE(16))
            except socket.timeout:
                if sending_done.is_set():
                    # Everything sent has left the queue and the delay line
                    # once nothing has arrived for a second.
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > 1.0:
                        return
                continue
            idle_since = None
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                    sec, nsec = struct.unpack("qq", raw[:16])
                    stamps.append(sec + nsec * 1e-9)
                    break
            else:
                raise RuntimeError("no kernel receive timestamp on a datagram")
            if len(data) != DATAGRAM:
                raise RuntimeError(f"a {len(data)}-byte datagram in the flood")

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    tx = a.inside(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    tx.connect(("10.78.0.2", FLOOD_PORT))
    payload = b"\xa5" * DATAGRAM
    per_second = 1.25 * rate_bps / (1500 * 8)
    sent = 0
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < seconds:
        due = int(elapsed * per_second) + 1
        while sent < due:
            try:
                tx.send(payload)
            except OSError:  # ENOBUFS: the device queue is full; the emulator reads on
                break
            sent += 1
        time.sleep(0.0005)
    tx.close()
    sending_done.set()
    receiver.join(30)
    rx.close()
    if receiver.is_alive() or len(stamps) < 100:
        raise RuntimeError(f"the flood did not arrive ({len(stamps)} of {sent} datagrams)")
    start = len(stamps) // 4
    rate = (len(stamps) - 1 - start) * 1500 * 8 / (stamps[-1] - stamps[start])
    return rate, sent, len(stamps)


def client(ns: netns.Namespace, cc: str | None = None) -> socket.socket:
    s = ns.inside(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    if cc:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    return s


def connect_rtts(a: netns.Namespace, n: int) -> list[float]:
    rtts = []
    for _ in range(n):
        s = client(a)
        t = time.monotonic()
        s.connect(("10.78.0.2", PORT))
        rtts.append(time.monotonic() - t)
        s.close()
        time.sleep(0.01)
    return rtts


def bulk(a: netns.Namespace, sink: Sink, nbytes: int, cc: str | None = None) -> tuple[int, float]:
    sink.done.clear()
    s = client(a, cc)
    s.connect(("10.78.0.2", PORT))
    buf = b"\x5a" * (1 << 20)
    sent = 0
    t0 = time.monotonic()
    while sent < nbytes:
        chunk = buf[: min(len(buf), nbytes - sent)]
        s.sendall(chunk)
        sent += len(chunk)
    s.shutdown(socket.SHUT_WR)
    if not sink.done.wait(120):
        raise RuntimeError("the bulk transfer did not finish in 120 s")
    # The sink's FIN acknowledges ours: nothing of this connection is still
    # in flight when the caller stops the emulator (a FIN sent again into
    # the next emulator would count there).
    s.settimeout(30)
    s.recv(1)
    s.close()
    return sent, time.monotonic() - t0


STALL_S = 0.2  # no byte for this long: a retransmission timeout (TCP's minimum RTO)


def steady_rate_bps(samples: list[tuple[int, float]], drops: int) -> tuple[float, float]:
    """IP bits per second over the transfer's last 60% of bytes (past slow
    start), and the seconds left out of it: when the emulator's queue dropped
    packets, gaps of STALL_S or more without a byte are TCP waiting out a
    retransmission timeout (its loss recovery, not the link's rate) and do
    not count. Without drops nothing is left out: a link that stalled on its
    own fails."""
    total = samples[-1][0]
    first = next(i for i, s in enumerate(samples) if s[0] >= 0.4 * total)
    part = samples[first:]
    stalled = 0.0
    if drops > 0:
        stalled = sum(b[1] - a[1] for a, b in zip(part, part[1:]) if b[1] - a[1] >= STALL_S)
    payload_rate = (part[-1][0] - part[0][0]) / (part[-1][1] - part[0][1] - stalled)
    return payload_rate * 1500 / MSS * 8, stalled


def new_payload(stats: dict) -> int:
    return stats["links"][0]["a_to_b"]["counters"]["tcp_new_payload_bytes"]


def within(measured: float, target: float, tolerance: float) -> bool:
    return abs(measured - target) <= tolerance * target


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--emulator", default=os.path.join(here, "..", "..", "build", "benchmarks",
                                                        "fedwan-linkemu"))
    ap.add_argument("--rate-mbit", type=float, default=100)
    ap.add_argument("--delay-ms", type=float, default=20)
    ap.add_argument("--bytes", type=int, default=40_000_000)
    ap.add_argument("--capacity", action="store_true",
                    help="also measure the emulator's packets per CPU-second")
    args = ap.parse_args()
    why = netns.unavailable_reason()
    if why:
        print(f"skipped: {why}")
        return 77
    if not os.access(args.emulator, os.X_OK):
        print(f"fedwan-linkemu not found at {args.emulator} (--emulator)", file=sys.stderr)
        return 1

    run = f"fwb-acc{os.getpid()}"
    failures = []
    with tempfile.TemporaryDirectory() as work, netns.Namespace(run + "-a") as a, \
            netns.Namespace(run + "-b") as b:
        sink = Sink(b)
        profile = {"rate_mbit": args.rate_mbit, "delay_ms": args.delay_ms}
        with LinkEmulator(args.emulator, config(a, b, profile), work) as emu:
            rtt = min(connect_rtts(a, 30))
            sent, seconds = bulk(a, sink, args.bytes)
            stats = emu.stop()
            c = stats["links"][0]["a_to_b"]["counters"]
            tcp_rate, stalled = steady_rate_bps(sink.samples, c["queue_drop_packets"])
        with LinkEmulator(args.emulator, config(a, b, profile), work) as emu:
            rate, flood_sent, flood_got = flood_rate_bps(a, b, args.rate_mbit * 1e6)
            emu.stop()
        one_way = rtt / 2 * 1e3
        print(f"delay: profile {args.delay_ms:.2f} ms one way, measured {one_way:.2f} ms "
              f"({one_way / args.delay_ms:.3f}x)")
        print(f"rate:  profile {args.rate_mbit:.1f} Mbit/s, flood received at {rate / 1e6:.1f} Mbit/s "
              f"({rate / 1e6 / args.rate_mbit:.3f}x; {flood_got} of {flood_sent} datagrams); TCP "
              f"steady {tcp_rate / 1e6:.1f} Mbit/s ({tcp_rate / 1e6 / args.rate_mbit:.3f}x; "
              f"{stalled:.2f} s of retransmission timeouts left out), whole "
              f"transfer {sent * 8 / seconds / 1e6:.1f} Mbit/s of payload in {seconds:.2f} s")
        # What TCP met on the lossless link: the bottleneck queue's drops
        # (slow start overshooting it) and the retransmissions that repaired
        # them, and packets the receiving TUN device refused; none with a slow
        # TCP reading points at the machine instead.
        print(f"count: sender wrote {sent} B, emulator saw {new_payload(stats)} B of new TCP payload; "
              f"{c['queue_drop_packets']} of {c['packets']} packets dropped at the full queue, "
              f"{c['tcp_retransmitted_bytes']} B retransmitted, "
              f"{stats.get('write_errors', 0)} packets the receiving TUN device refused")
        if not within(one_way, args.delay_ms, 0.05):
            failures.append("delay off by more than 5%")
        if not within(rate / 1e6, args.rate_mbit, 0.05):
            failures.append("rate off by more than 5%")
        if tcp_rate / 1e6 < 0.8 * args.rate_mbit:
            failures.append("TCP's steady goodput is below 80% of the rate")
        if new_payload(stats) != sent:
            failures.append("new TCP payload differs from the bytes written (lossless link)")

        lossy = dict(profile, loss_percent=1.0)
        with LinkEmulator(args.emulator, config(a, b, lossy), work) as emu:
            sent, seconds = bulk(a, sink, args.bytes // 4, cc="bbr")
            received = sink.samples[-1][0]
            stats = emu.stop()
        c = stats["links"][0]["a_to_b"]["counters"]
        share = c["lost_packets"] / c["packets"]
        print(f"loss:  profile 1.00%, dropped {100 * share:.2f}% of {c['packets']} packets; "
              f"{c['tcp_retransmitted_bytes']} B retransmitted, {received} of {sent} B received")
        if not within(share, 0.01, 0.2):
            failures.append("loss share off by more than a fifth")
        print(f"count: sender wrote {sent} B, emulator saw {new_payload(stats)} B of new TCP payload")
        if received != sent or new_payload(stats) != sent:
            failures.append("lossy link: bytes received or counted differ from bytes written")

        # Relayed: a reaches b over a -> r (fast, short) and r -> b (the
        # bottleneck): the delays add up, the slower link sets the rate, and
        # each link counts the traffic it carried.
        with netns.Namespace(run + "-r") as r:
            first = {"rate_mbit": 4 * args.rate_mbit, "delay_ms": args.delay_ms / 4}
            with LinkEmulator(args.emulator, relayed_config(a, r, b, first, profile), work) as emu:
                rtt = min(connect_rtts(a, 30))
                sent, seconds = bulk(a, sink, args.bytes // 2)
                stats = emu.stop()
                drops = sum(stats["links"][k]["a_to_b"]["counters"]["queue_drop_packets"]
                            for k in (0, 1))
                tcp_rate, stalled = steady_rate_bps(sink.samples, drops)
            with LinkEmulator(args.emulator, relayed_config(a, r, b, first, profile), work) as emu:
                rate, _, _ = flood_rate_bps(a, b, args.rate_mbit * 1e6)
                emu.stop()
        one_way = rtt / 2 * 1e3
        want = args.delay_ms * 1.25
        hops = [stats["links"][k]["a_to_b"]["counters"]["tcp_new_payload_bytes"] for k in (0, 1)]
        print(f"relay: delay {one_way:.2f} ms one way against {want:.2f} ms "
              f"({one_way / want:.3f}x), flood rate {rate / 1e6:.1f} Mbit/s against "
              f"{args.rate_mbit:.1f} ({rate / 1e6 / args.rate_mbit:.3f}x), TCP steady "
              f"{tcp_rate / 1e6:.1f} ({tcp_rate / 1e6 / args.rate_mbit:.3f}x, {stalled:.2f} s of "
              f"retransmission timeouts left out); new payload per hop "
              f"{hops[0]} and {hops[1]} B of {sent} written; unrouted {stats['unrouted_packets']}")
        if not within(one_way, want, 0.05):
            failures.append("relayed delay is not the sum of the links' within 5%")
        if not within(rate / 1e6, args.rate_mbit, 0.05):
            failures.append("relayed rate is not the bottleneck link's within 5%")
        if tcp_rate / 1e6 < 0.8 * args.rate_mbit:
            failures.append("relayed: TCP's steady goodput is below 80% of the rate")
        # (unrouted: the namespaces' own chatter, e.g. IPv6 router
        # solicitations, which no link carries)
        if hops != [sent, sent]:
            failures.append("relayed: a hop's count differs from the bytes written")

        if args.capacity:
            with LinkEmulator(args.emulator, config(a, b, {"delay_ms": 1}), work) as emu:
                cpu0 = emu.cpu_seconds()
                sent, seconds = bulk(a, sink, 4 * args.bytes)
                cpu = emu.cpu_seconds() - cpu0
                stats = emu.stop()
            packets = sum(stats["links"][0][d]["counters"]["packets"] for d in ("a_to_b", "b_to_a"))
            pps = packets / cpu
            print(f"capacity: {packets} packets in {cpu:.2f} CPU s = {pps / 1e3:.0f} kpps per core "
                  f"= {pps * 1500 * 8 / 1e9:.2f} Gbit/s at 1500 B (transfer ran at "
                  f"{sent * 8 / seconds / 1e9:.2f} Gbit/s, sender and receiver on the same cores)")
        sink.close()
    for f in failures:
        print(f"FAIL: {f}")
    if not failures:
        print("PASS: the emulator's delay and rate are within 5% of the profile")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
