"""From a federation's raw record (federation.run) to the figures the harness
reports: per round and per run, and the ideal bound each round is held to.

The ideal bound of a blocking round (docs/benchmarks.md, "The ideal bound"):

    T_ideal = max over link directions d of  B_d * 1500/1448 * 8 / R_d
              + 2 * (sum of the one-way delays on a site's path to the root)

B_d is the bytes the protocol put on direction d in the round (its
frames: the encoded update or anchor, frame headers, seals), following the
link each byte crosses: a site's link carries its update up and its anchor
down; a region's link one aggregate and one anchor of the same size; a
relay's link (a flat tree over a tree's regions) every update and anchor of
the sites behind it. Checkpoint replicas sent up in the round count on the
links they cross too (a site's reported by the site, an aggregator's by
the root that received it): they go when nothing of the round waits, but
a link carries them all the same. 1500/1448 is the TCP/IP headers of a full-size
segment, R_d the direction's shaped rate. The first term is the
bottleneck's serialisation time: chunks stream through every hop (an
aggregator forwards chunk i before chunk i+1 arrives, and the root sends
anchor chunk i as soon as it has stepped it), so no protocol can
move the bytes faster than its slowest link. The second is one trip up and
one down, which nothing overlaps with. Losses and TCP's own ramp-up are not
in it: they are part of what the bound measures fedwan against.

In an overlapped run (federation.overlap_steps = tau > 0) a site's sync_s
is the time it waited at the merge (its begin_sync and finish_sync calls),
not the transfer, which ran while it trained its next tau inner steps: its
wait against the bound is then the share of the round's communication that
training did not hide.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Optional

from . import kernel_counters
from .federation import mode_label, tree_label

TCP_IP_OVERHEAD = 1500 / 1448
# Above this share of every core busy for a quarter of the time the sites
# wait on the network, the machine rather than the shaped links set the pace.
CPU_BOUND_SHARE = 0.9
# The emulator forwards every link's packets on one thread: above this
# share of its core it, not the profile, set the pace.
EMULATOR_BOUND_SHARE = 0.9


def median_after_warmup(values: list[float]) -> Optional[float]:
    """Median of the rounds after the first (connections warming up) when
    there are three or more, else of all."""
    if not values:
        return None
    return statistics.median(values[1:] if len(values) >= 3 else values)


def ideal_round_seconds(bytes_by_tier: dict[str, float], links: dict[str, dict],
                        path_tiers: Iterable[str]) -> float:
    """bytes_by_tier: the most bytes one direction of a link of each tier
    carries in the round; links: each tier's profile (rate_mbit, delay_ms);
    path_tiers: the tiers a site's path to the root crosses."""
    transfer = 0.0
    for tier, b in bytes_by_tier.items():
        rate = links[tier]["rate_mbit"]
        if rate > 0:
            transfer = max(transfer, b * TCP_IP_OVERHEAD * 8 / (rate * 1e6))
    propagation = 2 * sum(links[t]["delay_ms"] for t in path_tiers) / 1e3
    return transfer + propagation


def _tier_links(raw: dict) -> dict[str, dict]:
    p = raw["profile"]
    return {"root": p["root_link"], "site": p["site_link"]}


def hop(node: dict) -> Optional[str]:
    """The host at the other end of a node's link towards the root: the relay
    it sits behind, else its parent (records from before relays: its
    parent)."""
    return node.get("via") or node["parent"]


def _path_tiers(raw: dict) -> list[str]:
    """The tiers of the links a site's packets cross to the root."""
    nodes = {n["id"]: n for n in raw["nodes"]}
    n = next(n for n in raw["nodes"] if n["role"] == "site")
    tiers = []
    while n["parent"]:
        tiers.append(n["tier"])
        n = nodes[hop(n)]
    return tiers


