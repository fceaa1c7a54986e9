"""The kernel's own per-socket TCP counters, read with iproute2's `ss` while
a federation runs: a count of the bytes on the wire that owes nothing to
the link emulator, to check fedwan's and the emulator's counts against.

`ss -tin` prints, per TCP socket, a line with its state and addresses and
a line of tcp_info fields; of those the harness keeps bytes_sent (every
payload byte sent, retransmissions included), bytes_retrans, bytes_acked
(payload the peer acknowledged, plus one for the SYN and one for a FIN) and
bytes_received (payload received, plus one for a FIN). A field that is zero
is left out by ss, so a missing field reads 0.

A socket's counters vanish with it (TIME-WAIT keeps none), so in each
watched namespace the sampler runs `ss -tinEH`, which prints every TCP
socket as the kernel destroys it with its tcp_info at that moment (its state
then reads UNCONN): the final counters of every connection that closes
before the sampler stops, whether the process closed it, exited or was
killed. Besides, `ss -tinH` every `period` seconds keeps the last value of
the connections still open; a connection whose destruction the sampler did
not see (still open when it stopped, or no `stdbuf` to unbuffer the event
stream) is reported with its last periodic value, a lower bound ("at
least"); the others are "final".
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence

FIELDS = ("bytes_sent", "bytes_retrans", "bytes_acked", "bytes_received")
STATES = {"ESTAB", "SYN-SENT", "SYN-RECV", "FIN-WAIT-1", "FIN-WAIT-2", "TIME-WAIT", "CLOSE",
          "CLOSED", "CLOSE-WAIT", "LAST-ACK", "LISTEN", "CLOSING", "UNCONN", "UNKNOWN"}
_FIELD = re.compile(r"(?<![\w(,])(" + "|".join(FIELDS) + r"):(\d+)")
_RTT = re.compile(r"(?<![\w(,])rtt:([\d.]+)/")
# Flags ss prints before the congestion control's name.
_OPTIONS = {"ts", "sack", "ecn", "ecnseen", "fastopen", "noecn"}


def split_endpoint(text: str) -> tuple[str, str]:
    """'10.0.0.1:7000' -> ('10.0.0.1', '7000'); '[::ffff:10.0.0.1]:7000' ->
    ('10.0.0.1', '7000'); '[fe80::1%eth0]:22' -> ('fe80::1', '22');
    '0.0.0.0:*' -> ('0.0.0.0', '*')."""
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    host = host.split("%", 1)[0]
    if host.lower().startswith("::ffff:") and "." in host:
        host = host[7:]
    return host, port


def _congestion_control(info: str) -> Optional[str]:
    """The first bare word of a tcp_info line that is not an option flag:
    'ts sack cubic wscale:7,7 ...' -> 'cubic'."""
    for token in info.split():
        if ":" in token or "(" in token:
            return None
        if token not in _OPTIONS and token.isalnum():
            return token
    return None


def parse_ss(text: str) -> list[dict]:
    """Every socket in `ss -tin` output (with or without its header, -H):
    {state, local, peer, local_port, peer_port, cc, bytes_sent, bytes_retrans,
    bytes_acked, bytes_received, rtt_ms (smoothed; None when not shown)}.
    The tcp_info line may follow on its own line (indented) or on the
    socket's line; a field ss left out is 0."""
    sockets: list[dict] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        tokens = line.split()
        indented = line[0] in " \t"
        if not indented and tokens[0] in ("State", "Netid"):
            continue  # the header
        if not indented and tokens[0].lower() in ("tcp", "tcp6", "mptcp"):
            tokens = tokens[1:]  # a Netid column (ss -a with several protocols)
        if not indented and tokens and tokens[0] in STATES and len(tokens) >= 5:
            local, local_port = split_endpoint(tokens[3])
            peer, peer_port = split_endpoint(tokens[4])
            sockets.append({"state": tokens[0], "local": local, "local_port": local_port,
                            "peer": peer, "peer_port": peer_port, "cc": None,
                            **{f: 0 for f in FIELDS}, "rtt_ms": None})
            rest = " ".join(tokens[5:])
        elif sockets:
            rest = line
        else:
            continue
        s = sockets[-1]
        for name, value in _FIELD.findall(rest):
            s[name] = int(value)
        rtt = _RTT.search(rest)
        if rtt:
            s["rtt_ms"] = float(rtt.group(1))
        if s["cc"] is None:
            s["cc"] = _congestion_control(rest)
    return sockets


