#!/usr/bin/env python3
"""What each robust aggregation rule costs with no attacker: accuracy and bytes against the weighted mean.

One invocation runs the same `fedwan demo` federation (Fashion-MNIST, the
demo's non-IID Dirichlet split, mutual TLS, one seed) once per rule, with
``--aggregation rule=NAME[,params.KEY=VALUE]`` applied at every aggregator
(with ``--regions 0`` that is the root over every site, where a rule sees
all the sites' copies), and compares each with the default rule
(``weighted_mean``, streamed): the final test accuracy, its cost (the mean's
accuracy minus the rule's) and the WAN bytes (a rule runs inside an
aggregator; the updates on every link do not change). The table (Markdown)
and the figures (JSON) go to --out; the script exits 1 when, with
--bytes-tolerance, a rule moves that share more WAN bytes (the totals also
count a link's own resends and reconnects), or, with --max-cost, costs more
accuracy than that.

``--quick`` runs a short profile (2 rounds of 5 steps, the median only) that
proves the harness in CI.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

RULES = ["weighted_mean", "median", "trimmed_mean,params.trim=1", "multi_krum,params.byzantine=1"]


class CouldNotRun(Exception):
    """A demo run failed (exit 2)."""


def run_one(a: argparse.Namespace, rule: str, scratch: Path) -> Dict:
    label = rule.split(",")[0]
    report = scratch / f"{label}.json"
    work = scratch / label
    cmd = [a.cli, "demo", "--sites", str(a.sites), "--regions", str(a.regions),
           "--rounds", str(a.rounds), "-H", str(a.inner_steps), "--codec", a.codec,
           "--outer", a.outer, "--seed", str(a.seed), "--alpha", str(a.alpha),
           "--no-baseline", "--report", str(report), "--dir", str(work),
           "--aggregation", f"rule={rule}"]
    print(f"robust_rules_cost: {label}: {' '.join(cmd[1:])}", flush=True)
    started = time.monotonic()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=a.timeout)
    if done.returncode != 0 or not report.exists():
        tail = "\n".join(done.stdout.splitlines()[-20:])
        raise CouldNotRun(f"{label}: the demo exited {done.returncode}\n{tail}")
    r = json.loads(report.read_text())
    return {"rule": rule, "label": label, "final_accuracy": r.get("final_accuracy"),
            "wan_bytes": r.get("wan_bytes_total"), "seconds": round(time.monotonic() - started, 1)}


def table(rows: List[Dict], a: argparse.Namespace) -> str:
    base = rows[0]
    out = [f"Fashion-MNIST, {a.sites} sites, {a.regions} regions, {a.rounds} rounds x "
           f"{a.inner_steps} steps, alpha {a.alpha} (non-IID), codec {a.codec}, outer {a.outer}, "
           f"seed {a.seed}, mutual TLS, no attacker", "",
           "| rule | final accuracy | cost vs weighted_mean | WAN bytes | bytes vs weighted_mean "
           "| seconds |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        cost = base["final_accuracy"] - r["final_accuracy"]
        ratio = r["wan_bytes"] / base["wan_bytes"] if base["wan_bytes"] else float("nan")
        out.append(f"| {r['rule'].replace(',', ', ')} | {r['final_accuracy']:.4f} | {cost:+.4f} | "
                   f"{r['wan_bytes']} | {ratio:.4f} | {r['seconds']} |")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cli", default="fedwan", help="the fedwan binary")
    p.add_argument("--rules", default=";".join(RULES[1:]),
                   help="rules after weighted_mean, ';' separated, each NAME[,params.KEY=VALUE]")
    p.add_argument("--sites", type=int, default=4)
    p.add_argument("--regions", type=int, default=0)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--inner-steps", type=int, default=25)
    p.add_argument("--codec", default="fp16")
    p.add_argument("--outer", default="diloco")
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-cost", type=float, default=None,
                   help="exit 1 when a rule costs more accuracy than this")
    p.add_argument("--bytes-tolerance", type=float, default=None,
                   help="exit 1 when a rule moves this share more WAN bytes than the mean "
                        "(default: not judged)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default="robust-rules-cost")
    p.add_argument("--quick", action="store_true", help="a short profile for CI")
    a = p.parse_args()
    rules = ["weighted_mean"] + [r for r in a.rules.split(";") if r]
    if a.quick:
        a.rounds, a.inner_steps = 2, 5
        rules = ["weighted_mean", "median"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="fedwan-rules-") as tmp:
            for rule in rules:
                rows.append(run_one(a, rule, Path(tmp)))
    except (CouldNotRun, subprocess.TimeoutExpired) as e:
        print(f"robust_rules_cost: {e}", file=sys.stderr)
        return 2
    text = table(rows, a)
    base = rows[0]["final_accuracy"]
    over: List[str] = []
    for r in rows[1:]:
        r["cost"] = base - r["final_accuracy"]
        if a.max_cost is not None and r["cost"] > a.max_cost:
            over.append(f"{r['rule']} costs {r['cost']:.4f} (at most {a.max_cost})")
        # A rule runs inside an aggregator: every link carries the same
        # updates. The totals also count what the links did on their own (a
        # chunk resent after a stall, a handshake again after a reconnect on
        # a loaded machine), hence the tolerance.
        if (a.bytes_tolerance is not None
                and r["wan_bytes"] > rows[0]["wan_bytes"] * (1 + a.bytes_tolerance)):
            over.append(f"{r['rule']} moved {r['wan_bytes']} WAN bytes, the weighted mean "
                        f"{rows[0]['wan_bytes']} (tolerance {a.bytes_tolerance})")
    (out / "robust_rules_cost.md").write_text(text)
    (out / "robust_rules_cost.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(text)
    print(f"robust_rules_cost: wrote {out}/robust_rules_cost.{{md,json}}")
    for o in over:
        print(f"robust_rules_cost: OVER {o}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
