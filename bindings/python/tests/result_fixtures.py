"""Result files in the formats fedwan's benchmarks and tools write, for
the test_results_*.py files: Google Benchmark JSON and CSV, federation
reports, fedwan_aggregator_memory --json, sync reports and the GPU
benchmarks' printed tables (built with their printf formats); write() puts
one in a file."""

import csv
import io
import json

MIB = 1 << 20


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=1))
    return path


def gb_entry(name, cpu_ns, real_ns=None, bps=None, run_type="iteration", aggregate=None,
             unit="ns", label=None, repetitions=3):
    """One entry of a Google Benchmark JSON document. Times are given in ns
    and written in `unit`."""
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6}[unit]
    e = {"name": name + (f"_{aggregate}" if aggregate else ""), "run_name": name,
         "run_type": run_type, "repetitions": repetitions, "threads": 1, "iterations": 100,
         "real_time": (real_ns if real_ns is not None else cpu_ns) / scale,
         "cpu_time": cpu_ns / scale, "time_unit": unit}
    if aggregate:
        e["aggregate_name"] = aggregate
    if bps is not None:
        e["bytes_per_second"] = bps
    if label:
        e["label"] = label
    return e


def micro_doc():
    """fedwan_micro_bench --benchmark_format=json with three repetitions of
    the codec benchmarks (and Google Benchmark's aggregates for Memcpy), one
    Seal pair timed by the wall clock, a handshake (a label, no bytes), a
    pipeline benchmark without its baseline, and a failed benchmark."""
    b = []
    # Memcpy 1 MiB: samples 10, 12, 11 GB/s; the median aggregate says 11.
    for bps, ns in ((10e9, 105e3), (12e9, 87e3), (11e9, 95e3)):
        b.append(gb_entry(f"BM_Codec_Memcpy/{MIB}", ns, bps=bps))
    b.append(gb_entry(f"BM_Codec_Memcpy/{MIB}", 95e3, bps=11e9, run_type="aggregate",
                      aggregate="mean"))
    b.append(gb_entry(f"BM_Codec_Memcpy/{MIB}", 95e3, bps=11e9, run_type="aggregate",
                      aggregate="median"))
    b.append(gb_entry(f"BM_Codec_Memcpy/{MIB}", 9e3, bps=1e9, run_type="aggregate",
                      aggregate="stddev"))
    # Fp16Encode 1 MiB: no aggregates; the median of the samples is 5.5 GB/s.
    for bps, ns in ((5.0e9, 210e3), (6.0e9, 175e3), (5.5e9, 190e3)):
        b.append(gb_entry(f"BM_Codec_Fp16Encode/{MIB}", ns, bps=bps, unit="us"))
    # Fp16EncodeEF 1 MiB: 4 GB/s, i.e. 16 Gbit/s of fp16 output.
    b.append(gb_entry(f"BM_Codec_Fp16EncodeEF/{MIB}", 260e3, bps=4e9, repetitions=1))
    # 4 MiB: one sample each.
    b.append(gb_entry(f"BM_Codec_Memcpy/{4 * MIB}", 400e3, bps=10e9, repetitions=1))
    b.append(gb_entry(f"BM_Codec_Fp16Encode/{4 * MIB}", 500e3, bps=8e9, repetitions=1))
    # Seal: wall time (real_time differs from the thread's CPU time).
    b.append(gb_entry(f"BM_Seal_RawAes256Gcm/{MIB}/real_time", 180e3, real_ns=200e3,
                      bps=2.5e9, repetitions=1))
    b.append(gb_entry(f"BM_Seal_Pipelined/{MIB}/manual_time", 150e3, real_ns=400e3,
                      bps=1.25e9, repetitions=1))
    b.append(gb_entry("Handshake/MutualTls13/1", 2.6e6, unit="ms", label="aes-256-gcm",
                      repetitions=1))
    b.append(gb_entry(f"BM_Pipeline_Fp16EF/{MIB}", 16e6, bps=2.3e9, unit="ms",
                      repetitions=1))
    failed = gb_entry(f"BM_Codec_Int8Encode/{MIB}", 1.0, bps=1.0, repetitions=1)
    failed.update(error_occurred=True, error_message="int8 kernel unavailable")
    b.append(failed)
    return {"context": {"num_cpus": 2, "library_build_type": "release"}, "benchmarks": b}


