#!/usr/bin/env python3
"""Runs `fedwan demo` and checks its JSON report against thresholds.

usage: check_demo_report.py FEDWAN_BINARY WORKDIR [--min-accuracy A] [--max-gap G]
                            [--max-ratio R] [--require-improvement] [--expect-restart NODE]
                            -- [demo flags...]
"""
import argparse
import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import time


def disk_recovery(report: dict, node: str) -> list:
    """A node whose disk was lost (--chaos NODE@ROUND:disk): it restored its
    parent's replica; a site rebuilt from its image or took a newer model."""
    audit = os.path.join(report.get("configuration", {}).get("audit_dir", ""), node + ".jsonl")
    events = []
    with open(audit, encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            events.append((e.get("event"), e.get("fields", {})))
    names = [n for n, _ in events]
    out = []
    if "replica_restored" not in names:
        out.append(f"{node} lost its disk but restored no replica ({audit})")
    if node.startswith("site-") and "replica_rebuilt" not in names and "replica_behind" not in names:
        out.append(f"{node} restored a replica but neither rebuilt from it nor took a newer model")
    restored = [f for n, f in events if n == "replica_restored"]
    if restored:
        outcome = ""
        if node.startswith("site-"):
            outcome = "; " + ("rebuilt" if "replica_rebuilt" in names else "took a newer model")
        print(f"disk lost: {node} restored its parent's replica of round "
              f"{restored[-1].get('round')} ({restored[-1].get('bytes')} bytes){outcome}")
    return out


def kept_replicas_match_audit(fedwan: str, rundir: str, since: float) -> list:
    """Every replica an aggregator kept in this run (written since `since`)
    is the one its audit log names: the digest `fedwan checkpoint digest`
    prints for the file is that of the aggregator's last `replica_stored`
    entry for its child and round; with the run's CA, the child signed it."""
    out = []
    checked = 0
    for path in sorted(glob.glob(os.path.join(rundir, "checkpoints", "*", "replicas", "*",
                                              "round-*.fwck"))):
        if os.path.getmtime(path) < since:
            continue
        parts = path.split(os.sep)
        agg, peer = parts[-4], parts[-2]
        rnd = int(os.path.basename(path)[len("round-"):-len(".fwck")])
        digests = []
        with open(os.path.join(rundir, "audit", agg + ".jsonl"), encoding="utf-8") as f:
            for line in f:
                e = json.loads(line)
                fields = e.get("fields", {})
                if (e.get("event") == "replica_stored" and fields.get("peer") == peer
                        and fields.get("round") == rnd):
                    digests.append(fields.get("digest"))
        # Signed by the child itself under the demo's CA, when the run has one.
        ca = os.path.join(rundir, "pki", "ca", "ca.pem")
        p = subprocess.run([fedwan, "checkpoint", "digest", path] +
                           (["--ca", ca] if os.path.exists(ca) else []),
                           capture_output=True, text=True)
        if p.returncode != 0:
            out.append(f"`fedwan checkpoint digest {path}` failed: {p.stderr.strip()}")
            continue
        printed = p.stdout.split()[0] if p.stdout.split() else ""
        if not digests:
            out.append(f"{agg} kept {path} but its audit log has no replica_stored for it")
        elif printed != digests[-1]:
            out.append(f"{path}: digest {printed}, {agg}'s audit log says {digests[-1]}")
        checked += 1
    if checked:
        print(f"replicas: {checked} kept file(s), each the one its aggregator's audit names")
        # A copy with one byte changed is no checkpoint of anyone's.
        with open(path, "rb") as f:
            damaged = bytearray(f.read())
        damaged[len(damaged) // 2] ^= 0x01
        copy = os.path.join(rundir, "damaged-replica.fwck")
        with open(copy, "wb") as f:
            f.write(damaged)
        p = subprocess.run([fedwan, "checkpoint", "digest", copy], capture_output=True, text=True)
        os.remove(copy)
        if p.returncode != 1 or "corrupt" not in p.stderr:
            out.append(f"`fedwan checkpoint digest` on a damaged replica: exit {p.returncode}, "
                       f"{p.stderr.strip()!r}")
    return out


def main() -> int:
    argv = sys.argv[1:]
    demo_flags = []
    if "--" in argv:
        cut = argv.index("--")
        argv, demo_flags = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser()
    p.add_argument("fedwan")
    p.add_argument("workdir")
    p.add_argument("--min-accuracy", type=float)
    p.add_argument("--max-gap", type=float)
    p.add_argument("--max-ratio", type=float)
    p.add_argument("--require-improvement", action="store_true")
    p.add_argument("--expect-restart", metavar="NODE",
                   help="NODE died once (--chaos) and the demo restarted it; nothing else did")
    p.add_argument("--expect-late", metavar="SITE",
                   help="SITE joined late (--late): admitted and welcomed as a member")
    p.add_argument("--expect-added", metavar="SITE",
                   help="SITE was added by a signed topology version (--add-site): every "
                        "aggregator adopted it, the site joined once and contributed")
    p.add_argument("--expect-leave", metavar="SITE@ROUND",
                   help="SITE left as ROUND (1-based) began (--leave), and no child was lost")
    p.add_argument("--cost-attacks", action="store_true",
                   help="then forge, zero and inflate cost records in a copy of the run's and "
                        "check that `fedwan costs` refuses or corrects each (cost_attacks.py)")
    a = p.parse_args(argv)

    os.makedirs(a.workdir, exist_ok=True)
    report_path = os.path.join(a.workdir, "report.json")
    if os.path.exists(report_path):
        os.remove(report_path)
    # Audit logs are append-only across runs in one directory: start this
    # run's afresh, so that what is checked below is this run's.
    shutil.rmtree(os.path.join(a.workdir, "run", "audit"), ignore_errors=True)
    cmd = [a.fedwan, "demo", "--dir", os.path.join(a.workdir, "run"), "--report", report_path]
    cmd += demo_flags
    print("running:", " ".join(cmd), flush=True)
    started = time.time()
    subprocess.run(cmd, check=True)
    with open(report_path) as f:
        r = json.load(f)

    failures = []
    # A synthetic model is not evaluated: its rounds carry no accuracy.
    evaluated = r.get("configuration", {}).get("trainer") != "synthetic"
    for key in ("rounds", "wan_bytes_total", "fp32_bytes_total", "wall_seconds",
                "configuration") + (("final_accuracy", "baseline_accuracy") if evaluated else ()):
        if key not in r:
            failures.append(f"report lacks '{key}'")
    rounds = r.get("rounds", [])
    expected_rounds = r.get("configuration", {}).get("rounds")
    if len(rounds) != expected_rounds:
        failures.append(f"{len(rounds)} round rows, configuration says {expected_rounds}")
    for row in rounds:
        for key in ("round", "wan_bytes", "seconds") + (("accuracy", "loss") if evaluated else ()):
            if key not in row:
                failures.append(f"round row lacks '{key}': {row}")
    if sum(row.get("wan_bytes", 0) for row in rounds) != r.get("wan_bytes_total"):
        failures.append("wan_bytes_total is not the sum of the rounds' wan_bytes")
    final = r.get("final_accuracy") or 0.0
    base = r.get("baseline_accuracy")
    ratio = r["wan_bytes_total"] / r["fp32_bytes_total"] if r.get("fp32_bytes_total") else 1.0
    print(f"final_accuracy {final:.4f}  baseline_accuracy {base}  wan/fp32 {ratio:.4f}  "
          f"wall {r.get('wall_seconds', 0):.1f} s")
    if a.min_accuracy is not None and final < a.min_accuracy:
        failures.append(f"final accuracy {final:.4f} < {a.min_accuracy}")
    if a.max_gap is not None:
        if base is None:
            failures.append("no baseline accuracy")
        elif abs(final - base) > a.max_gap:
            failures.append(f"|final - baseline| = {abs(final - base):.4f} > {a.max_gap}")
    if a.max_ratio is not None and ratio > a.max_ratio:
        failures.append(f"wan/fp32 bytes {ratio:.4f} > {a.max_ratio}")
    if a.require_improvement and len(rounds) >= 2 and not rounds[-1]["accuracy"] > rounds[0]["accuracy"]:
        failures.append("accuracy did not improve over the rounds")
    # Every node's peak resident memory, from the kernel's count when it exited.
    memory = r.get("memory") or {}
    nodes = memory.get("nodes") or {}
    if not memory.get("model_fp32_mib", 0) > 0:
        failures.append(f"report's memory lacks the model size: {memory}")
    if "root" not in nodes:
        failures.append(f"report's memory lacks the root: {sorted(nodes)}")
    for node, m in nodes.items():
        if not m.get("peak_rss_mib", 0) > 0 or m.get("role") not in ("root", "region", "site"):
            failures.append(f"memory of {node} is not a peak RSS with a role: {m}")
        # Sampled while it ran: anonymous memory is part of the resident set.
        anon = m.get("peak_anon_mib")
        if anon is not None and not 0 < anon <= m.get("peak_rss_mib", 0):
            failures.append(f"anonymous memory of {node} is not within its peak RSS: {m}")
    restarts = r.get("restarts")
    if restarts is None:
        failures.append("report lacks 'restarts'")
    elif a.expect_restart is None:
        if restarts:
            failures.append(f"nodes were restarted: {restarts}")
    else:
        mine = [x for x in restarts if x.get("node") == a.expect_restart]
        if len(mine) != 1 or len(restarts) != 1:
            failures.append(f"expected one restart of {a.expect_restart}, got {restarts}")
        else:
            x = mine[0]
            chaos = cfg_round = None
            spec = r.get("configuration", {}).get("chaos") or ""
            disk = spec.endswith(":disk")
            if disk:
                spec = spec[:-len(":disk")]
            if "@" in spec:
                cfg_round = int(spec.rsplit("@", 1)[1])
            if x.get("cause") != "signal 9":
                failures.append(f"{a.expect_restart} died of {x.get('cause')}, not SIGKILL")
            if cfg_round is not None and x.get("died_in_round") != cfg_round:
                failures.append(f"{a.expect_restart} died in round {x.get('died_in_round')}, "
                                f"--chaos said {cfg_round}")
            if x.get("resumed_at_round") is None or x.get("rounds_lost") is None:
                failures.append(f"the restart does not say where it resumed: {x}")
            elif x["rounds_lost"] > 1:
                failures.append(f"the restart cost {x['rounds_lost']} rounds (at most 1: RPO)")
            if disk:
                failures += disk_recovery(r, a.expect_restart)
            print(f"restart: {x}")
    # Encrypted by default: every link mutual TLS, every node's audit log an
    # intact chain that records the handshakes and the accepted updates.
    cfg = r.get("configuration", {})
    if "--insecure-plaintext" not in demo_flags:
        if not str(cfg.get("security", "")).startswith("mtls/"):
            failures.append(f"demo links are not mutual TLS: {cfg.get('security')}")
        audit_dir = cfg.get("audit_dir", "")
        logs = sorted(glob.glob(os.path.join(audit_dir, "*.jsonl")))
        if not logs:
            failures.append(f"no audit logs in '{audit_dir}'")
        events = collections.Counter()
        for log in logs:
            v = subprocess.run([a.fedwan, "audit", "verify", log], capture_output=True, text=True)
            if v.returncode != 0:
                failures.append(f"audit log {log} does not verify: {v.stderr.strip()}")
            with open(log) as f:
                for line in f:
                    e = json.loads(line)
                    events[(e["event"], e["fields"].get("decision", ""))] += 1
        if events[("handshake", "refused")]:
            failures.append(f"{events[('handshake', 'refused')]} handshakes were refused")
        if not events[("handshake", "accepted")]:
            failures.append("no accepted handshake in the audit logs")
        if not events[("update", "accepted")]:
            failures.append("no accepted update in the audit logs")
        membership = []
        for log in logs:
            with open(log) as f:
                for line in f:
                    e = json.loads(line)
                    if e["event"] in ("member_joining", "member_joined", "member_left",
                                      "child_lost"):
                        membership.append((e["event"], e["fields"].get("peer"),
                                           e["fields"].get("round"), e["fields"].get("from")))
        if a.expect_late:
            joined = [m for m in membership if m[0] == "member_joined" and m[1] == a.expect_late]
            admitted = [m for m in membership
                        if m[0] == "member_joining" and m[1] == a.expect_late]
            if len(admitted) != 1 or len(joined) != 1 or joined[0][3] != "not_joined":
                failures.append(f"{a.expect_late} did not join late once: {membership}")
            print(f"late join: {admitted} {joined}")
        if a.expect_leave:
            site, _, rnd = a.expect_leave.partition("@")
            left = [m for m in membership if m[0] == "member_left" and m[1] == site]
            if len(left) != 1 or left[0][2] != int(rnd) - 1:
                failures.append(f"{site} did not leave once as round {rnd} began: {membership}")
            lost = [m for m in membership if m[0] == "child_lost"]
            if lost:
                failures.append(f"children were lost (waited for until the heartbeat timeout): "
                                f"{lost}")
            print(f"leave: {left}")
        if a.expect_added:
            adopted, contributed = [], 0
            for log in logs:
                with open(log) as f:
                    for line in f:
                        e = json.loads(line)
                        fields = e["fields"]
                        if (e["event"] == "topology_adopted" and
                                a.expect_added in fields.get("added", [])):
                            adopted.append((e["node"], fields.get("version")))
                        if (e["event"] == "update" and fields.get("sender") == a.expect_added
                                and fields.get("decision") == "accepted"):
                            contributed += 1
            aggregators = [n for n in (os.path.basename(x)[:-len(".jsonl")] for x in logs)
                           if n == "root" or n.startswith("region-")]
            if sorted(n for n, _ in adopted) != sorted(aggregators):
                failures.append(f"not every aggregator adopted the version adding "
                                f"{a.expect_added}: {adopted} (aggregators {aggregators})")
            joined = [m for m in membership if m[0] == "member_joined" and m[1] == a.expect_added]
            if len(joined) != 1 or joined[0][3] != "not_joined":
                failures.append(f"{a.expect_added} did not join once: {membership}")
            if contributed == 0:
                failures.append(f"{a.expect_added} never contributed an accepted update")
            print(f"added: adopted by {adopted}, joined {joined}, {contributed} accepted chunks")
    # Every node's cost records add up in the report.
    costs = r.get("costs", {})
    nodes = costs.get("nodes", {}) if isinstance(costs, dict) else {}
    if "error" in costs or not nodes:
        failures.append(f"the report's costs are missing or wrong: {costs}")
    if not costs.get("signed") or costs.get("refused"):
        failures.append(f"the nodes' cost records are not all signed and verified: {costs}")
    if costs.get("link_mismatches") and not a.expect_restart:
        # A node killed mid-round never records what it sent before it died.
        failures.append(f"a child's and its parent's byte counts differ: {costs}")
    for node, c in nodes.items():
        if c.get("rounds", 0) < 1:
            failures.append(f"{node} wrote no cost record: {c}")
        if c.get("role") == "site" and (c.get("device_seconds", 0) <= 0 or
                                        c.get("bytes_sent", 0) <= 0):
            failures.append(f"site {node}'s costs show no training or no traffic: {c}")
        print(f"audit: {len(logs)} logs verify; {dict(events)}")
    if a.cost_attacks:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cost_attacks
        failures += cost_attacks.run(a.fedwan, os.path.join(a.workdir, "run"))
    failures += kept_replicas_match_audit(a.fedwan, os.path.join(a.workdir, "run"), started)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