def _run_ss(namespace: str) -> tuple[str, float]:
    """`ss -N NAMESPACE -tinH`: its output and the CPU seconds it took."""
    try:
        p = subprocess.Popen(["ss", "-N", namespace, "-tinH"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return "", 0.0
    out = p.stdout.read()
    p.stdout.close()
    return (out if _reap(p) == 0 else ""), p.cpu_s


def _reap(p: subprocess.Popen) -> int:
    """Waits for `p` (wait4) and leaves its CPU seconds in p.cpu_s."""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    p.cpu_s = ru.ru_utime + ru.ru_stime
    return p.returncode


def records(lines: Iterable[str]) -> Iterator[str]:
    """Groups a stream of ss output lines into one text per socket, each
    as soon as it is whole (its tcp_info line, or the next socket's line,
    has come)."""
    pending: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        indented = line[0] in " \t"
        if not indented and pending:
            yield "".join(pending)  # a socket line with no tcp_info line
            pending = []
        pending.append(line)
        if indented:
            yield "".join(pending)
            pending = []
    if pending:
        yield "".join(pending)


class EventStream:
    """`ss -N NAMESPACE -tinEH` in the background (line-buffered by stdbuf),
    handing each destroyed socket's lines to `deliver` from a thread."""

    def __init__(self, namespace: str, deliver: Callable[[str], None]):
        self.cpu_s = 0.0
        self.proc = subprocess.Popen(["stdbuf", "-oL", "ss", "-N", namespace, "-tinEH"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self._thread = threading.Thread(target=self._read, args=(deliver,), daemon=True)
        self._thread.start()

    def _read(self, deliver: Callable[[str], None]) -> None:
        for text in records(self.proc.stdout):
            deliver(text)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        _reap(self.proc)
        self.cpu_s = self.proc.cpu_s
        self._thread.join(timeout=2)
        self.proc.stdout.close()


@dataclass
class Watch:
    """One namespace to sample: `peers` maps the addresses whose connections
    count to the nodes they belong to."""
    node: str
    namespace: str
    peers: dict[str, str]


class Sampler:
    """Reads `ss` in every watched namespace: destroyed sockets as they go
    (`events`: EventStream, or None for none) and open ones every `period`
    seconds from a thread; stop() returns the record (to_json)."""

    def __init__(self, watches: Sequence[Watch], period: float = 1.0,
                 run_ss: Callable[[str], tuple[str, float]] = _run_ss,
                 events: Optional[Callable] = EventStream,
                 clock: Callable[[], float] = time.monotonic, start: bool = True):
        self.watches = {w.node: w for w in watches}
        self.period = period
        self._run_ss = run_ss
        self._clock = clock
        self._t0 = clock()
        # (node, local port, peer address, peer port) -> the socket's last
        # counters, with the node, the peer node, when it was read and
        # whether it was its destruction (final).
        self.connections: dict[tuple, dict] = {}
        self.samples = 0
        self.events = 0
        self.cpu_s = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._streams: list = []
        if not start or period <= 0:
            return
        if events is not None:
            for w in self.watches.values():
                try:
                    self._streams.append(events(w.namespace,
                                                lambda text, n=w.node: self.record(n, text, True)))
                except OSError:
                    break  # no stdbuf: periodic samples only
            time.sleep(0.2)  # until each ss has subscribed
        self._thread.start()

    def record(self, node: str, text: str, final: bool = False) -> None:
        """Keeps what `text` (ss output from `node`'s namespace) says of the
        connections to the node's peers; `final`: destroyed sockets."""
        w = self.watches[node]
        t = round(self._clock() - self._t0, 3)
        with self._lock:
            for s in parse_ss(text):
                peer = w.peers.get(s["peer"])
                if peer is None or s["state"] in ("LISTEN", "TIME-WAIT", "SYN-SENT"):
                    continue
                key = (node, s["local_port"], s["peer"], s["peer_port"])
                old = self.connections.get(key)
                if old and old["final"] and not final:
                    continue  # a later periodic read of the same ports: a new socket's, or stale
                self.connections[key] = dict(s, node=node, peer_node=peer, t=t, final=final)
                self.events += final

    def sample(self, node: str) -> None:
        text, cpu = self._run_ss(self.watches[node].namespace)
        with self._lock:
            self.samples += 1
            self.cpu_s += cpu
        self.record(node, text)

    def _loop(self) -> None:
        while True:
            for node in self.watches:
                self.sample(node)
            if self._stop.wait(self.period):
                return

    def open_connections(self) -> int:
        with self._lock:
            return sum(not c["final"] for c in self.connections.values())

    def stop(self, grace: float = 2.0) -> dict:
        """Stops sampling; waits up to `grace` seconds for the connections
        still open to be destroyed (their FIN exchange, after the processes
        exited) before it stops the event streams."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        deadline = self._clock() + grace
        while self._streams and self.open_connections() and self._clock() < deadline:
            time.sleep(0.05)
        for stream in self._streams:
            stream.close()
            self.cpu_s += stream.cpu_s
        self._streams = []
        return self.to_json()

    def to_json(self) -> dict:
        with self._lock:
            return {"method": "ss -tinEH (sockets as destroyed) and ss -tinH every period_s",
                    "period_s": self.period, "samples": self.samples, "events": self.events,
                    "ss_cpu_s": self.cpu_s,
                    "connections": sorted(self.connections.values(),
                                          key=lambda c: (c["node"], c["peer_node"],
                                                         c["local_port"]))}


def watches_for(nodes: Sequence, namespaces: dict[str, str],
                both_ends: bool = False) -> list[Watch]:
    """What to read for a federation's `nodes` (federation.Node, with
    `namespaces` node id -> namespace name): every node but the root for its
    connections to its parent; with `both_ends` (netem: no emulator counts
    the payload) every node also for its connections to its children.
    Relays (no process, no connections) are left out."""
    nodes = [n for n in nodes if n.runs]
    address = {n.id: n.address for n in nodes}
    children: dict[str, list[str]] = {}
    for n in nodes:
        if n.parent:
            children.setdefault(n.parent, []).append(n.id)
    watches = []
    for n in nodes:
        peers = {address[n.parent]: n.parent} if n.parent else {}
        if both_ends:
            peers.update({address[c]: c for c in children.get(n.id, [])})
        if peers:
            watches.append(Watch(n.id, namespaces[n.id], peers))
    return watches


def totals(record: Optional[dict], node: str, peer: str) -> Optional[dict]:
    """The counters of `node`'s connections to `peer`, summed (None when
    nothing was sampled), with how many there were and whether every one's
    last sample was a final one."""
    conns = [c for c in (record or {}).get("connections", [])
             if c["node"] == node and c["peer_node"] == peer]
    if not conns:
        return None
    out = {f: sum(c[f] for c in conns) for f in FIELDS}
    out["connections"] = len(conns)
    out["final"] = all(c["final"] for c in conns)
    out["new_payload_sent"] = out["bytes_sent"] - out["bytes_retrans"]
    # bytes_acked counts the SYN as one byte, and the FIN once acknowledged;
    # no more payload was acknowledged than was sent.
    out["payload_acked"] = sum(
        max(0, min(c["bytes_acked"] - 1, c["bytes_sent"] - c["bytes_retrans"])) for c in conns)
    return out


def by_node(raw: dict) -> dict[str, dict]:
    """Every node's connections to its parent, summed (totals()), sites and
    aggregators alike; nodes with none sampled are left out."""
    out = {}
    for n in raw["nodes"]:
        t = totals(raw.get("kernel"), n["id"], n["parent"]) if n["parent"] else None
        if t:
            out[n["id"]] = t
    return out


def check(raw: dict, emulator_new_payload: dict[str, int]) -> list[dict]:
    """Per site: the payload the kernel says its parent acknowledged on its
    connections to the parent against the site's own count of what it sent
    (ratio: slightly above 1, by the same TLS, ZMTP and heartbeat bytes the
    emulator's check sees), and against the emulator's count of the new TCP
    payload that left the site (kernel_over_emulator: 1 when the final
    sample caught every byte)."""
    record = raw.get("kernel")
    parent = {n["id"]: n["parent"] for n in raw["nodes"]}
    rows = []
    for site, rep in raw["site_reports"].items():
        t = totals(record, site, parent[site])
        counted = rep["bytes_sent_total"]
        row = {"site": site, "fedwan_bytes_sent": counted, "kernel": t,
               "ratio": t["payload_acked"] / counted if t and counted else None,
               "semantics": None if t is None else ("final" if t["final"] else "at least")}
        wire = emulator_new_payload.get(site)
        if t and wire:
            row["kernel_over_emulator"] = t["payload_acked"] / wire
        rows.append(row)
    return rows
