#!/usr/bin/env python3
"""CPU per byte of a whole federation, beside memcpy, AES-256-GCM and SHA-256.

A loopback federation (``fedwan demo``: real node processes, mutual TLS,
sealed frames, checkpoints and replicas as configured by default) is run
twice with the same settings, once for ``--short`` rounds and once for
``--long``; the difference of the two runs' CPU time (user + system of
every node process, as the demo's report gives it) over the difference of
their rounds is the CPU a steady round costs, with process start, key
provisioning, the initial model and the first checkpoint left out. The
fp32-equivalent bytes a round moves (every site's update up and every
anchor down, as the demo's report counts them) over that CPU time is the
figure: GB of model moved per CPU-second, all nodes together.

Three configurations are measured: the demo's defaults (checkpoints at
every round boundary, replicas to the parent, the audit log); the same
without checkpoints and replicas (``--no-checkpoints``): the data path with
its audit log; and the data path alone (``--no-checkpoints
--no-audit-log``), as nodes run it by default (``fedwan site`` and
``fedwan aggregator`` keep an audit log only when given ``--audit-log``).
The gate applies to the last: mutual TLS, every byte sealed and opened.
The others say what the audit log and durability cost on top.

In the same invocation it measures, on one core, ``memcpy`` (256 MiB
buffers), raw AES-256-GCM (by the library the nodes seal with, as
``FEDWAN_AEAD_LIBRARY`` or its default picks it, and by OpenSSL beside it),
SHA-256 and the fingerprint an aggregator tells
replayed copies by without an audit log (``fedwan_micro_bench``, a 4 MiB
chunk's fp16 payload): what the machine allows for the operations every
byte needs at least once. From these and the bytes a round puts on the
links it prints each data path's cryptographic floor: the CPU time of
sealing and opening every byte, and of the audit log's digest of every
update at its sender and at the root (or, without the log, the root's
fingerprint of every update). It measures too what the links' transport
costs a byte (``BM_Transport_Loopback``: one default chunk's fp16 frame
after another from one ZeroMQ context to another over loopback TCP, the CPU
time of both ends and of the kernel's work for them) and prints the data
path's floor of transport and cryptography together: what is left above it
is fedwan's own work on the bytes.

Each site takes ``-H`` synthetic training steps a round. What they cost
(the CPU time of the thread that takes them, from each site's report, as
the demo's ``cpu.training_s`` sums it) is taken out of the pipeline's
figure: the steps stand in for training, which is not what is measured.
Both figures are printed.

A pair of runs whose longer run cost less than its shorter in some part
(user or system time, a node, the training: the shorter run disturbed, by
the host reclaiming the page cache an earlier run filled or by other load)
says nothing about a round; it is measured again (``--pair-tries``), and
the medians take the consistent pairs. A gated figure with none is
UNMEASURED, never a PASS.

Exit status: 0 (PASS, or FAIL or UNMEASURED without ``--gate``), 1 (FAIL
with ``--gate``), 2 (something could not run, or UNMEASURED with
``--gate``). Run ``--help`` for the options.
"""

import argparse
import ctypes
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

GATE_GB_PER_CPU_S = 1.0


class CouldNotRun(Exception):
    """Something the measurement needs is missing or failed (exit 2)."""


def memcpy_rate(size: int = 256 << 20, repeats: int = 5) -> float:
    """memcpy bytes per second on one core, over buffers larger than the
    caches (as a model's are); the best of a few copies (libc's memmove,
    through ctypes)."""
    src = (ctypes.c_char * size).from_buffer(bytearray(b"\x01") * size)
    dst = (ctypes.c_char * size).from_buffer(bytearray(size))
    ctypes.memmove(dst, src, size)  # the pages are touched before the timing
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        ctypes.memmove(dst, src, size)
        best = min(best, time.perf_counter() - t)
    return size / best


