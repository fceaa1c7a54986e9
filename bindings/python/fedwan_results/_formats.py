"""Readers of every result format fedwan's benchmarks and reports write.

Each reader turns one file's content into rows: plain dicts, one per result,
every one with a ``"kind"`` naming its format. ``fedwan_results`` is the
public face of this module (loading, DataFrames, plots, the command line).

This file uses the standard library only and imports nothing else of the
project, so that ``benchmarks/micro/report.py`` can load it by path from a
source checkout, without a build, and compute its ratios with the very code
that ``fedwan_results`` uses.
"""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

Row = Dict[str, Any]

#: Every kind of row there is: the value of each row's "kind".
KINDS = ("micro", "federation", "aggregator_memory", "sync", "gpu_codec", "gpu_allreduce")


class FormatError(ValueError):
    """A file is none of the result formats, or a damaged or newer one."""


# ---- Google Benchmark (fedwan_micro_bench) ------------------------------------

#: BM_<group>_<what>/<arg>[/real_time|/manual_time]
BENCHMARK_NAME = re.compile(r"^BM_(?P<group>[A-Za-z0-9]+)_(?P<what>[A-Za-z0-9]+)/(?P<arg>[^/]+)")
#: The benchmark of a group that the group's others are divided by, measured
#: in the same run on the same chunk; every group not listed: Memcpy.
GROUP_BASELINES = {"Seal": "RawAes256Gcm"}
DEFAULT_BASELINE = "Memcpy"
_TIME_UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
_AGGREGATES = ("mean", "median", "stddev", "cv")


def group_baseline(group: str) -> str:
    """The name (``<what>``) of the benchmark that ``group``'s ratios divide by."""
    return GROUP_BASELINES.get(group, DEFAULT_BASELINE)


def chunk_label(arg: str) -> str:
    """A benchmark argument as a chunk size: ``"1048576"`` -> ``"1 MiB"``;
    ``"1000"`` -> ``"1000 B"``; anything not an integer unchanged."""
    try:
        n = int(arg)
    except ValueError:
        return arg
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} B"


def is_wall_time(run_name: str) -> bool:
    """Whether Google Benchmark derived the benchmark's bytes_per_second from
    wall time (registered with UseRealTime or UseManualTime)."""
    return run_name.endswith("/real_time") or run_name.endswith("/manual_time")


def _time_ns(entry: Mapping[str, Any], wall: bool) -> float:
    unit = _TIME_UNIT_NS.get(entry.get("time_unit", "ns"))
    if unit is None:
        raise FormatError(f"benchmark {entry.get('name')!r}: unknown time_unit "
                          f"{entry.get('time_unit')!r}")
    return float(entry["real_time" if wall else "cpu_time"]) * unit


