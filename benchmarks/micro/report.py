#!/usr/bin/env python3
"""Summarise the micro benchmarks as ratios to memcpy measured in the same run.

Usage: report.py PATH/TO/fedwan_micro_bench [extra benchmark args...]

Benchmarks are named BM_<group>_<what>/<chunk bytes>; each one is compared
with its group's baseline of the same chunk size (BM_<group>_Memcpy, or for
Seal BM_Seal_RawAes256Gcm), because absolute bandwidth depends on the machine
and its load while the ratio mostly does not. Exits 0 whatever the numbers
are; non-zero only when the benchmark could not run.

The rows and their ratios come from fedwan's result reader
(bindings/python/fedwan_results/_formats.py, the code behind
`fedwan_results.load`), so this report and a notebook agree on every figure.
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

GATE_RATIO = 0.5
SEAL_GATE_RATIO = 0.8


def result_formats():
    """fedwan's result reader: this checkout's copy, loaded by path (it is
    plain Python and needs no build), else an installed fedwan_results'."""
    path = (Path(__file__).resolve().parents[2] / "bindings" / "python" / "fedwan_results"
            / "_formats.py")
    if not path.is_file():
        from fedwan_results import _formats
        return _formats
    spec = importlib.util.spec_from_file_location("fedwan_result_formats", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(binary, extra):
    cmd = [binary, "--benchmark_format=json"] + extra
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        sys.exit(f"report.py: cannot run {binary}: {e}")
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        sys.exit(f"report.py: {binary} exited with status {proc.returncode}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        sys.stderr.write(proc.stderr)
        sys.exit(f"report.py: {binary} printed no JSON ({e})")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    doc = run(sys.argv[1], sys.argv[2:])
    ctx = doc.get("context", {})
    if ctx.get("library_build_type") == "debug":
        print("note: the benchmark library was built as debug; only its own overhead is affected")
    print(f"host: {ctx.get('num_cpus', '?')} cpus at {ctx.get('mhz_per_cpu', '?')} MHz, "
          f"load average {ctx.get('load_avg', '?')}")

    # One row per benchmark, the median when repeated, with its ratio to its
    # group's baseline of the same chunk (memcpy; raw AES-256-GCM for Seal).
    # The time is CPU time, the steadier on a shared machine, except where
    # the benchmark's bytes/s comes from wall time (UseRealTime or
    # UseManualTime): the Seal group's pipelined cases work on two threads,
    # which CPU time of one thread would not count.
    formats = result_formats()
    for name, message in formats.google_benchmark_errors(doc):
        print(f"error in {name}: {message}")
    rows, seal_rows = [], []
    for r in formats.google_benchmark_rows(doc):
        if r["bytes_per_second"] is None:
            continue
        if r["group"] is None:
            rows.append((r["benchmark"], "", r["bytes_per_second"], r["time_ns"], None))
            continue
        row = (f"{r['group']} {r['what']}", r["chunk"], r["bytes_per_second"], r["time_ns"],
               r["ratio"])
        (seal_rows if r["group"] == "Seal" else rows).append(row)

    if rows:
        print_table(rows, "cpu/iter", "x memcpy")
        codec_gates(rows)
        int8_info(rows)
    if seal_rows:
        if rows:
            print()
        print_table(seal_rows, "wall/chunk", "x AES-GCM")
        seal_gates(seal_rows, ctx)
    return 0


def print_table(rows, time_label, ratio_label):
    header = f"{'benchmark':<30} {'chunk':>8} {time_label:>12} {'GiB/s':>8} {ratio_label:>9}"
    print(header)
    print("-" * len(header))
    for what, chunk, bps, ns, ratio in rows:
        t = f"{ns / 1e3:.1f} us" if ns < 1e7 else f"{ns / 1e6:.2f} ms"
        r = f"{ratio:.2f}" if ratio is not None else "-"
        print(f"{what:<30} {chunk:>8} {t:>12} {bps / 2**30:>8.2f} {r:>9}")


def codec_gates(rows):
    # Gate 1 (the acceptance criterion): fp16 encode >= 0.5x memcpy.
    plain = [(c, r) for w, c, _, _, r in rows if w == "Codec Fp16Encode" and r is not None]
    # Gate 2 (what a sender needs): with error feedback, every production
    # sender's mode, one core must emit fp16 faster than a 10 Gbit/s link
    # carries it. Error feedback reads the values and the residual before it
    # writes anything (a failed encode must leave the residual untouched), so
    # its ratio to a one-array memcpy is printed but not gated.
    ef = [(c, bps, r) for w, c, bps, _, r in rows if w == "Codec Fp16EncodeEF"]
    if not plain or not ef:
        print("fp16 encode gates: NOT MEASURED (filtered out?)")
        return
    ok1 = all(r >= GATE_RATIO for _, r in plain)
    print(f"{'PASS' if ok1 else 'FAIL'}: fp16 encode >= {GATE_RATIO}x memcpy ("
          + ", ".join(f"{c}: {r:.2f}x" for c, r in plain) + ")")
    link = 10e9 / 8  # bytes per second of a 10 Gbit/s link
    # fp16 output is half the fp32 input bytes.
    ok2 = all(bps / 2 >= link for _, bps, _ in ef)
    print(f"{'PASS' if ok2 else 'FAIL'}: fp16 encode with error feedback emits >= 10 Gbit/s "
          "on one core (" + ", ".join(f"{c}: {bps / 2 * 8 / 1e9:.1f} Gbit/s, "
                                      f"{r:.2f}x memcpy" for c, bps, r in ef) + ")")


def int8_info(rows):
    """Printed, not gated: int8 encode against memcpy and against fp16 encode
    of the same chunk in the same run (int8 sends half of fp16's bytes)."""
    by_key = {(what, chunk): (bps, r) for what, chunk, bps, _, r in rows}
    for mode, label in (("Encode", "int8 encode"),
                        ("EncodeEF", "int8 encode with error feedback")):
        parts = []
        for (what, chunk), (bps, r) in by_key.items():
            if what != f"Codec Int8{mode}" or r is None:
                continue
            fp16 = by_key.get((f"Codec Fp16{mode}", chunk))
            parts.append(f"{chunk}: {r:.2f}x memcpy"
                         + (f", {bps / fp16[0]:.2f}x fp16" if fp16 else ""))
        if parts:
            print(f"info: {label}: " + ", ".join(parts) + " (not gated)")


def seal_gates(rows, ctx):
    """Bytes are the encoded fp16 bytes in every Seal benchmark, so each ratio
    says how close that way of sending gets to the cipher alone."""
    load, cpus = (ctx.get("load_avg") or [0])[0], ctx.get("num_cpus", 0)
    if cpus and load > cpus:
        # The pipelined cases need two cores to themselves to overlap; with
        # more runnable threads than cores, wall time measures the scheduler.
        print(f"note: load average {load:.1f} on {cpus} cpus: the Seal group is timed by the "
              "wall clock, so its figures (the pipelined ones most) include waiting for a core")
    ratios, times = {}, {}
    for what, chunk, _, ns, r in rows:
        short = what.split(" ", 1)[1]
        times[(short, chunk)] = ns
        if r is not None and short != "RawAes256GcmModel":
            ratios.setdefault(short, []).append((chunk, r))
    # The gate: a site turns each chunk of its model update into a sealed
    # frame (fp16 encode with error feedback, then AES-256-GCM, overlapped on
    # two threads). Per chunk, i.e. on the same model bytes, that must run at
    # >= 0.8x the speed of AES-256-GCM alone over those bytes (the floor for
    # sending the update encrypted at all).
    chunks = sorted({c for (w, c) in times if w == "Pipelined"})
    pairs = [(c, times[("RawAes256GcmModel", c)] / times[("Pipelined", c)])
             for c in chunks if ("RawAes256GcmModel", c) in times]
    if not pairs:
        print("sealing gate: NOT MEASURED (filtered out?)")
    else:
        ok = all(r >= SEAL_GATE_RATIO for _, r in pairs)
        print(f"{'PASS' if ok else 'FAIL'}: sealed pipeline (encode + encrypt) >= "
              f"{SEAL_GATE_RATIO}x raw AES-256-GCM on the same model bytes ("
              + ", ".join(f"{c}: {r:.2f}x" for c, r in pairs) + ")")
    # Printed for honesty, not gated: per encoded byte, the pipeline against
    # AES over its (half-size) output; the serial paths; the other cipher.
    for what, label in (("Pipelined", "pipelined, per encoded byte"),
                        ("Frame", "FrameSealer alone"),
                        ("EncodeThenSeal", "encode then seal, one thread, one hot chunk"),
                        ("SerialStream", "encode then seal, one thread, 16-chunk stream"),
                        ("PipelinedChaCha20Poly1305", "pipelined with ChaCha20-Poly1305")):
        if what in ratios:
            print(f"info: {label}: " + ", ".join(f"{c}: {r:.2f}x" for c, r in ratios[what])
                  + " raw AES-256-GCM (not gated)")


if __name__ == "__main__":
    sys.exit(main())