def micro_result(micro: Path, what: str, chunk: int = 4 << 20, timing: str = "real_time",
                 env: Optional[Dict[str, str]] = None) -> Dict:
    """The micro benchmark BM_<what> over one fp32 chunk of `chunk` bytes
    (its fp16 payload), as Google Benchmark's JSON reports it; `env` is
    added to this process's environment for the run."""
    if not micro.exists():
        raise CouldNotRun(f"{micro} is missing; build the target fedwan_micro_bench")
    name = f"BM_{what}/{chunk}/{timing}"
    out = subprocess.run(
        [str(micro), f"--benchmark_filter=^BM_{what}/{chunk}/",
         "--benchmark_format=json", "--benchmark_min_time=0.3"],
        capture_output=True, text=True, check=False, env={**os.environ, **(env or {})})
    if out.returncode != 0:
        raise CouldNotRun(f"{micro} failed: {out.stderr.strip()[-400:]}")
    for b in json.loads(out.stdout)["benchmarks"]:
        if b["name"] == name:
            return b
    raise CouldNotRun(f"{micro} did not report {name}")


def micro_rate(micro: Path, what: str, chunk: int = 4 << 20, timing: str = "real_time",
               env: Optional[Dict[str, str]] = None) -> float:
    """Bytes per second of micro_result's benchmark: on one core for
    BM_Seal_* (wall-clock time of one thread), per CPU-second of every
    thread for BM_Transport_* (process time)."""
    return float(micro_result(micro, what, chunk, timing, env)["bytes_per_second"])


def machine_rates(micro: Path) -> Tuple[Dict[str, float], str]:
    """What one core of this machine does for the operations every byte
    needs at least once: a copy, AES-256-GCM (by the library the nodes seal
    with, and by OpenSSL beside it), SHA-256 (the audit log's digests) and
    the replay fingerprint (XXH3)."""
    aes = micro_result(micro, "Seal_RawAes256Gcm")
    return {"memcpy": memcpy_rate(), "aes_256_gcm": float(aes["bytes_per_second"]),
            "aes_256_gcm_openssl": micro_rate(micro, "Seal_RawAes256Gcm",
                                              env={"FEDWAN_AEAD_LIBRARY": "openssl"}),
            "sha256": micro_rate(micro, "Seal_Sha256"),
            "fingerprint": micro_rate(micro, "Seal_Fingerprint"),
            # The demo's chunks (1 MiB of fp32): the frame size sets how much
            # each read and write moves, which the transport's cost follows.
            "loopback": micro_rate(micro, "Transport_Loopback", 1 << 20, "process_time")}, \
        aes.get("label", "")


def crypto_floor(wire_bytes: float, rates: Dict[str, float], audit: bool) -> float:
    """CPU seconds the data path's cryptography alone costs for a round that
    puts `wire_bytes` on the links of a root and its sites: every byte sealed
    by its sender and opened by its receiver (AES-256-GCM), and every update
    byte hashed by its sender and by the root for their audit entries
    (SHA-256; the updates taken as half the bytes, as the anchors that come
    down have their size) or, without audit logs, fingerprinted by the root
    for its replay check. Under regions the updates are hashed at every
    hop, so there it is a lower bound."""
    digests = wire_bytes / rates["sha256"] if audit else wire_bytes / 2 / rates["fingerprint"]
    return 2 * wire_bytes / rates["aes_256_gcm"] + digests


def transport_floor(wire_bytes: float, rates: Dict[str, float]) -> float:
    """CPU seconds the links' transport alone costs for a round that puts
    `wire_bytes` on them: each byte through ZeroMQ and loopback TCP from
    its sender's process to its receiver's (BM_Transport_Loopback, both
    ends and the kernel's work for them)."""
    return wire_bytes / rates["loopback"]


# name, demo flags, whether the nodes keep an audit log
CONFIGS = (("defaults", [], True),  # checkpoints, replicas, audit
           ("no checkpoints", ["--no-checkpoints"], True),  # the data path and its audit
           ("data path", ["--no-checkpoints", "--no-audit-log"], False))  # the gated one


