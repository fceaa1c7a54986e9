#!/usr/bin/env python3
"""Where the root's CPU goes, by thread, with and without its crypto threads.

A parent's link opens its children's frames and seals a turn's frames for
several children on threads beside the aggregator's event loop
(``FEDWAN_CRYPTO_THREADS``; docs/architecture.md, "Several cores for one
link"). This harness runs the same loopback federation (``fedwan demo``:
real node processes, mutual TLS, the data path alone: no checkpoints, and
no audit log unless ``--audit-log`` is given) with the crypto threads off (``FEDWAN_CRYPTO_THREADS=0``, the
baseline) and with each setting asked for, alternating, and reads the
root's threads from ``/proc`` while it runs: the event loop (the process's
main thread), the crypto threads (``fedwan-crypto``) and ZeroMQ's I/O
thread. Each setting runs ``--short`` and ``--long`` rounds; the difference
over the difference of rounds is what a steady round costs each thread,
start-up and the first round left out. The crypto threads also take the
digest of each update's payload (SHA-256 with the audit log, else the
replay check's fingerprint) and the codec's check of it where they opened
its frame.

It prints, per setting, the CPU seconds a round costs each of the root's
threads and all of them, and the median round time (rounds after the
first, of the longer run), each against the baseline's of the same
invocation. The event loop's figure is the root's critical path: what it
does not do, it no longer holds a round up for, where the machine has a
core for the crypto threads. The root's total says what moving the work
costs.

Exit status: 0, or 2 when something could not run. Run ``--help`` for the
options.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional


class CouldNotRun(Exception):
    pass


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def root_of(demo_pid: int) -> Optional[int]:
    """The demo's aggregator child (the root: the demo runs no regions)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == demo_pid and len(argv) > 1 and argv[1] == b"aggregator":
            return int(entry)
    return None