def google_benchmark_errors(doc: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """(name, message) of every benchmark that reported an error."""
    return [(b["name"], b.get("error_message", "")) for b in doc.get("benchmarks", [])
            if b.get("error_occurred")]


def google_benchmark_rows(doc: Mapping[str, Any]) -> List[Row]:
    """One row per benchmark of a Google Benchmark JSON document.

    With repetitions, a row holds the median of the repetitions (Google
    Benchmark's own ``median`` aggregate where the document has it). The time
    is CPU time, the steadier of the two on a shared machine, except for a
    benchmark registered with UseRealTime or UseManualTime, whose
    bytes_per_second comes from that (wall) time. ``ratio`` is the row's
    bytes per second over its group's baseline's (``BM_<group>_Memcpy``, or
    ``BM_Seal_RawAes256Gcm`` for Seal) with the same argument: above 1 is
    faster than the baseline. Benchmarks that reported errors are left out
    (``google_benchmark_errors``)."""
    samples: Dict[str, List[Tuple[Optional[float], float]]] = {}
    medians: Dict[str, Tuple[Optional[float], float, int]] = {}
    labels: Dict[str, str] = {}
    for b in doc.get("benchmarks", []):
        if b.get("error_occurred"):
            continue
        name = b.get("run_name", b["name"])
        bps = b.get("bytes_per_second")
        value = (float(bps) if bps is not None else None, _time_ns(b, is_wall_time(name)))
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = value + (int(b.get("repetitions", 0)),)
        else:
            samples.setdefault(name, []).append(value)
        if b.get("label"):
            labels.setdefault(name, b["label"])
    collected: Dict[str, Tuple[Optional[float], float, int]] = {}
    for name, runs in samples.items():
        rates = [r[0] for r in runs]
        rate = None if None in rates else statistics.median(r for r in rates if r is not None)
        collected[name] = (rate, statistics.median(r[1] for r in runs), len(runs))
    for name, (rate, ns, reps) in medians.items():
        collected[name] = (rate, ns, len(samples.get(name, ())) or reps)

    by_key: Dict[Tuple[str, str, str], Optional[float]] = {}
    for name, (rate, _, _) in collected.items():
        m = BENCHMARK_NAME.match(name)
        if m:
            by_key[(m["group"], m["what"], m["arg"])] = rate
    rows: List[Row] = []
    for name, (rate, ns, n) in collected.items():
        m = BENCHMARK_NAME.match(name)
        group: Optional[str] = m["group"] if m else None
        what: Optional[str] = m["what"] if m else None
        arg: Optional[str] = m["arg"] if m else None
        baseline: Optional[str] = None
        base_rate: Optional[float] = None
        if group is not None and arg is not None:
            baseline = group_baseline(group)
            base_rate = by_key.get((group, baseline, arg))
        chunk_bytes: Optional[int] = None
        if arg is not None and arg.isdigit():
            chunk_bytes = int(arg)
        rows.append({
            "kind": "micro",
            "benchmark": name,
            "group": group,
            "what": what,
            "chunk_bytes": chunk_bytes,
            "chunk": chunk_label(arg) if arg is not None else None,
            "label": labels.get(name, ""),
            "time": "wall" if is_wall_time(name) else "cpu",
            "time_ns": ns,
            "bytes_per_second": rate,
            "repetitions": n,
            "baseline": baseline,
            "ratio": rate / base_rate if rate is not None and base_rate else None,
        })
    return rows


_CSV_HEADER = "name,iterations,"


def google_benchmark_csv(text: str) -> Dict[str, Any]:
    """A Google Benchmark CSV (``--benchmark_format=csv``, or a
    ``--benchmark_out_format=csv`` file, whose context lines come before the
    header) as the JSON document it stands for."""
    start = text.find(_CSV_HEADER)
    if start < 0 or (start > 0 and text[start - 1] != "\n"):
        raise FormatError("not a Google Benchmark CSV: no line starts with 'name,iterations,'")
    entries = []
    for rec in csv.DictReader(io.StringIO(text[start:])):
        name = rec["name"]
        entry: Dict[str, Any] = {"name": name, "run_name": name, "run_type": "iteration",
                                 "time_unit": rec.get("time_unit") or "ns",
                                 "real_time": float(rec["real_time"] or 0),
                                 "cpu_time": float(rec["cpu_time"] or 0)}
        for agg in _AGGREGATES:
            if name.endswith("_" + agg):
                # The CSV has no repetitions column; an aggregate's
                # iterations are the number of repetitions it summarises.
                entry.update(run_name=name[:-len(agg) - 1], run_type="aggregate",
                             aggregate_name=agg, repetitions=int(rec["iterations"] or 0))
                break
        if rec.get("bytes_per_second"):
            entry["bytes_per_second"] = float(rec["bytes_per_second"])
        if rec.get("label"):
            entry["label"] = rec["label"]
        if rec.get("error_occurred") in ("true", "1"):
            entry.update(error_occurred=True, error_message=rec.get("error_message", ""))
        entries.append(entry)
    return {"context": {}, "benchmarks": entries}


# ---- the federation report (fedwan aggregator --report, fedwan demo --report) --

def federation_rows(doc: Mapping[str, Any]) -> List[Row]:
    """One row per round of a root's report (``fedwan aggregator --report``)
    or a demo's (``fedwan demo --report``, which adds the central-training
    baseline).

    ``wan_ratio`` is the round's bytes on the WAN over what fp32 updates would
    have sent (``fp32_bytes``, the same round's uncompressed baseline);
    ``accuracy_ratio`` is the global model's accuracy over the central
    baseline's (demo reports with ``--trainer fashion-cnn`` only)."""
    baseline = doc.get("baseline_accuracy")
    rows: List[Row] = []
    for r in doc["rounds"]:
        wan, fp32, acc = r.get("wan_bytes"), r.get("fp32_bytes"), r.get("accuracy")
        rows.append({
            "kind": "federation",
            "round": r.get("round"),
            "accuracy": acc,
            "loss": r.get("loss"),
            "wan_bytes": wan,
            "fp32_bytes": fp32,
            "wan_ratio": wan / fp32 if wan is not None and fp32 else None,
            "seconds": r.get("seconds"),
            "frames": r.get("frames"),
            "weight": r.get("weight"),
            "baseline_accuracy": baseline,
            "accuracy_ratio": acc / baseline if acc is not None and baseline else None,
        })
    return rows


# ---- fedwan_aggregator_memory --json -------------------------------------------

AGGREGATOR_MEMORY_FORMAT = "fedwan.aggregator_memory"
AGGREGATOR_MEMORY_VERSION = 1


def aggregator_memory_rows(doc: Mapping[str, Any]) -> List[Row]:
    """One row per site count of ``fedwan_aggregator_memory --json FILE``.

    The benchmark computes every figure; the rows repeat its configuration
    (``codec``, ``params``, ``window``, ...) so that sweeps concatenate.
    ``growth_*`` compare the row's highest peak with the baseline's (the
    smallest site count, ``baseline_sites``); ``growth_share`` is the growth
    over what buffering one full fp32 delta per extra site would add, and
    ``ok`` the benchmark's verdict (both None on the baseline row)."""
    version = doc.get("version")
    if not isinstance(version, int) or version > AGGREGATOR_MEMORY_VERSION:
        raise FormatError(f"aggregator memory results of version {version!r}; this fedwan "
                          f"reads version {AGGREGATOR_MEMORY_VERSION} (upgrade fedwan)")
    config = dict(doc.get("config", {}))
    rows: List[Row] = []
    for r in doc["rows"]:
        row: Row = {"kind": "aggregator_memory"}
        row.update(r)
        row["baseline_sites"] = doc.get("baseline_sites")
        for key, value in config.items():
            row.setdefault(key, value)
        rows.append(row)
    return rows


# ---- fedwan_site_sync --out, benchmarks/python/sync_overhead.py --raw ----------

def timed_syncs(sync_s: Sequence[float]) -> List[bool]:
    """Which syncs of one run count in sync_overhead.py's figures: all but
    the first (warm-up: buffers touched for the first time, a cold link) when
    the run has three or more."""
    return [i > 0 or len(sync_s) < 3 for i in range(len(sync_s))]


def sync_rows(doc: Any) -> List[Row]:
    """One row per sync of the site reports of ``fedwan_site_sync --out`` or
    ``sync_overhead.py --raw`` (a list of them), one per round of a lone root
    report.

    ``driver`` is the site's implementation (``cpp`` is the C++ baseline,
    ``core`` fedwan.SiteCore, ``site`` fedwan.Site); ``run`` numbers the
    reports in the file. ``timed`` marks the syncs the harness counts;
    ``ratio`` is the sync's time over the median of the timed ``cpp`` syncs
    in the file (None without them), so the median ``ratio`` of a driver's
    timed syncs is the harness's ``x C++`` figure."""
    reports = doc if isinstance(doc, list) else [doc]
    cpp = [t for rep in reports if rep.get("role") == "site" and rep.get("impl") == "cpp"
           for t, timed in zip(rep["sync_s"], timed_syncs(rep["sync_s"])) if timed]
    base = statistics.median(cpp) if cpp else None
    rows: List[Row] = []
    for run, rep in enumerate(reports):
        if rep.get("role") == "root":
            for i, (secs, wan) in enumerate(zip(rep["round_s"], rep["wan_bytes"])):
                rows.append({"kind": "sync", "role": "root", "driver": None, "run": run,
                             "sync": i, "round_s": secs, "wan_bytes": wan})
            continue
        root = rep.get("root") or {}
        root_s, root_wan = root.get("round_s", []), root.get("wan_bytes", [])
        sync_s = rep["sync_s"]
        for i, (secs, timed) in enumerate(zip(sync_s, timed_syncs(sync_s))):
            rows.append({
                "kind": "sync", "role": "site", "driver": rep.get("impl"), "run": run,
                "sync": i, "sync_s": secs, "timed": timed,
                "bytes_sent": rep["bytes_sent"][i], "bytes_received": rep["bytes_received"][i],
                "params": rep.get("params"), "codec": rep.get("codec"),
                "round_s": root_s[i] if i < len(root_s) else None,
                "wan_bytes": root_wan[i] if i < len(root_wan) else None,
                "ratio": secs / base if base else None,
            })
    return rows


def _is_sync_report(obj: Any) -> bool:
    return isinstance(obj, dict) and (
        (obj.get("role") == "site" and "sync_s" in obj)
        or (obj.get("role") == "root" and "round_s" in obj))


# ---- the GPU benchmarks' printed tables ----------------------------------------

_GPU_CODEC_HEADER = ["codec", "ef", "chunk_MiB", "copy_GB/s", "encode_GB/s", "kernel_ratio",
                     "traffic_ratio", "d2h_GB/s", "host_ratio"]
_GPU_CODEC_KEYS = ["codec", "ef", "chunk_mib", "copy_gb_per_s", "encode_gb_per_s",
                   "kernel_ratio", "traffic_ratio", "d2h_gb_per_s", "host_ratio"]
#: The methods of fedwan_gpu_bench_allreduce's table, in the order of its columns.
ALLREDUCE_METHODS = ("nccl", "raw", "chunk", "dp")


def _skipped(lines: Iterable[str]) -> Optional[str]:
    for line in lines:
        if "skipped:" in line and "rows skipped" not in line:
            return line.strip()
    return None


def gpu_codec_rows(text: str) -> List[Row]:
    """One row per (codec, error feedback, chunk) of the table that
    ``fedwan_gpu_bench_device_codec`` prints (its standard output saved to a
    file). The ratios are the benchmark's, against the device-to-device copy
    of the same chunk (``kernel_ratio``, ``traffic_ratio``) and the fp32 copy
    to pinned host memory (``host_ratio``)."""
    lines = text.splitlines()
    device = next((ln.split(":", 1)[1].split(",")[0].strip() for ln in lines
                   if ln.startswith("device ")), None)
    start = next((i for i, ln in enumerate(lines) if ln.split() == _GPU_CODEC_HEADER), None)
    if start is None:
        raise FormatError("not the output of fedwan_gpu_bench_device_codec: no table header")
    rows: List[Row] = []
    for ln in lines[start + 1:]:
        cells = ln.split()
        if len(cells) != len(_GPU_CODEC_KEYS):
            continue
        try:
            values = [float(c) for c in cells[2:]]
        except ValueError:
            continue
        row: Row = {"kind": "gpu_codec", "device": device, "codec": cells[0],
                    "ef": cells[1] == "yes", "chunk_mib": int(values[0])}
        row.update(zip(_GPU_CODEC_KEYS[3:], values[1:]))
        rows.append(row)
    return rows


def gpu_allreduce_rows(text: str) -> List[Row]:
    """One row per (size, method) of the table that
    ``fedwan_gpu_bench_allreduce`` prints (its standard output saved to a
    file). ``method`` is ``nccl`` (one raw ncclAllReduce), ``raw`` (fedwan's
    engine), ``chunk`` (25 MiB pieces) or ``dp`` (DataParallel); ``ratio`` is
    the baseline's time over the row's, as the benchmark prints it, and
    ``baseline`` says which method that is (``nccl``; ``raw`` when built
    without NCCL's headers). Methods the run did not measure have no row."""
    lines = text.splitlines()
    ranks = None
    for ln in lines:
        m = re.match(r"bench_allreduce: (\d+) ranks", ln)
        if m:
            ranks = int(m.group(1))
    baseline = "raw" if any("the engine's single allreduce" in ln for ln in lines) else "nccl"
    rows: List[Row] = []
    for ln in lines:
        cells = [c.split() for c in ln.split("|")]
        if len(cells) != 5 or len(cells[0]) != 2 or cells[0][1] != "MiB":
            continue
        try:
            size = int(cells[0][0])
        except ValueError:
            continue
        for method, cols in zip(ALLREDUCE_METHODS, cells[1:]):
            if "n/a" in cols:
                continue
            ms, gbps = float(cols[0]), float(cols[1])
            if ms <= 0:  # nccl: not measured (built without NCCL's headers)
                continue
            ratio = 1.0 if method == baseline else (float(cols[2]) if len(cols) > 2 else None)
            rows.append({"kind": "gpu_allreduce", "size_mib": size, "method": method,
                         "ms": ms, "gb_per_s": gbps, "ratio": ratio, "baseline": baseline,
                         "ranks": ranks})
    return rows


# ---- detection -----------------------------------------------------------------

def parse(text: str, source: str = "<text>") -> List[Row]:
    """The rows of one file's content, its format recognised from the content."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise FormatError(f"{source}: not valid JSON ({e})") from None
        return _parse_json(doc, source)
    lines = text.splitlines()
    if any(ln.startswith(_CSV_HEADER) for ln in lines):
        return google_benchmark_rows(google_benchmark_csv(text))
    if any(ln.split() == _GPU_CODEC_HEADER for ln in lines):
        return gpu_codec_rows(text)
    if any(ln.startswith("bench_allreduce:") for ln in lines) and \
            any("nccl ms" in ln for ln in lines):
        return gpu_allreduce_rows(text)
    skipped = _skipped(lines)
    if skipped:
        raise FormatError(f"{source}: the benchmark was skipped ({skipped}); "
                          "it holds no results")
    raise FormatError(f"{source}: not a result format fedwan knows (Google Benchmark JSON or "
                      "CSV, a federation --report, fedwan_aggregator_memory --json, "
                      "fedwan_site_sync --out or sync_overhead.py --raw, or the saved output "
                      "of a GPU benchmark)")


def _parse_json(doc: Any, source: str) -> List[Row]:
    if isinstance(doc, dict):
        if isinstance(doc.get("benchmarks"), list):
            return google_benchmark_rows(doc)
        if isinstance(doc.get("rounds"), list) and "wan_bytes_total" in doc:
            return federation_rows(doc)
        if doc.get("format") == AGGREGATOR_MEMORY_FORMAT:
            return aggregator_memory_rows(doc)
        if _is_sync_report(doc):
            return sync_rows(doc)
    if isinstance(doc, list) and doc and all(_is_sync_report(r) for r in doc):
        return sync_rows(doc)
    raise FormatError(f"{source}: JSON, but not a result format fedwan knows (Google "
                      "Benchmark, a federation --report, fedwan_aggregator_memory --json, "
                      "fedwan_site_sync --out or sync_overhead.py --raw)")