def run_demo(args, rounds: int, workdir: Path, extra: List[str]) -> Dict[str, float]:
    """One federation: its CPU seconds (the training's among them), fp32
    bytes and wall seconds."""
    tag = f"{rounds}-{len(extra)}"
    report = workdir / f"report-{tag}.json"
    run_dir = workdir / f"run-{tag}"
    log_path = workdir / f"demo-{tag}.log"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [str(args.fedwan), "demo", "--trainer", "synthetic",
           "--synthetic-size", str(args.params), "--regions", str(args.regions),
           "--sites", str(args.sites), "--rounds", str(rounds), "-H", str(args.inner_steps),
           "--codec", args.codec, "--outer", args.outer, "--no-baseline",
           "--report", str(report), "--dir", str(run_dir)] + extra + args.demo_arg
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    code = os.waitstatus_to_exitcode(status)
    shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints: gigabytes
    if code != 0:
        raise CouldNotRun(f"{' '.join(cmd)} exited {code}:\n{log_path.read_text()[-1500:]}")
    r = json.loads(report.read_text())
    # The nodes' CPU time (the demo's report, from wait4 on each node
    # process), not the demo's own supervising.
    user, system = float(r["cpu"]["user_s"]), float(r["cpu"]["system_s"])
    if "training_s" not in r["cpu"]:
        raise CouldNotRun(f"{args.fedwan} reports no training CPU (cpu.training_s): too old")
    # Each node's CPU time besides its training steps.
    nodes = {node: float(t["user_s"]) + float(t["system_s"]) - float(t.get("training_s", 0.0))
             for node, t in r["cpu"]["nodes"].items()}
    return {"cpu": user + system, "user": user, "system": system, "nodes": nodes,
            "training": float(r["cpu"]["training_s"]),
            "demo_cpu": usage.ru_utime + usage.ru_stime,
            "fp32_bytes": float(r["fp32_bytes_total"]),
            "wire_bytes": float(r["wan_bytes_total"]),
            "wall": wall, "round_seconds": [float(x["seconds"]) for x in r["rounds"]]}


def steady(args, workdir: Path, extra: List[str]) -> Dict[str, float]:
    """The per-round figures of one configuration: two runs, differenced.
    A pair whose longer run cost less user or system time, training or CPU
    of a node than its shorter one (the shorter run disturbed: the host
    reclaiming the page cache an earlier run filled, another load) says
    nothing about a round: it is measured again, and kept marked
    inconsistent only after --pair-tries."""
    for attempt in range(1, args.pair_tries + 1):
        r = steady_pair(args, workdir, extra)
        bad = [k for k in r if (k.endswith("_per_round") and not k.startswith(("fp32_", "wire_"))
                                and not r[k] > 0)]
        r["consistent"] = not bad
        if not bad:
            return r
        print(f"pipeline_cpu: {' '.join(extra) or 'defaults'}: the longer run cost no more "
              f"than the shorter in {', '.join(bad)} (try {attempt} of {args.pair_tries}); "
              f"the pair says nothing about a round" +
              ("; measuring again" if attempt < args.pair_tries else ""), file=sys.stderr)
    return r


def steady_pair(args, workdir: Path, extra: List[str]) -> Dict[str, float]:
    os.sync()  # what earlier runs left to write back is not this pair's
    short = run_demo(args, args.short, workdir, extra)
    os.sync()
    long = run_demo(args, args.long, workdir, extra)
    rounds = args.long - args.short
    cpu = (long["cpu"] - short["cpu"]) / rounds
    training = (long["training"] - short["training"]) / rounds
    per_node = {f"node_{node}_per_round": (long["nodes"][node] - short["nodes"].get(node, 0.0)) /
                rounds for node in long["nodes"]}
    return {**per_node,
            "cpu_per_round": cpu,
            "training_cpu_per_round": training,
            "pipeline_cpu_per_round": cpu - training,
            "user_per_round": (long["user"] - short["user"]) / rounds,
            "system_per_round": (long["system"] - short["system"]) / rounds,
            "fp32_bytes_per_round": (long["fp32_bytes"] - short["fp32_bytes"]) / rounds,
            "wire_bytes_per_round": (long["wire_bytes"] - short["wire_bytes"]) / rounds,
            "whole_run_gb_per_cpu_s": long["fp32_bytes"] / 1e9 / long["cpu"],
            "round_seconds": statistics.median(long["round_seconds"][1:] or
                                               long["round_seconds"]),
            "long_cpu": long["cpu"]}