def tier_bytes(raw: dict, site_rows: dict[str, dict],
               replicas: Optional[dict[str, int]] = None) -> dict[str, int]:
    """The most bytes one direction of a link of each tier carried in a
    round (`site_rows`: each site's row of it), following the links: a
    site's link carries its update up and its anchor down; an aggregator's
    link one aggregate up and one anchor down, of its sites' size (the same
    codec); a relay's link every update and anchor of the sites behind it.
    Replicas: a site's row's `replica_bytes` go up its link (not on to the
    root: its parent keeps them); `replicas` (the root's row: bytes it
    received from each child) go up those children's links."""
    nodes = {n["id"]: n for n in raw["nodes"]}
    carried: dict[str, list[int]] = {}  # a link's child end -> [up, down]
    for site, row in site_rows.items():
        sent, received = row["bytes_sent"], row["bytes_received"]
        replica = row.get("replica_bytes", 0)  # up to its parent, through any relay
        carried[site] = [sent + replica, received]
        n = nodes[hop(nodes[site])]
        while n["parent"]:
            up, down = carried.setdefault(n["id"], [0, 0])
            if n["role"] == "relay":
                carried[n["id"]] = [up + sent + replica, down + received]
            else:
                carried[n["id"]] = [max(up, sent), max(down, received)]
            n = nodes[hop(n)]
    for child, b in (replicas or {}).items():
        if child in nodes and nodes[child]["role"] != "site":
            carried.setdefault(child, [0, 0])[0] += b
    out: dict[str, int] = {}
    for child, directions in carried.items():
        tier = nodes[child]["tier"]
        out[tier] = max(out.get(tier, 0), *directions)
    return out


def per_round(raw: dict) -> list[dict]:
    """One row per round: the root's view (round time, bytes) and the sites'
    (time training, time waiting on the network), with the ideal bound."""
    sites = raw["site_reports"]
    links = _tier_links(raw)
    tiers = _path_tiers(raw)
    rows = []
    for k, root_row in enumerate(raw["root_report"]["rounds"]):
        by_site = {s: rep["rounds"][k] for s, rep in sites.items() if k < len(rep["rounds"])}
        site_rows = list(by_site.values())
        sync = [r["sync_s"] for r in site_rows]
        train = [r["train_s"] for r in site_rows]
        # Overlapped rounds: begin_sync to the end of finish_sync, the window
        # the transfer had (sync_s is only the wait in it).
        overlap = [r["overlap_s"] for r in site_rows if r.get("overlap_s") is not None]
        b = max([max(r["bytes_sent"], r["bytes_received"]) for r in site_rows] or [0])
        # What one direction of each tier's busiest link carries.
        by_tier = tier_bytes(raw, by_site, root_row.get("replica_bytes"))
        ideal = ideal_round_seconds(by_tier, links, tiers)
        comm = statistics.mean(sync) if sync else None
        rows.append({
            "round": root_row["round"],
            "round_s": root_row["seconds"],
            "wan_bytes": root_row["wan_bytes"],
            "fp32_bytes": root_row["fp32_bytes"],
            "site_train_s": statistics.mean(train) if train else None,
            "site_wait_s": comm,
            "site_wait_max_s": max(sync) if sync else None,
            "site_overlap_s": statistics.mean(overlap) if overlap else None,
            "site_bytes_per_direction": b,
            "tier_bytes_per_direction": by_tier,
            "ideal_s": ideal,
            "wait_over_ideal": comm / ideal if comm and ideal > 0 else None,
            "accuracy": root_row.get("accuracy"),
        })
    return rows


LINK_FIELDS = ("ip_bytes", "packets", "tcp_payload_bytes", "tcp_new_payload_bytes",
               "tcp_retransmitted_bytes", "lost_packets", "queue_drop_packets", "dropped_packets")


def shaper_kind(raw: dict) -> str:
    """"linkemu" or "netem" (records from before netem: linkemu)."""
    return raw["emulator"].get("kind") or "linkemu"


def direction_counters(raw: dict, child: str, parent: str, key: str) -> dict:
    """One direction's counters (key a_to_b: child -> parent) of the link
    between `child` and `parent` (the next host towards the root: a relay
    for a site behind one): the emulator's; with netem the link's packet
    counts and the TCP payload from the kernel's counters of the sending
    ends' connections over the link (link_flows; None where nothing counted
    one of them)."""
    stats = raw["emulator"]["stats"] or {"links": []}
    link = next((l for l in stats["links"] if l["a"] == child and l["b"] == parent), None)
    c = dict(link[key]["counters"]) if link else {}
    if c and c.get("dropped_packets") is None and c.get("lost_packets") is not None:
        c["dropped_packets"] = c["lost_packets"] + c["queue_drop_packets"]
    if shaper_kind(raw) == "netem" and c.get("tcp_new_payload_bytes") is None:
        ends = []  # (sender, receiver) of each connection over this direction
        for node, peer in link_flows(raw, child):
            ends.append((node, peer) if key == "a_to_b" else (peer, node))
        t = [kernel_counters.totals(raw.get("kernel"), *e) for e in ends]
        whole = bool(t) and all(t)
        for field, total in (("tcp_payload_bytes", "bytes_sent"),
                             ("tcp_new_payload_bytes", "new_payload_sent"),
                             ("tcp_retransmitted_bytes", "bytes_retrans")):
            c[field] = sum(x[total] for x in t) if whole else None
    return c


