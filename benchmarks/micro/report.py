#!/usr/bin/env python3
"""Summarise the micro benchmarks as ratios to memcpy measured in the same run.

Usage: report.py PATH/TO/fedwan_micro_bench [extra benchmark args...]

Benchmarks are named BM_<group>_<what>/<chunk bytes>; each one is compared
with its group's baseline of the same chunk size (BM_<group>_Memcpy, or for
Seal BM_Seal_RawAes256Gcm), because absolute bandwidth depends on the machine
and its load while the ratio mostly does not. Exits 0 whatever the numbers
are; non-zero only when the benchmark could not run.
"""
import json
import re
import statistics
import subprocess
import sys

NAME = re.compile(r"^BM_(?P<group>[A-Za-z0-9]+)_(?P<what>[A-Za-z0-9]+)/(?P<arg>[^/]+)")
GATE_RATIO = 0.5
# The baseline each group's results are divided by; every other group: Memcpy.
BASELINE = {"Seal": "RawAes256Gcm"}
SEAL_GATE_RATIO = 0.8


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


def collect(doc):
    """One (bytes/s, ns/iteration) per benchmark: the median when repeated.

    Google Benchmark derives bytes_per_second from CPU time, so the time shown
    is CPU time too; on a shared machine it is the steadier of the two. A
    benchmark registered with UseRealTime or UseManualTime (its name ends in
    /real_time or /manual_time) has bytes_per_second from that time, so its
    wall time is shown: the Seal group uses it because its pipelined cases
    work on two threads, which CPU time of one thread would not count."""
    samples, medians = {}, {}
    for b in doc.get("benchmarks", []):
        if b.get("error_occurred"):
            print(f"error in {b['name']}: {b.get('error_message', '')}")
            continue
        if "bytes_per_second" not in b:
            continue
        name = b.get("run_name", b["name"])
        wall = name.endswith("/real_time") or name.endswith("/manual_time")
        ns = b["real_time" if wall else "cpu_time"] * {
            "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = (b["bytes_per_second"], ns)
        else:
            samples.setdefault(name, []).append((b["bytes_per_second"], ns))
    out = {}
    for name, runs in samples.items():
        out[name] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
    out.update(medians)
    return out


def human_bytes(arg):
    try:
        n = int(arg)
    except ValueError:
        return arg
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} B"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    doc = run(sys.argv[1], sys.argv[2:])
    ctx = doc.get("context", {})
    if ctx.get("library_build_type") == "debug":
        print("note: the benchmark library was built as debug; only its own overhead is affected")
    print(f"host: {ctx.get('num_cpus', '?')} cpus at {ctx.get('mhz_per_cpu', '?')} MHz, "
          f"load average {ctx.get('load_avg', '?')}")

    results = collect(doc)
    by_key = {}  # (group, what, arg) -> (bytes/s, ns), whatever the name's time suffix
    for name, value in results.items():
        m = NAME.match(name)
        if m:
            by_key[(m["group"], m["what"], m["arg"])] = value
    rows, seal_rows = [], []
    for name, (bps, ns) in results.items():
        m = NAME.match(name)
        if not m:
            rows.append((name, "", bps, ns, None))
            continue
        base = by_key.get((m["group"], BASELINE.get(m["group"], "Memcpy"), m["arg"]))
        row = (f"{m['group']} {m['what']}", human_bytes(m["arg"]), bps, ns,
               bps / base[0] if base else None)
        (seal_rows if m["group"] == "Seal" else rows).append(row)

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