def measure(args) -> Dict[str, object]:
    rates, aes_library = machine_rates(args.micro_bench)
    workdir = Path(tempfile.mkdtemp(prefix="fedwan-pipeline-cpu-", dir=args.workdir))
    configs = CONFIGS[-1:] if args.data_path_only else CONFIGS
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name, _, _ in configs}
    try:
        for _ in range(args.repeats):
            for name, extra, audit in configs:
                runs[name].append(steady(args, workdir, extra))
                r = runs[name][-1]
                # The longer run cost no more than the shorter: the rounds
                # between them are lost in the runs' noise (a small model).
                r["gb_per_cpu_s"] = (r["fp32_bytes_per_round"] / 1e9 / r["pipeline_cpu_per_round"]
                                     if r["pipeline_cpu_per_round"] > 0 else float("nan"))
                r["crypto_floor_cpu_per_round"] = crypto_floor(r["wire_bytes_per_round"], rates,
                                                               audit)
                r["transport_floor_cpu_per_round"] = transport_floor(r["wire_bytes_per_round"],
                                                                     rates)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    # The medians of the consistent pairs (of all, marked, when none is).
    medians = {}
    for name, rs in runs.items():
        kept = [r for r in rs if r["consistent"]] or rs
        medians[name] = {k: statistics.median(float(r[k]) for r in kept) for k in rs[0]}
        medians[name]["consistent"] = kept[0]["consistent"]
    return {"rates": rates, "aes_library": aes_library, "runs": runs, "median": medians}