def link_flows(raw: dict, child: str) -> list[tuple[str, str]]:
    """The connections, (node, its parent), whose packets cross the link
    from `child` towards the root: the child's own to its parent, or a
    relay's: those of every node behind it."""
    nodes = raw["nodes"]
    me = next(n for n in nodes if n["id"] == child)
    if me["role"] == "relay":
        return [(n["id"], n["parent"]) for n in nodes if n.get("via") == child]
    return [(child, me["parent"])]


def _add(slot: dict, key: str, value) -> None:
    """Sums into slot[key]; one figure missing makes the sum missing."""
    slot[key] = None if value is None or slot[key] is None else slot[key] + value


def link_totals(raw: dict) -> dict[str, dict]:
    """Per tier and direction ("up": towards the root), summed over the tier's
    links, from the emulator's packet counters (netem: direction_counters)."""
    stats = raw["emulator"]["stats"] or {"links": []}
    tier_of = {n["id"]: n["tier"] for n in raw["nodes"]}
    out: dict[str, dict] = {}
    for link in stats["links"]:
        tier = tier_of[link["a"]]  # a = the child end
        for direction, key in (("up", "a_to_b"), ("down", "b_to_a")):
            c = direction_counters(raw, link["a"], link["b"], key)
            slot = out.setdefault(f"{tier}/{direction}", dict.fromkeys(LINK_FIELDS, 0))
            slot["links"] = slot.get("links", 0) + 1
            for k in LINK_FIELDS:
                _add(slot, k, c.get("bytes") if k == "ip_bytes" else c.get(k))
    return out


def emulator_new_payload(raw: dict) -> dict[str, int]:
    """Per child node: the new TCP payload the emulator saw leave it on its
    link towards the root (none with netem)."""
    stats = raw["emulator"]["stats"] or {"links": []}
    return {l["a"]: l["a_to_b"]["counters"]["tcp_new_payload_bytes"] for l in stats["links"]
            if l["a_to_b"]["counters"].get("tcp_new_payload_bytes") is not None}


def byte_check(raw: dict) -> list[dict]:
    """Each site's own count of the bytes it sent against the new TCP payload
    that left its namespace, on its own link (to its parent, or to the relay
    it sits behind: no other node's packets cross it): as the emulator saw
    it, or with netem as the kernel sent it (its sockets' bytes_sent less
    bytes_retrans; `source` says which). The wire's count is higher by the
    ZMTP framing, the TLS handshake and the heartbeats; more than a few
    percent either way would mean a byte counter is wrong."""
    first = {n["id"]: hop(n) for n in raw["nodes"]}
    source = "emulator" if shaper_kind(raw) == "linkemu" else "kernel (ss)"
    rows = []
    for site, rep in raw["site_reports"].items():
        counted = rep["bytes_sent_total"]
        wire = direction_counters(raw, site, first[site], "a_to_b").get("tcp_new_payload_bytes")
        rows.append({"site": site, "fedwan_bytes_sent": counted, "tcp_payload_bytes": wire,
                     "source": source,
                     "ratio": wire / counted if counted and wire is not None else None})
    return rows


def busy_while_waiting(raw: dict, column: int = 1, quantile: float = 0.5) -> Optional[float]:
    """The mean over the CPU samples taken while some site was in a sync
    (waiting on the network), after round 0, of the machine's busy share
    (column 1) or the emulator's share of its one core (column 2), at the
    given quantile of the samples (0.5: the median); None when the reports
    carry no wall-clock times."""
    samples = raw.get("cpu_samples") or []
    windows = [(r["sync_start_unix"], r["sync_start_unix"] + r["sync_s"])
               for rep in raw["site_reports"].values() for r in rep["rounds"][1:]
               if "sync_start_unix" in r]
    inside = [s[column] for s in samples if any(lo <= s[0] <= hi for lo, hi in windows)]
    if not inside:
        return None
    inside.sort()
    return inside[min(len(inside) - 1, int(quantile * len(inside)))]


