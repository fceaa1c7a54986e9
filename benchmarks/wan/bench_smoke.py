#!/usr/bin/env python3
"""Proves `fedwan bench` works end to end, in seconds: `fedwan bench run
--quick` (one region of two sites and the flat fp32 baseline over the same
links, under the cross-region profile), then checks what it wrote. No timing is asserted;
the figures are only checked to be whole and consistent:

  * both runs finished every round and name their shaping method;
  * each site's own count of the bytes it sent matches the new TCP payload
    the emulator saw leave its namespace (the count is the frames; the wire
    adds ZMTP framing, the TLS handshake and heartbeats: within 0% and 10%);
  * the kernel agrees: the payload each site's parent acknowledged (ss's
    bytes_acked, read as the connection closed) is within 0% and 10% above
    the site's count too, and equal to the emulator's count within 1%;
  * fp16 moves about half of fp32's bytes, and the hierarchy puts fewer
    bytes on the root tier than the flat tree behind the same region link;
  * utilisation is in (0, 1], the ideal bound is positive, memory and CPU
    were measured;
  * `fedwan bench streams --quick` measured every case: goodput above zero
    and not above the shaped rate, no more payload received than the link
    carried, its shaping method named.

Exit status: 0 pass, 1 fail, 77 skipped (no root, namespaces or TUN).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def check(doc: dict) -> list[str]:
    problems = []
    runs = {r["name"]: r for r in doc["runs"]}
    if set(runs) != {"fedwan", "flat-fp32"}:
        return [f"runs {sorted(runs)}, expected fedwan and flat-fp32"]
    for name, r in runs.items():
        if len(r["rounds"]) != r["spec"]["rounds"]:
            problems.append(f"{name}: {len(r['rounds'])} rounds reported of {r['spec']['rounds']}")
        if "linkemu" not in r["shaping"] and "netem" not in r["shaping"]:
            problems.append(f"{name}: shaping method not named ({r['shaping']!r})")
        for c in r["byte_check"]:
            if c["ratio"] is None or not 1.0 <= c["ratio"] <= 1.10:
                problems.append(f"{name}: {c['site']} sent {c['fedwan_bytes_sent']} B by its "
                                f"count but {c['tcp_payload_bytes']} B of TCP payload")
        if r.get("kernel_sampling"):  # none without iproute2's ss
            for c in r["kernel_check"]:
                wire = c.get("kernel_over_emulator")
                if c["ratio"] is None or not 1.0 <= c["ratio"] <= 1.10 or \
                        c["semantics"] != "final" or (wire and not 0.99 <= wire <= 1.01):
                    problems.append(f"{name}: {c['site']} sent {c['fedwan_bytes_sent']} B by "
                                    f"its count; the kernel says {c['kernel']} "
                                    f"(ratio {c['ratio']}, against the emulator {wire})")
        if not 0 < r["site_utilisation_mean"] <= 1:
            problems.append(f"{name}: utilisation {r['site_utilisation_mean']}")
        if not r["ideal_s_median"] or r["ideal_s_median"] <= 0:
            problems.append(f"{name}: no ideal bound")
        if not r["aggregator_peak_rss_mb"] > 0 or not r["cpu_s"] > 0:
            problems.append(f"{name}: memory or CPU not measured")
        for row in r["rounds"]:
            if not row["site_wait_s"] or row["site_wait_s"] <= 0:
                problems.append(f"{name}: round {row['round']} has no wait time")
    ours, flat = runs["fedwan"], runs["flat-fp32"]
    if not 0.45 <= ours["wan_over_fp32"] <= 0.6:
        problems.append(f"fp16 moved {ours['wan_over_fp32']:.3f} of fp32's bytes")
    if not 0.98 <= flat["wan_over_fp32"] <= 1.02:
        problems.append(f"fp32 on a flat tree reports {flat['wan_over_fp32']:.3f} of fp32")
    if not ours["root_tier_ip_bytes"] < flat["root_tier_ip_bytes"]:
        problems.append("the hierarchy did not put fewer bytes on the root tier")
    return problems


def check_streams(doc: dict) -> list[str]:
    problems = []
    if len(doc["cases"]) != 4:
        problems.append(f"streams: {len(doc['cases'])} cases, expected 4")
    if "linkemu" not in doc["shaping"] and "netem" not in doc["shaping"]:
        problems.append(f"streams: shaping method not named ({doc['shaping']!r})")
    for c in doc["cases"]:
        name = f"streams: {c['cc']} x{c['streams']}"
        if not c["goodput_mbit"] > 0 or len(c["per_stream_bytes"]) != c["streams"]:
            problems.append(f"{name}: nothing received")
        if c["share_of_rate"] is not None and c["share_of_rate"] > 1.02:
            problems.append(f"{name}: {c['share_of_rate']:.3f} of the shaped rate")
        carried = c["emulator_new_payload_bytes"]
        if carried is not None and carried < c["received_bytes"]:
            problems.append(f"{name}: received {c['received_bytes']} B, the link carried "
                            f"{carried} B")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fedwan", required=True, help="the fedwan binary")
    ap.add_argument("--out", help="keep the outputs here (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        r = subprocess.run([args.fedwan, "bench", "run", "--quick", "--out", out],
                           capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode == 77:
            print("skipped: " + (r.stderr.strip() or "fedwan bench cannot run here"))
            return 77
        if r.returncode != 0:
            print(f"FAIL: fedwan bench exited {r.returncode}")
            return 1
        with open(os.path.join(out, "bench.json")) as f:
            doc = json.load(f)
        problems = check(doc)
        streams_out = os.path.join(out, "streams")
        r = subprocess.run([args.fedwan, "bench", "streams", "--quick", "--out", streams_out],
                           capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            problems.append(f"fedwan bench streams --quick exited {r.returncode}")
        else:
            with open(os.path.join(streams_out, "streams.json")) as f:
                problems += check_streams(json.load(f))
    for p in problems:
        print(f"FAIL: {p}")
    if not problems:
        print("PASS: fedwan bench run --quick and streams --quick wrote whole, consistent "
              "results")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