def micro_csv(doc):
    """The same results as Google Benchmark writes them with
    --benchmark_out_format=csv: context lines, then the CSV."""
    out = io.StringIO()
    out.write("2026-11-24T13:35:52+00:00\nRunning fedwan_micro_bench\n"
              "Run on (2 X 2445.42 MHz CPU s)\nLoad Average: 0.28, 0.31, 0.67\n")
    w = csv.writer(out, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
    w.writerow(["name", "iterations", "real_time", "cpu_time", "time_unit", "bytes_per_second",
                "items_per_second", "label", "error_occurred", "error_message"])
    for e in doc["benchmarks"]:
        w.writerow([e["name"], e["iterations"], repr(e["real_time"]), repr(e["cpu_time"]),
                    e["time_unit"], repr(e["bytes_per_second"]) if "bytes_per_second" in e
                    else "", "", e.get("label", ""),
                    "true" if e.get("error_occurred") else "", e.get("error_message", "")])
    return out.getvalue()


def demo_report():
    """fedwan demo --report: a root's rounds with evaluation, and the demo's
    central-training baseline (as the demo wrote it for 3 rounds)."""
    return {
        "alarms": [], "baseline_accuracy": 0.6985,
        "configuration": {"codec": "fp16", "rounds": 3, "sites": 2, "regions": 1},
        "federation_seconds": 6.27, "final_accuracy": 0.5775, "final_loss": 1.2437,
        "fp32_bytes_total": 973058, "handshake_ms": [3.29], "rejected_frames": 0,
        "rounds": [
            {"accuracy": 0.4014, "fp32_bytes": 385148, "frames": 16, "loss": 2.1362,
             "round": 0, "seconds": 0.139, "wan_bytes": 182336, "weight": 60000.0},
            {"accuracy": 0.4781, "fp32_bytes": 293817, "frames": 7, "loss": 1.7609,
             "round": 1, "seconds": 1.241, "wan_bytes": 136101, "weight": 60000.0},
            {"accuracy": 0.5775, "fp32_bytes": 294093, "frames": 10, "loss": 1.2437,
             "round": 2, "seconds": 1.257, "wan_bytes": 136377, "weight": 60000.0},
        ],
        "security": "mtls/aes-256-gcm", "wall_seconds": 8.25, "wan_bytes_total": 454814,
    }


def aggregator_report():
    """fedwan aggregator --report of a root without --eval: no accuracy."""
    return {"rounds": [{"round": 0, "wan_bytes": 500, "fp32_bytes": 1000, "seconds": 0.5,
                        "frames": 4, "weight": 2.0},
                       {"round": 1, "wan_bytes": 250, "fp32_bytes": 1000, "seconds": 0.25,
                        "frames": 4, "weight": 2.0}],
            "wan_bytes_total": 750, "fp32_bytes_total": 2000, "rejected_frames": 0,
            "security": "plaintext", "handshake_ms": [], "alarms": []}


def aggregator_memory_doc(version=1):
    """fedwan_aggregator_memory --json for --sites 2,8 (the baseline is 2)."""
    return {
        "format": "fedwan.aggregator_memory", "version": version,
        "config": {"params": 10000000, "codec": "fp16", "chunk_bytes": MIB, "chunks": 39,
                   "rounds": 3, "window": 8, "peer_window": 8, "repeat": 3,
                   "model_mib": 38.14697265625},
        "baseline_sites": 2, "pass": True,
        "rows": [
            {"sites": 2, "idle_mib": 11.2, "peak_min_mib": 95.8, "peak_max_mib": 97.9,
             "seconds": 6.1, "growth_mib": 0.0, "growth_chunks": 0.0, "growth_models": 0.0,
             "every_delta_mib": 76.3, "window_bound_mib": None, "extra_deltas_mib": None,
             "growth_share": None, "ok": None},
            {"sites": 8, "idle_mib": 11.3, "peak_min_mib": 123.4, "peak_max_mib": 129.4,
             "seconds": 13.9, "growth_mib": 31.5, "growth_chunks": 31.5,
             "growth_models": 0.8257, "every_delta_mib": 305.2, "window_bound_mib": 104.0,
             "extra_deltas_mib": 228.9, "growth_share": 0.1376, "ok": True},
        ]}


CPP_SYNCS = [0.5, 0.10, 0.12, 0.11]          # timed: the last three, median 0.11
CORE_SYNCS = [0.9, 0.12, 0.13, 0.14, 0.125]  # timed: the last four, median 0.1275


def sync_raw():
    """sync_overhead.py --raw: the site reports of every run, each with its
    root's report; a cpp run, a core run, and a two-sync run (too short to
    leave a warm-up out)."""
    def site(impl, times):
        n = len(times)
        return {"role": "site", "impl": impl, "params": 1000, "codec": "fp16", "join_s": 0.01,
                "sync_s": times, "bytes_sent": [100 + i for i in range(n)],
                "bytes_received": [200 + i for i in range(n)],
                "root": {"role": "root", "rounds": n, "security": "mtls/aes-256-gcm",
                         "round_s": [t + 0.01 for t in times],
                         "wan_bytes": [300 + i for i in range(n)], "rejected_frames": 0}}
    return [site("cpp", CPP_SYNCS), site("core", CORE_SYNCS), site("core", [0.3, 0.2])]


DEVICE_CODEC_ROWS = [  # codec, ef, chunk MiB, copy, encode, kernel, traffic, d2h, host
    ("fp16", "no", 1, 2500.0, 2100.0, 0.84, 0.63, 25.1, 1.9),
    ("fp16", "yes", 1, 2500.0, 900.0, 0.36, 0.81, 25.1, 1.7),
    ("int8", "no", 4, 2600.0, 2200.0, 0.85, 0.55, 25.2, 3.4),
]


def device_codec_output():
    """What fedwan_gpu_bench_device_codec prints (its printf formats)."""
    lines = ["device 0: NVIDIA H100 80GB HBM3, 132 SMs, L2 50 MiB; median of 50 runs",
             "%-5s %-3s %9s %11s %12s %12s %12s %10s %10s" % (
                 "codec", "ef", "chunk_MiB", "copy_GB/s", "encode_GB/s", "kernel_ratio",
                 "traffic_ratio", "d2h_GB/s", "host_ratio")]
    lines += ["%-5s %-3s %9d %11.1f %12.1f %12.2f %12.2f %10.2f %10.2f" % r
              for r in DEVICE_CODEC_ROWS]
    return "\n".join(lines) + "\n"


def allreduce_output(with_nccl=True):
    """What fedwan_gpu_bench_allreduce prints (its printf formats): 25 MiB
    with every method, 100 MiB without DataParallel."""
    lines = ["bench_allreduce: 4 ranks (one GPU each), 20 iterations after 5 warmup, median of "
             "the slowest rank; buckets/chunks of 25 MiB; bw = bytes / time",
             "%8s | %9s %9s | %9s %9s %7s | %9s %9s %7s | %9s %9s %7s" % (
                 "size", "nccl ms", "GB/s", "raw ms", "GB/s", "ratio", "chunk ms", "GB/s",
                 "ratio", "dp ms", "GB/s", "ratio")]
    nccl = 2.0 if with_nccl else 0.0
    base = nccl or 2.2
    for size, raw, chunk, dp in ((25, 2.2, 2.2, 2.5), (100, 8.0, 8.4, None)):
        gbps = lambda ms: size * MIB / (ms * 1e-3) / 1e9 if ms else 0.0  # noqa: E731
        dp_cols = ("%9.3f %9.1f %7.3f" % (dp, gbps(dp), base / dp) if dp
                   else "      n/a       n/a     n/a")
        lines.append("%4d MiB | %9.3f %9.1f | %9.3f %9.1f %7.3f | %9.3f %9.1f %7.3f | %s" % (
            size, nccl, gbps(nccl), raw, gbps(raw), base / raw, chunk, gbps(chunk),
            base / chunk, dp_cols))
    lines.append("ratio = baseline time / this time (bandwidth over the baseline's): the baseline "
                 "is %s; target >= 0.9 for chunk and dp" % (
                     "one ncclAllReduce straight on NCCL" if with_nccl
                     else "the engine's single allreduce (built without NCCL's headers)"))
    return "\n".join(lines) + "\n"
