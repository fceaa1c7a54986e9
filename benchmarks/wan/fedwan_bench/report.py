"""The harness's outputs: one JSON document per invocation and a Markdown
table of it (PNG plots: plots.py)."""

from __future__ import annotations

import json
import os
from typing import Optional

from .federation import BASELINES, mode_label, streams_suffix, tree_label


def _fmt(x: Optional[float], spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _mb(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


def _name(r: dict) -> str:
    v = r.get("sweep_value")
    return r["name"] if v is None else f"{r['name']} ({v})"


def mode(r: dict) -> str:
    """A run's mode: "blocking" or "overlap tau=N" (runs without one were
    blocking)."""
    return r.get("mode") or mode_label(r.get("overlap_steps", 0))


def streams(r: dict) -> int:
    """A run's TCP connections per tree link (runs without the figure: 1)."""
    if "streams" in r:
        return r["streams"]
    return (r.get("spec") or {}).get("streams", 1)


def mode_column(r: dict) -> str:
    """The mode column: the mode, then ", N streams" when a link had more
    than one TCP connection."""
    return mode(r) + streams_suffix(streams(r))


def root_tier_payload(r: dict) -> Optional[int]:
    """New TCP payload over the root tier, both directions: what the protocol
    sent there, without the link's retransmissions and TCP/IP headers (None
    when the shaper gave no per-tier payload count)."""
    links = r.get("links") or {}
    total = 0
    for key in ("root/up", "root/down"):
        v = (links.get(key) or {}).get("tcp_new_payload_bytes")
        if v is None:
            return None
        total += v
    return total


def model_label(spec: dict) -> str:
    """The params column: the synthetic model's size, or the trainer's name."""
    if spec.get("trainer", "synthetic") != "synthetic":
        return spec["trainer"]
    return f"{spec['params']:,}"


def comparisons(runs: list[dict]) -> dict:
    """Ratios of each fedwan run against each baseline in the same invocation,
    and of each overlapped fedwan run against each blocking one."""
    fedwan = [r for r in runs if r["name"] not in BASELINES]
    pairs = [(o, b) for o in fedwan for b in runs if b["name"] in BASELINES]
    pairs += [(o, b) for o in fedwan if mode(o) != "blocking"
              for b in fedwan if mode(b) == "blocking"]
    out = {}
    for ours, base in pairs:
        entry = {}
        if ours["round_s_median"] and base["round_s_median"]:
            entry["round_time_speedup"] = base["round_s_median"] / ours["round_s_median"]
        if ours["root_tier_ip_bytes"] and base["root_tier_ip_bytes"]:
            entry["root_tier_bytes_ratio"] = ours["root_tier_ip_bytes"] / base["root_tier_ip_bytes"]
        ours_payload, base_payload = root_tier_payload(ours), root_tier_payload(base)
        if ours_payload and base_payload:
            entry["root_tier_payload_ratio"] = ours_payload / base_payload
        if ours["wan_bytes_total"] and base["wan_bytes_total"]:
            entry["wan_bytes_ratio"] = ours["wan_bytes_total"] / base["wan_bytes_total"]
        entry["site_utilisation"] = {"ours": ours.get("site_utilisation_mean"),
                                     "baseline": base.get("site_utilisation_mean")}
        out[f"{_name(ours)} vs {_name(base)}"] = entry
    return out


def markdown(doc: dict) -> str:
    runs = doc["runs"]
    p = runs[0]["profile"]
    shaping = "; ".join(dict.fromkeys(r["shaping"] for r in runs))
    # fedwan's own processes (fedwan and flat fp32) set the topology's
    # tcp_congestion on their sockets; anything else keeps the host's.
    links_cc = ", ".join(dict.fromkeys(r.get("tcp_congestion", "bbr") for r in runs
                                       if r["spec"].get("system", "fedwan") != "flower"))
    lines = [
        f"# fedwan bench: {p['name']}",
        "",
        f"Root tier: {p['root_link_text']}; site tier: {p['site_link_text']}. "
        f"Shaping: {shaping}. Machine: {doc['machine']['cores']} cores, "
        f"kernel {doc['machine']['kernel']}, host congestion control "
        f"{doc['machine']['tcp_cc']}; fedwan's links: {links_cc or 'bbr'}.",
        "",
        "| run | mode | sites | codec | params | round s | wait s | ideal s | wait/ideal "
        "| utilisation | WAN MB | root-tier MB | resent MB | agg. RSS MB | CPU s/GB | busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    accuracy = any(r.get("final_accuracy") is not None for r in runs)
    if accuracy:
        lines[-2] = lines[-2].replace("| busy |", "| busy | accuracy |")
        lines[-1] += "---|"
    for r in runs:
        s = r["spec"]
        sites = s["sites"] if s["regions"] == 0 else s["regions"] * s["sites_per_region"]
        tree = r.get("tree") or tree_label(s["regions"], s["sites_per_region"],
                                           s.get("via_regions", 0))
        busy = (_fmt(r["machine_busy_while_waiting"], ".2f") + " / "
                + _fmt(r["emulator_busy_while_waiting"], ".2f")
                + (" CPU-bound" if r["cpu_bound"] else ""))
        lines.append(
            f"| {_name(r)} | {mode_column(r)} | {sites} ({tree}) | {s['codec']} | {model_label(s)} "
            f"| {_fmt(r['round_s_median'])} | {_fmt(r['site_wait_s_median'])} "
            f"| {_fmt(r['ideal_s_median'])} | {_fmt(r['wait_over_ideal_median'], '.2f')} "
            f"| {_fmt(r['site_utilisation_mean'], '.3f')} | {_mb(r['wan_bytes_total'])} "
            f"| {_mb(r['root_tier_ip_bytes'])} | {_mb(r['resent_bytes'])} "
            f"| {_fmt(r['aggregator_peak_rss_mb'], '.0f')} | {_fmt(r['cpu_s_per_gb'], '.2f')} "
            f"| {busy} |" + (f" {_fmt(r.get('final_accuracy'), '.4f')} |" if accuracy else ""))
    lines.append("")
    lines.append("Round and wait times are medians over the rounds after the first. "
                 "wait = time a site spent in sync (its delta up, the anchor down; "
                 "overlap tau=N: the time it waited at the merge, N inner steps after it "
                 "sent its update, not the transfer its training hid); "
                 "ideal = the bound of docs/benchmarks.md for the bytes of that round; "
                 "utilisation = a site's training time / its wall time; "
                 "busy = the machine's CPU busy share / the emulator's share of its one core, "
                 "medians while sites waited (CPU-bound: either above 0.9 for a quarter of "
                 "that time; the figures then measure this machine, not the links).")
    via = [r for r in runs if r["spec"].get("via_regions")]
    if via:
        lines.append("")
        lines.append(f"{', '.join(dict.fromkeys(r['name'] for r in via))}: flat, over the "
                     "regions' links: each site's connection to the root crosses its site-tier "
                     "link to its region, then the region's root-tier link, which the region's "
                     "sites share (the links of the tree with regions; root-tier MB and the "
                     "ideal bound count those shared links).")
        lines.append("")
    for name, entry in doc.get("comparisons", {}).items():
        parts = []
        if "round_time_speedup" in entry:
            parts.append(f"{entry['round_time_speedup']:.2f}x less time per round")
        if "root_tier_bytes_ratio" in entry:
            parts.append(f"root-tier bytes {entry['root_tier_bytes_ratio']:.3f} of the baseline's")
        if "root_tier_payload_ratio" in entry:
            parts.append(f"root-tier payload {entry['root_tier_payload_ratio']:.4f} of the "
                         "baseline's")
        u = entry.get("site_utilisation") or {}
        if u.get("ours") is not None and u.get("baseline") is not None:
            parts.append(f"site utilisation {u['ours']:.3f} against {u['baseline']:.3f}")
        lines.append(f"- {name}: " + ", ".join(parts))
    for f in doc.get("failed", []):
        first = f["error"].splitlines()[0] if f["error"] else "failed"
        lines.append(f"- {_name(f)}: FAILED: {first}")
    lines.append("")
    lines.append("Byte counters (each site's own count of what it sent, against the new TCP "
                 "payload that left its namespace: as the emulator saw it, or with netem as "
                 "the kernel's sockets sent it, bytes_sent less bytes_retrans):")
    lines.append("")
    for r in runs:
        ratios = [c["ratio"] for c in r["byte_check"] if c["ratio"]]
        source = r["byte_check"][0].get("source", "emulator") if r["byte_check"] else ""
        if ratios:
            lines.append(f"- {_name(r)}: TCP payload ({source}) / fedwan count = "
                         f"{min(ratios):.4f} to {max(ratios):.4f} over {len(ratios)} sites")
    kernel = [(r, kernel_line(r)) for r in runs]
    if any(line for _, line in kernel):
        lines += ["", "Kernel counters (`ss -tin` in each site's namespace: the payload its "
                  "parent acknowledged on its connections to it, bytes_acked less the SYN and "
                  "FIN, against the site's own count; expected just above 1 by the TLS and ZMTP "
                  "framing, as the emulator's count; final: read as each connection closed, at "
                  "least: a connection's last periodic read, a lower bound):", ""]
        lines += [f"- {_name(r)}: {line}" for r, line in kernel if line]
    return "\n".join(lines) + "\n"


def kernel_line(r: dict) -> str:
    """One run's kernel check in words: the ratios' range over its sites and,
    where the emulator counted too, the kernel's count against the
    emulator's."""
    rows = [c for c in r.get("kernel_check") or [] if c.get("ratio")]
    if not rows:
        return ""
    ratios = [c["ratio"] for c in rows]
    final = sum(c["semantics"] == "final" for c in rows)
    text = (f"kernel payload acked / fedwan count = {min(ratios):.4f} to {max(ratios):.4f} "
            f"over {len(rows)} sites ({final} final, {len(rows) - final} at least)")
    wire = [c["kernel_over_emulator"] for c in rows if c.get("kernel_over_emulator")]
    if wire:
        text += f"; kernel / emulator = {min(wire):.4f} to {max(wire):.4f}"
    return text


def write(doc: dict, out_dir: str) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "bench.json")
    md_path = os.path.join(out_dir, "bench.md")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=2)
    with open(md_path, "w") as f:
        f.write(markdown(doc))
    return json_path, md_path