def summarise(raw: dict) -> dict:
    rounds = per_round(raw)
    usage = raw["usage"]
    roles = {n["id"]: n["role"] for n in raw["nodes"]}
    sites = raw["site_reports"]
    totals = link_totals(raw)
    ip_bytes = sum(t["ip_bytes"] or 0 for t in totals.values())
    cpu = sum(u["cpu_s"] for u in usage.values())
    cores = _cores()
    busy = (cpu + raw["emulator"]["cpu_s"]) / (raw["wall_s"] * cores) if raw["wall_s"] else 0
    comm_total = sum(r["site_wait_s"] or 0 for r in rounds)
    overlap_steps = raw["spec"].get("overlap_steps", 0)
    if overlap_steps:
        # The transfers ran while the sites trained: their window is the
        # overlap (begin_sync to the end of finish_sync) where the reports
        # have it, else no goodput.
        windows = [r["site_overlap_s"] for r in rounds]
        comm_total = sum(windows) if all(w is not None for w in windows) else 0
    goodput = {}
    links = _tier_links(raw)
    for key, t in totals.items():
        tier = key.split("/")[0]
        rate = links[tier]["rate_mbit"]
        per_link_mbit = t["tcp_new_payload_bytes"] * 8 / comm_total / 1e6 / t["links"] \
            if comm_total and t["tcp_new_payload_bytes"] is not None else None
        goodput[key] = {"mbit_per_link_while_waiting": per_link_mbit,
                        "share_of_rate": per_link_mbit / rate if per_link_mbit and rate else None}
    root_report = raw["root_report"]
    return {
        "name": raw["spec"]["name"],
        "tree": tree_label(raw["spec"]["regions"], raw["spec"]["sites_per_region"],
                           raw["spec"].get("via_regions", 0)),
        "mode": mode_label(overlap_steps),
        "overlap_steps": overlap_steps,
        # TCP connections per tree link (records from before the knob: 1).
        "streams": raw["spec"].get("streams", 1),
        # What the topology set on fedwan's links ("" = fedwan's default, bbr).
        "tcp_congestion": raw["spec"].get("tcp_congestion") or "bbr",
        "spec": raw["spec"],
        "profile": raw["profile"],
        "shaping": raw["emulator"]["method"],
        "shaper": shaper_kind(raw),
        "rounds": rounds,
        "wall_s": raw["wall_s"],
        "round_s_median": median_after_warmup([r["round_s"] for r in rounds]),
        "site_wait_s_median": median_after_warmup([r["site_wait_s"] for r in rounds]),
        "ideal_s_median": median_after_warmup([r["ideal_s"] for r in rounds]),
        "wait_over_ideal_median": median_after_warmup(
            [r["wait_over_ideal"] for r in rounds if r["wait_over_ideal"]]),
        "site_utilisation_mean": statistics.mean(s["utilisation"] for s in sites.values()),
        "wan_bytes_total": root_report["wan_bytes_total"],
        "fp32_bytes_total": root_report["fp32_bytes_total"],
        "wan_over_fp32": root_report["wan_bytes_total"] / root_report["fp32_bytes_total"]
        if root_report["fp32_bytes_total"] else None,
        "root_tier_ip_bytes": sum(t["ip_bytes"] or 0 for k, t in totals.items()
                                  if k.startswith("root/")),
        "links": totals,
        "goodput": goodput,
        "resent_bytes": sum(r["bytes_resent"] for s in sites.values() for r in s["rounds"]),
        "aggregator_peak_rss_mb": max(usage[n]["peak_rss_mb"] for n in usage
                                      if roles[n] != "site"),
        "site_peak_rss_mb": max(usage[n]["peak_rss_mb"] for n in usage if roles[n] == "site"),
        "cpu_s": cpu,
        "emulator_cpu_s": raw["emulator"]["cpu_s"],
        "cpu_s_per_gb": cpu / (ip_bytes / 1e9) if ip_bytes else None,
        "machine_busy_share": busy,
        "machine_busy_while_waiting": busy_while_waiting(raw),
        "emulator_busy_while_waiting": busy_while_waiting(raw, column=2)
        if shaper_kind(raw) == "linkemu" else None,
        # A quarter of the waiting time with the machine or the emulator
        # saturated is enough to stretch the transfers.
        "cpu_bound": (busy_while_waiting(raw, quantile=0.75) or busy) > CPU_BOUND_SHARE
        or (busy_while_waiting(raw, column=2, quantile=0.75) or 0) > EMULATOR_BOUND_SHARE,
        "byte_check": byte_check(raw),
        "kernel_check": kernel_counters.check(raw, emulator_new_payload(raw)),
        "kernel_sampling": {k: v for k, v in (raw.get("kernel") or {}).items()
                            if k != "connections"} or None,
        "kernel_to_parent": kernel_counters.by_node(raw),
        "final_accuracy": root_report.get("final_accuracy"),
    }


def _cores() -> int:
    import os
    return len(os.sched_getaffinity(0))