def threads_cpu(pid: int, seen: Dict[int, tuple]) -> None:
    """Records in `seen` the CPU seconds (user + system) of each of the
    process's threads by thread id, with its role: main, crypto
    (fedwan-crypto), zmq-io or other. A thread that ended keeps its last
    reading (threads end before the process does)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        if int(tid) == pid:
            role = "main"
        elif comm == "fedwan-crypto":
            role = "crypto"
        elif comm.startswith("ZMQbg/IO"):
            role = "zmq-io"
        else:
            role = "other"
        seen[int(tid)] = (role, cpu)


def run_demo(args, rounds: int, threads: str, workdir: Path) -> Dict[str, object]:
    tag = f"{threads}-{rounds}"
    report = workdir / f"report-{tag}.json"
    run_dir = workdir / f"run-{tag}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [str(args.fedwan), "demo", "--trainer", "synthetic",
           "--synthetic-size", str(args.params), "--regions", "0",
           "--sites", str(args.sites), "--rounds", str(rounds), "-H", "1",
           "--codec", args.codec, "--no-baseline", "--no-checkpoints",
           "--report", str(report), "--dir", str(run_dir)]
    if not args.audit_log:
        cmd.append("--no-audit-log")
    env = dict(os.environ)
    if threads == "auto":
        env.pop("FEDWAN_CRYPTO_THREADS", None)
    else:
        env["FEDWAN_CRYPTO_THREADS"] = threads
    seen: Dict[int, tuple] = {}
    log_path = workdir / f"demo-{tag}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        root = None
        # The root's threads, read every 10 ms until it exits: each one's
        # last reading stands.
        while proc.poll() is None:
            if root is None:
                root = root_of(proc.pid)
            if root is not None:
                threads_cpu(root, seen)
            time.sleep(0.01)
    last: Dict[str, float] = {}
    for role, cpu in seen.values():
        last[role] = last.get(role, 0.0) + cpu
    shutil.rmtree(run_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise CouldNotRun(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                          f"{log_path.read_text()[-1500:]}")
    if not last:
        raise CouldNotRun("the root's threads could not be read from /proc")
    r = json.loads(report.read_text())
    return {"threads": last, "round_seconds": [float(x["seconds"]) for x in r["rounds"]]}


def steady(args, threads: str, workdir: Path) -> Dict[str, object]:
    tries = args.tries
    for attempt in range(1, tries + 1):
        short = run_demo(args, args.short, threads, workdir)
        long = run_demo(args, args.long, threads, workdir)
        rounds = args.long - args.short
        roles = set(short["threads"]) | set(long["threads"])
        per_round = {role: (long["threads"].get(role, 0.0) - short["threads"].get(role, 0.0))
                     / rounds for role in roles}
        per_round["root"] = sum(v for k, v in per_round.items() if k != "root")
        said = per_round.get("main", 0.0) > 0 and per_round["root"] > 0
        if said or attempt == tries:
            return {"per_round": per_round, "unreliable": not said,
                    "round_s": statistics.median(long["round_seconds"][1:]
                                                 or long["round_seconds"])}
        # Start-up that varies between runs (first rounds, the machine's
        # other work) outweighed the extra rounds: the pair says nothing.
        print(f"crypto_threads: {threads} threads: the {args.long}-round run cost the root no "
              f"more than the {args.short}-round one (try {attempt} of {tries}); measuring again",
              file=sys.stderr)
    raise AssertionError("unreachable")


def measure(args) -> Dict[str, object]:
    settings = ["0"] + [s for s in args.threads.split(",") if s != "0"]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fedwan-crypto-threads-"))
    workdir.mkdir(parents=True, exist_ok=True)
    runs: Dict[str, List[Dict[str, object]]] = {s: [] for s in settings}
    try:
        for _ in range(args.repeats):
            for s in settings:  # alternating: the machine's drift hits every setting
                runs[s].append(steady(args, s, workdir))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    result: Dict[str, object] = {}
    for s, rs in runs.items():
        roles = sorted({role for r in rs for role in r["per_round"]})
        result[s] = {
            "per_round": {role: statistics.median(r["per_round"].get(role, 0.0) for r in rs)
                          for role in roles},
            "round_s": statistics.median(r["round_s"] for r in rs),
            "unreliable": sum(1 for r in rs if r.get("unreliable")),
            "runs": rs,
        }
    return result


def print_result(args, result) -> None:
    base = result["0"]
    what = "data path and audit log" if args.audit_log else "data path"
    print(f"root of {args.sites} sites, {args.params:,} parameters {args.codec}, mutual TLS, "
          f"{what}; rounds {args.short} and {args.long}, median of {args.repeats}")
    print(f"{'crypto threads':>14} {'event loop':>14} {'crypto':>8} {'zmq io':>8} "
          f"{'root':>14} {'round':>14}")
    for s, r in result.items():
        pr = r["per_round"]

        def vs(key: str) -> str:
            b = base["per_round"].get(key, 0.0)
            ratio = pr.get(key, 0.0) / b if b > 0 else float("nan")
            return f"{pr.get(key, 0.0):6.3f} ({ratio:4.2f})"
        ratio_round = r["round_s"] / base["round_s"] if base["round_s"] > 0 else float("nan")
        mark = " *" if r["unreliable"] else ""
        print(f"{s:>14} {vs('main'):>14} {pr.get('crypto', 0.0):8.3f} "
              f"{pr.get('zmq-io', 0.0):8.3f} {vs('root'):>14} "
              f"{r['round_s']:6.3f} ({ratio_round:4.2f}){mark}")
    print("CPU seconds a steady round costs the root's threads, and its median round in "
          "seconds; in brackets, against 0 crypto threads measured in the same invocation")
    if any(r["unreliable"] for r in result.values()):
        print("* among its pairs, one whose longer run cost the root no more than its shorter "
              f"one in {args.tries} tries: start-up outweighed the extra rounds; lengthen --long")


def main(argv=None) -> int:
    here = Path(__file__).resolve().parents[2]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fedwan", type=Path, default=here / "build/bin/fedwan")
    p.add_argument("--params", type=int, default=100_000_000)
    p.add_argument("--sites", type=int, default=2)
    p.add_argument("--codec", default="fp16")
    p.add_argument("--short", type=int, default=3, help="rounds of the shorter run")
    p.add_argument("--long", type=int, default=9, help="rounds of the longer run")
    p.add_argument("--repeats", type=int, default=3, help="pairs per setting, alternating")
    p.add_argument("--threads", default="auto",
                   help="settings beside the baseline 0, comma separated: numbers or auto")
    p.add_argument("--tries", type=int, default=3,
                   help="pairs of runs tried per measurement while the longer costs no more")
    p.add_argument("--audit-log", action="store_true",
                   help="with the nodes' audit logs (the default of a federation)")
    p.add_argument("--workdir", default=None, help="where the runs write (default: the temp dir)")
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args(argv)
    if args.long <= args.short or args.short < 1:
        p.error("--long must be more than --short, and --short at least 1")
    if args.tries < 1:
        p.error("--tries must be at least 1")
    for s in args.threads.split(","):
        if s != "auto" and not s.isdigit():
            p.error(f"--threads: {s!r} is neither a number nor auto")
    if not args.fedwan.exists():
        print(f"crypto_threads: {args.fedwan} not found (build fedwan first)", file=sys.stderr)
        return 2
    try:
        result = measure(args)
    except CouldNotRun as e:
        print(f"crypto_threads: could not run: {e}", file=sys.stderr)
        return 2
    print_result(args, result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