def print_result(args, result) -> Optional[bool]:
    """PASS (True), FAIL (False), or None when the gated figure is not a
    round's cost."""
    rates, med = result["rates"], result["median"]
    configs = [c for c in CONFIGS if c[0] in med]
    print(f"CPU per byte: {args.params} parameters, {args.sites} sites under "
          f"{args.regions or 'no'} regions, mutual TLS, codec {args.codec}, outer {args.outer}, "
          f"H = {args.inner_steps}; steady rounds from runs of {args.long} and {args.short} "
          f"rounds; {args.repeats} repeat(s), medians")
    print(f"  memcpy, one core: {rates['memcpy'] / 1e9:.2f} GB/s; "
          f"AES-256-GCM, one core: {rates['aes_256_gcm'] / 1e9:.2f} GB/s "
          f"({result['aes_library'] or 'as the nodes seal'}; OpenSSL's "
          f"{rates['aes_256_gcm_openssl'] / 1e9:.2f}); "
          f"SHA-256, one core: {rates['sha256'] / 1e9:.2f} GB/s; "
          f"fingerprint (XXH3), one core: {rates['fingerprint'] / 1e9:.2f} GB/s; "
          f"loopback TCP through ZeroMQ, both ends: {rates['loopback'] / 1e9:.2f} GB "
          f"per CPU-second")
    # The repeats' spread beside the median: on a shared machine it can be
    # wider than the change being measured.
    print("| run | fp32 GB a round | CPU s a round (user + sys) | training CPU s | "
          "round s | GB per CPU-s | repeats | x memcpy | x AES-GCM | whole run GB per CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, _, _ in configs:
        m = med[name]
        g = m["gb_per_cpu_s"]
        each = [r["gb_per_cpu_s"] for r in result["runs"][name]]
        print(f"| {name} | {m['fp32_bytes_per_round'] / 1e9:.3f} | "
              f"{m['cpu_per_round']:.2f} ({m['user_per_round']:.2f} + "
              f"{m['system_per_round']:.2f}) | {m['training_cpu_per_round']:.2f} | "
              f"{m['round_seconds']:.2f} | {g:.3f} | {min(each):.3f}-{max(each):.3f} | "
              f"{g * 1e9 / rates['memcpy']:.3f} | "
              f"{g * 1e9 / rates['aes_256_gcm']:.3f} | {m['whole_run_gb_per_cpu_s']:.3f} |")
    for name, _, _ in configs:
        m = med[name]
        nodes = sorted(k for k in m if k.startswith("node_"))
        print(f"{name}, CPU-s a round by node besides training: " +
              ", ".join(f"{k[len('node_'):-len('_per_round')]} {m[k]:.2f}" for k in nodes))
    for name, _, audit in configs:
        if name == CONFIGS[0][0]:
            continue
        m = med[name]
        floor = m["crypto_floor_cpu_per_round"]
        what = ("each update byte hashed by its sender and the root for the audit log" if audit
                else "each update byte fingerprinted by the root for its replay check")
        print(f"{name}: its cryptography alone (each of the round's "
              f"{m['wire_bytes_per_round'] / 1e9:.3f} GB on the links sealed and opened, "
              f"{what}) costs {floor:.2f} CPU-s a round here: at most "
              f"{m['fp32_bytes_per_round'] / 1e9 / floor:.2f} GB per CPU-second with nothing "
              f"else; the rest takes {max(0.0, m['pipeline_cpu_per_round'] - floor):.2f} CPU-s.")
    m = med[CONFIGS[-1][0]]
    floor = m["crypto_floor_cpu_per_round"] + m["transport_floor_cpu_per_round"]
    print(f"{CONFIGS[-1][0]}: its links' transport alone (each of those bytes through ZeroMQ "
          f"and loopback TCP, both ends) costs {m['transport_floor_cpu_per_round']:.2f} CPU-s "
          f"a round here; with the cryptography {floor:.2f}: at most "
          f"{m['fp32_bytes_per_round'] / 1e9 / floor:.2f} GB per CPU-second with nothing else "
          f"(the data path reaches "
          f"{m['gb_per_cpu_s'] * floor / (m['fp32_bytes_per_round'] / 1e9):.2f} of it); "
          f"the rest (decoding, the mean, the outer step, encoding with error "
          f"feedback, copies, the nodes' loops) takes "
          f"{max(0.0, m['pipeline_cpu_per_round'] - floor):.2f} CPU-s.")
    figure = med[CONFIGS[-1][0]]["gb_per_cpu_s"]
    if any(math.isnan(r["gb_per_cpu_s"]) for rs in result["runs"].values() for r in rs):
        print("Some runs' extra rounds cost less CPU than the runs' own noise (nan above): "
              "give more rounds (--long) or more parameters.")
    inconsistent = [name for name, _, _ in configs if not med[name]["consistent"]]
    if inconsistent:
        print(f"Every pair of {', '.join(inconsistent)} was inconsistent (its longer run cost "
              f"less than its shorter in some part, {args.pair_tries} tries each): its figures above "
              f"are not a round's. Run again on a quieter machine.")
    if not med[CONFIGS[-1][0]]["consistent"]:
        print(f"UNMEASURED: the data path's figure ({figure:.3f}) is not a round's cost")
        return None
    ok = figure >= GATE_GB_PER_CPU_S
    others = ("" if args.data_path_only else
              f"; with the audit log {med[CONFIGS[1][0]]['gb_per_cpu_s']:.3f}, with checkpoints "
              f"too {med[CONFIGS[0][0]]['gb_per_cpu_s']:.3f}")
    print(f"{'PASS' if ok else 'FAIL'}: the data path (mutual TLS) moves {figure:.3f} GB per "
          f"CPU-second ({'>=' if ok else '<'} {GATE_GB_PER_CPU_S}){others}")
    return ok


def main(argv=None) -> int:
    here = Path(__file__).resolve().parents[2]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fedwan", type=Path, default=here / "build/bin/fedwan")
    p.add_argument("--micro-bench", type=Path,
                   default=here / "build/benchmarks/fedwan_micro_bench")
    p.add_argument("--params", type=int, default=100_000_000)
    p.add_argument("--sites", type=int, default=2)
    p.add_argument("--regions", type=int, default=0)
    p.add_argument("--codec", default="fp16")
    p.add_argument("--outer", default="diloco")
    p.add_argument("-H", "--inner-steps", type=int, default=1)
    p.add_argument("--short", type=int, default=3, help="rounds of the shorter run")
    p.add_argument("--long", type=int, default=11, help="rounds of the longer run")
    p.add_argument("--repeats", type=int, default=3,
                   help="pairs of runs (the median is kept): one pair's figure moves with the "
                        "host's load by 15-20%% on a shared machine, the median of three much less")
    p.add_argument("--pair-tries", type=int, default=3,
                   help="tries of a pair whose longer run cost less than its shorter")
    p.add_argument("--workdir", default=None, help="where the runs write (default: the temp dir)")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--gate", action="store_true", help="exit 1 below 1 GB per CPU-second")
    p.add_argument("--data-path-only", action="store_true",
                   help="measure the gated configuration alone (no checkpoints, no audit log)")
    p.add_argument("--demo-arg", action="append", default=[],
                   help="one more argument for fedwan demo (repeatable)")
    args = p.parse_args(argv)
    if args.long <= args.short or args.short < 1:
        p.error("--long must be greater than --short, and --short at least 1")
    try:
        if not args.fedwan.exists():
            raise CouldNotRun(f"{args.fedwan} is missing; build fedwan first")
        result = measure(args)
    except CouldNotRun as e:
        print(f"pipeline_cpu: {e}", file=sys.stderr)
        return 2
    ok = print_result(args, result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if ok is None:
        return 2 if args.gate else 0
    return 0 if ok or not args.gate else 1


if __name__ == "__main__":
    sys.exit(main())
