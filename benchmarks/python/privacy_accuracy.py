#!/usr/bin/env python3
"""Fashion-MNIST accuracy under site-level differential privacy.

One invocation runs the same `fedwan demo` federation (same seed, split,
rounds and settings) once without differential privacy and once per target
epsilon, with ``--privacy mode=MODE,clip=C,target_epsilon=E,delta=D``: the
noise multiplier is the smallest whose rounds spend E (fedwan's accountant,
which agrees with Google's dp-accounting). Each run's final test accuracy
comes from the demo's JSON report; the table (Markdown), the figures (JSON)
and a plot (PNG, when matplotlib is installed) go to --out.

``--quick`` runs a tiny federation (the synthetic trainer, two rounds): it
proves the harness, not the figures.

Exit status: 0, or 2 when a run could not be made.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional


class CouldNotRun(Exception):
    """A demo run failed or wrote no report (exit 2)."""


def demo_args(a: argparse.Namespace, privacy: Optional[str], report: Path, work: Path) -> List[str]:
    cmd = [a.cli, "demo", "--sites", str(a.sites), "--regions", str(a.regions),
           "--rounds", str(a.rounds), "-H", str(a.inner_steps), "--codec", a.codec,
           "--outer", a.outer, "--seed", str(a.seed), "--alpha", str(a.alpha),
           "--no-baseline", "--insecure-plaintext", "--report", str(report), "--dir", str(work)]
    if a.quick:
        cmd += ["--trainer", "synthetic"]
    if privacy:
        cmd += ["--privacy", privacy]
    return cmd


def run_one(a: argparse.Namespace, label: str, privacy: Optional[str], scratch: Path) -> Dict:
    report = scratch / f"{label}.json"
    work = scratch / label
    cmd = demo_args(a, privacy, report, work)
    print(f"privacy_accuracy: {label}: {' '.join(cmd[1:])}", flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=a.timeout)
    if done.returncode != 0 or not report.exists():
        tail = "\n".join(done.stdout.splitlines()[-20:])
        raise CouldNotRun(f"{label}: the demo exited {done.returncode}\n{tail}")
    r = json.loads(report.read_text())
    return {"label": label, "privacy": privacy or "off",
            "final_accuracy": r.get("final_accuracy"),
            "final_loss": r.get("final_loss"),
            "privacy_epsilon": (r.get("privacy") or {}).get("epsilon"),
            "noise_multiplier": (r.get("privacy") or {}).get("noise_multiplier"),
            "wan_bytes": r.get("wan_bytes_total")}


def table(rows: List[Dict], a: argparse.Namespace) -> str:
    adaptive = (f" (adaptive, target quantile {a.target_quantile}, rate {a.clip_learning_rate})"
                if a.target_quantile else "")
    out = [f"Fashion-MNIST, {a.sites} sites, {a.regions} regions, {a.rounds} rounds x "
           f"{a.inner_steps} steps, alpha {a.alpha}, codec {a.codec}, outer {a.outer}, "
           f"seed {a.seed}; mode {a.mode}, clip {a.clip}"
           f"{adaptive}, "
           f"delta {a.delta}", "",
           "| run | epsilon (target) | noise multiplier | epsilon spent | final accuracy |",
           "|---|---|---|---|---|"]
    for r in rows:
        def f(v, fmt):
            return "-" if v is None else format(v, fmt)
        out.append(f"| {r['label']} | {r.get('target', '-')} | {f(r['noise_multiplier'], '.3f')} | "
                   f"{f(r['privacy_epsilon'], '.3f')} | {f(r['final_accuracy'], '.4f')} |")
    return "\n".join(out) + "\n"


def plot(rows: List[Dict], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    dp = [r for r in rows if r.get("target") is not None and r["final_accuracy"] is not None]
    base = [r for r in rows if r.get("target") is None]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["target"] for r in dp], [r["final_accuracy"] for r in dp], "o-", label="with DP")
    if base and base[0]["final_accuracy"] is not None:
        ax.axhline(base[0]["final_accuracy"], color="grey", linestyle="--", label="without DP")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon (delta 1e-5)")
    ax.set_ylabel("final test accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cli", default="fedwan", help="the fedwan binary")
    p.add_argument("--epsilons", default="1,3,8", help="target epsilons, comma separated")
    p.add_argument("--mode", default="central", choices=["central", "local"])
    p.add_argument("--clip", type=float, default=1.0,
                   help="the clip (with --target-quantile: where the adaptive clip starts)")
    p.add_argument("--target-quantile", type=float, default=0.0,
                   help="adaptive clipping toward this quantile of the update norms (0: fixed)")
    p.add_argument("--clip-learning-rate", type=float, default=0.2,
                   help="with --target-quantile: how fast the clip moves each round")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--sites", type=int, default=4)
    p.add_argument("--regions", type=int, default=0)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--inner-steps", type=int, default=25)
    p.add_argument("--codec", default="fp32")
    p.add_argument("--outer", default="fedavg")
    p.add_argument("--alpha", type=float, default=100.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", default="privacy-accuracy")
    p.add_argument("--quick", action="store_true", help="a tiny synthetic federation")
    a = p.parse_args()
    if a.quick:
        a.rounds, a.inner_steps = 2, 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="fedwan-dp-") as tmp:
            scratch = Path(tmp)
            rows.append(run_one(a, "no-dp", None, scratch))
            for e in [float(x) for x in a.epsilons.split(",") if x]:
                privacy = f"mode={a.mode},clip={a.clip},target_epsilon={e},delta={a.delta}"
                if a.target_quantile > 0:
                    privacy += (f",target_quantile={a.target_quantile}"
                                f",clip_learning_rate={a.clip_learning_rate}")
                row = run_one(a, f"eps-{e:g}", privacy, scratch)
                row["target"] = e
                if row["privacy_epsilon"] is None or row["privacy_epsilon"] > e * 1.0001:
                    raise CouldNotRun(f"eps-{e:g}: the run spent epsilon {row['privacy_epsilon']}")
                rows.append(row)
    except (CouldNotRun, subprocess.TimeoutExpired) as e:
        print(f"privacy_accuracy: {e}", file=sys.stderr)
        return 2
    text = table(rows, a)
    (out / "privacy_accuracy.md").write_text(text)
    (out / "privacy_accuracy.json").write_text(json.dumps(rows, indent=2) + "\n")
    plotted = plot(rows, out / "privacy_accuracy.png")
    print(text)
    print(f"privacy_accuracy: wrote {out}/privacy_accuracy.{{md,json}}"
          + (" and .png" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
