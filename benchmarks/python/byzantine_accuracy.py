#!/usr/bin/env python3
"""One dishonest site of four, real processes: what each attack does to the model, with the default checks and with them off.

Every run is the same `fedwan demo` federation (Fashion-MNIST, mutual TLS, the
demo's non-IID split and regions, one seed). Reference runs: every site
honest ("honest"), and the dishonest site absent ("absent": it leaves before
training, so its data is lost and nothing else changes). Then, for each
attack, site-3 runs `fedwan-dishonest-site` (tests/tools/dishonest_site.cpp),
which rewrites its own updates after its encoder and before sealing, so they
reach its region as valid frames on its own authenticated session: once with
the default aggregation settings and once with every check off
(``--aggregation finite_check=false,max_abs=0,replay_window=0,norm_bound.mode=off``).

A row records the demo's exit code, the final test accuracy and its distance
from "absent", and how many of the attacker's (round, chunk) copies the
aggregators' audit logs record as refused or clipped. With the checks on,
every listed attack must leave the federation finished with an accuracy
within --tolerance of "absent" and each tampered copy audited; the script
exits 1 otherwise (the checks-off rows are recorded, never judged). The
table (Markdown) and the figures (JSON) go to --out.

``--quick`` runs a short profile (3 rounds of 5 steps, three attacks, checks
on only) that proves the harness in CI.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

ATTACKS = ["scale_1e3", "scale_1e6", "sign_flip_x10", "one_nan", "one_inf", "one_huge",
           "noise_100x", "replay_round_0"]
# Within the default norm bound (4 x the median): recorded, not judged.
RECORDED_ONLY = ["sign_flip_x3"]
CHECKS_OFF = "finite_check=false,max_abs=0,replay_window=0,norm_bound.mode=off"
ATTACKER = "site-3"


class CouldNotRun(Exception):
    """A reference run failed (exit 2)."""


def demo_cmd(a: argparse.Namespace, report: Path, work: Path) -> List[str]:
    cmd = [a.cli, "demo", "--sites", "4", "--regions", str(a.regions),
           "--rounds", str(a.rounds), "-H", str(a.inner_steps), "--codec", a.codec,
           "--outer", a.outer, "--seed", str(a.seed), "--alpha", str(a.alpha),
           "--max-restarts", "0", "--no-baseline", "--report", str(report), "--dir", str(work)]
    return cmd


def judged_copies(audit_dir: Path) -> Tuple[Set[Tuple[int, int]], Set[Tuple[int, int]]]:
    """(round, chunk) pairs of the attacker's copies seen by an aggregator, and those refused or clipped."""
    seen: Set[Tuple[int, int]] = set()
    bad: Set[Tuple[int, int]] = set()
    for log in sorted(audit_dir.glob("*.jsonl")):
        if log.name.startswith("site-"):
            continue
        for line in log.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if e.get("event") not in ("update", "update_verdict"):
                continue
            f = e.get("fields", {})
            if f.get("sender") != ATTACKER:
                continue
            key = (int(f.get("round", -1)), int(f.get("chunk", -1)))
            seen.add(key)
            if f.get("decision") in ("refused", "clipped"):
                bad.add(key)
    return seen, bad


def run_one(a: argparse.Namespace, label: str, scratch: Path, attack: Optional[str] = None,
            checks: bool = True, extra: Optional[List[str]] = None) -> Dict:
    report = scratch / f"{label}.json"
    work = scratch / label
    cmd = demo_cmd(a, report, work) + (extra or [])
    env = dict(os.environ)
    if attack is not None:
        cmd += ["--node-binary", f"{ATTACKER}={a.dishonest}"]
        env["FEDWAN_ATTACK"] = attack
    aggregation = ([f"rule={a.rule}"] if a.rule else []) + ([] if checks else [CHECKS_OFF])
    if aggregation:
        cmd += ["--aggregation", ",".join(aggregation)]
    print(f"byzantine_accuracy: {label}: {' '.join(cmd[1:])}", flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=a.timeout, env=env)
        rc: Optional[int] = done.returncode
        out = done.stdout
    except subprocess.TimeoutExpired as e:
        rc = None
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    seconds = time.monotonic() - started
    r = json.loads(report.read_text()) if report.exists() else {}
    seen, bad = judged_copies(work / "audit") if (work / "audit").is_dir() else (set(), set())
    failure = None
    if rc != 0:
        lines = [x for x in out.splitlines() if x.strip()]
        failure = "timed out" if rc is None else (lines[-1] if lines else f"exit {rc}")
    return {"label": label, "attack": attack or "-", "checks": "default" if checks else "off",
            "exit": rc, "final_accuracy": r.get("final_accuracy"), "seconds": round(seconds, 1),
            "attacker_copies": len(seen), "refused_or_clipped": len(bad), "failure": failure}


def expected_bad(row: Dict, rounds: int) -> int:
    """Tampered copies: every round's, but the replay's first round is its own honest update."""
    copies = row["attacker_copies"]
    if row["attack"] == "replay_round_0":
        return max(0, copies - copies // rounds) if rounds > 0 else 0
    return copies


def judge(rows: List[Dict], absent: Optional[float], a: argparse.Namespace) -> List[str]:
    problems = []
    for r in rows:
        if r["checks"] != "default" or r["attack"] in ("-",) + tuple(RECORDED_ONLY):
            continue
        acc = r["final_accuracy"]
        if r["exit"] != 0:
            problems.append(f"{r['label']}: the federation did not finish ({r['failure']})")
        elif acc is None or absent is None or abs(acc - absent) > a.tolerance:
            problems.append(f"{r['label']}: accuracy {acc} against {absent} with the site absent "
                            f"(tolerance {a.tolerance})")
        need = expected_bad(r, a.rounds)
        if r["attacker_copies"] == 0 or r["refused_or_clipped"] < need:
            problems.append(f"{r['label']}: {r['refused_or_clipped']} of the attacker's "
                            f"{r['attacker_copies']} copies audited refused or clipped, "
                            f"{need} expected")
    return problems


def table(rows: List[Dict], absent: Optional[float], a: argparse.Namespace) -> str:
    out = [f"Fashion-MNIST, 4 sites ({ATTACKER} dishonest), {a.regions} regions, {a.rounds} rounds "
           f"x {a.inner_steps} steps, alpha {a.alpha}, codec {a.codec}, outer {a.outer}, "
           f"seed {a.seed}, mutual TLS, rule {a.rule or 'weighted_mean'}", "",
           "| attack | checks | finished | final accuracy | vs absent | attacker copies refused "
           "or clipped | seconds |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = r["final_accuracy"]
        diff = "-" if acc is None or absent is None else f"{acc - absent:+.4f}"
        done = "yes" if r["exit"] == 0 else f"no: {r['failure']}"
        copies = ("-" if r["attack"] == "-"
                  else f"{r['refused_or_clipped']} of {r['attacker_copies']}")
        out.append(f"| {r['label'] if r['attack'] == '-' else r['attack']} | {r['checks']} | "
                   f"{done} | {'-' if acc is None else format(acc, '.4f')} | {diff} | {copies} | "
                   f"{r['seconds']} |")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cli", default="fedwan", help="the fedwan binary")
    p.add_argument("--dishonest", default="fedwan-dishonest-site",
                   help="the dishonest site's binary (tests/tools/dishonest_site.cpp)")
    p.add_argument("--attacks", default=",".join(ATTACKS + RECORDED_ONLY),
                   help="comma separated, of: " + ", ".join(ATTACKS + RECORDED_ONLY))
    p.add_argument("--checks", default="both", choices=["both", "default", "off"])
    p.add_argument("--regions", type=int, default=2)
    p.add_argument("--rule", default="",
                   help="every aggregator's rule, NAME[,params.KEY=VALUE] (default: the "
                        "topology's default, weighted_mean), in every run")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--inner-steps", type=int, default=25)
    p.add_argument("--codec", default="fp16")
    p.add_argument("--outer", default="diloco")
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=0.02)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default="byzantine-accuracy")
    p.add_argument("--quick", action="store_true", help="a short profile for CI")
    a = p.parse_args()
    attacks = [x for x in a.attacks.split(",") if x]
    unknown = [x for x in attacks if x not in ATTACKS + RECORDED_ONLY]
    if unknown:
        p.error(f"unknown attack(s): {', '.join(unknown)}")
    if a.quick:
        a.rounds, a.inner_steps, a.checks = 3, 5, "default"
        attacks = ["scale_1e6", "one_nan", "replay_round_0"]
    modes = {"both": [True, False], "default": [True], "off": [False]}[a.checks]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict] = []
    with tempfile.TemporaryDirectory(prefix="fedwan-byz-") as tmp:
        scratch = Path(tmp)
        try:
            for label, extra in (("honest", None), ("absent", ["--leave", f"{ATTACKER}@1"])):
                row = run_one(a, label, scratch, extra=extra)
                if row["exit"] != 0:
                    raise CouldNotRun(f"{label}: {row['failure']}")
                rows.append(row)
        except CouldNotRun as e:
            print(f"byzantine_accuracy: a reference run failed: {e}", file=sys.stderr)
            return 2
        absent = rows[1]["final_accuracy"]
        for checks in modes:
            for attack in attacks:
                label = f"{attack}-{'default' if checks else 'off'}"
                rows.append(run_one(a, label, scratch, attack=attack, checks=checks))
    text = table(rows, absent, a)
    problems = judge(rows, absent, a)
    (out / "byzantine_accuracy.md").write_text(text)
    (out / "byzantine_accuracy.json").write_text(
        json.dumps({"absent_accuracy": absent, "rows": rows, "problems": problems}, indent=2) + "\n")
    print(text)
    print(f"byzantine_accuracy: wrote {out}/byzantine_accuracy.{{md,json}}")
    for pr in problems:
        print(f"byzantine_accuracy: FAILED {pr}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
