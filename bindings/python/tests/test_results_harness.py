"""fedwan_results against the harness's own code and the real binaries:
benchmarks/micro/report.py and benchmarks/python/sync_overhead.py read the
rows fedwan_results does; the result files the built benchmarks and the
`fedwan` tool write load as rows.

These tests need FEDWAN_SOURCE_DIR (the checkout), FEDWAN_BUILD_DIR (a build
tree) or FEDWAN_CLI (the `fedwan` tool) and skip without them.
"""

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fedwan_results as results

from result_fixtures import MIB, micro_doc, sync_raw


# ---- the harness's own code and the real binaries ----------------------------------------

def _load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env_dir(var, what):
    """The directory environment variable `var` names; the test is skipped
    without it."""
    value = os.environ.get(var)
    if not value:
        pytest.skip(f"{var} ({what}) is not set")
    return Path(value)


@pytest.fixture
def source_dir():
    return _env_dir("FEDWAN_SOURCE_DIR", "the fedwan checkout")


def test_report_py_prints_the_ratios_of_fedwan_results(source_dir, monkeypatch):
    """benchmarks/micro/report.py computes its table with the same reader:
    the ratio column is the rows' ratio, and the checkout's reader gives the
    rows that this fedwan's does."""
    report = _load_by_path("fedwan_report_py", source_dir / "benchmarks/micro/report.py")
    formats = report.result_formats()
    assert Path(formats.__file__).resolve() == (
        source_dir / "bindings/python/fedwan_results/_formats.py").resolve()
    doc = micro_doc()
    assert formats.google_benchmark_rows(doc) == results.loads(json.dumps(doc))

    monkeypatch.setattr(report, "run", lambda binary, extra: doc)
    monkeypatch.setattr(sys, "argv", ["report.py", "fedwan_micro_bench"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert report.main() == 0
    text = out.getvalue()
    assert f"error in BM_Codec_Int8Encode/{MIB}: int8 kernel unavailable" in text
    printed = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[0] in ("Codec", "Seal", "Pipeline"):
            printed[(cells[1], cells[2] + " " + cells[3])] = cells[-1]
    for r in results.loads(json.dumps(doc)):
        if r["group"] and r["bytes_per_second"] is not None:
            want = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
            assert printed[(r["what"], r["chunk"])] == want, r["benchmark"]
    assert "PASS: fp16 encode >= 0.5x memcpy (1 MiB: 0.50x, 4 MiB: 0.80x)" in text
    assert ("PASS: fp16 encode with error feedback emits >= 10 Gbit/s on one core "
            "(1 MiB: 16.0 Gbit/s, 0.36x memcpy)") in text


def test_sync_rows_leave_out_the_syncs_that_sync_overhead_py_leaves_out(source_dir):
    harness = _load_by_path("fedwan_sync_overhead_py",
                            source_dir / "benchmarks/python/sync_overhead.py")
    for report in sync_raw():
        rows = results.loads(json.dumps(report))
        assert [r["sync_s"] for r in rows if r["timed"]] == harness.timed_syncs(report)


@pytest.fixture
def build_dir():
    return _env_dir("FEDWAN_BUILD_DIR", "a fedwan build tree")


def _binary(build_dir, name):
    path = build_dir / "benchmarks" / name
    if not path.is_file():
        pytest.skip(f"{path} is not built")
    return path


def test_real_micro_bench_json_loads_with_ratios_to_its_memcpy(build_dir, tmp_path):
    bench = _binary(build_dir, "fedwan_micro_bench")
    out = tmp_path / "micro.json"
    subprocess.run([str(bench), "--benchmark_filter=BM_Codec_(Memcpy|Fp16Encode)/",
                    "--benchmark_min_time=0.01", f"--benchmark_out={out}",
                    "--benchmark_out_format=json"], check=True, capture_output=True, timeout=120)
    doc = json.loads(out.read_text())
    rows = {r["benchmark"]: r for r in results.load(out)}
    assert len(rows) == 4
    for size in (MIB, 4 * MIB):
        memcpy = rows[f"BM_Codec_Memcpy/{size}"]
        fp16 = rows[f"BM_Codec_Fp16Encode/{size}"]
        assert memcpy["ratio"] == 1.0
        raw = {b["name"]: b["bytes_per_second"] for b in doc["benchmarks"]}
        assert fp16["ratio"] == pytest.approx(raw[f"BM_Codec_Fp16Encode/{size}"]
                                              / raw[f"BM_Codec_Memcpy/{size}"])


def test_real_aggregator_memory_json_matches_its_table(build_dir, tmp_path):
    bench = _binary(build_dir, "fedwan_aggregator_memory")
    out = tmp_path / "mem.json"
    proc = subprocess.run([str(bench), "--params", "100000", "--sites", "2,3", "--rounds", "1",
                           "--repeat", "1", "--chunk-bytes", "65536", "--json", str(out)],
                          env=dict(os.environ, FEDWAN_LOG_LEVEL="error"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    rows = results.load(out)
    assert [r["sites"] for r in rows] == [2, 3]
    assert all(r["codec"] == "fp16" and r["params"] == 100000 and r["chunks"] == 7
               for r in rows)
    verdict = proc.stdout.strip().splitlines()[-1]
    assert verdict == ("PASS" if rows[1]["ok"] else "FAIL")
    assert json.loads(out.read_text())["pass"] == (verdict == "PASS")
    # The table's lines: sites, model MiB, idle MiB, peak min..max, growth MiB, ...
    table = {int(ln.split()[0]): ln.split() for ln in proc.stdout.splitlines()
             if ln.split() and ln.split()[0] in ("2", "3") and ".." in ln}
    for r in rows:
        cells = table[r["sites"]]
        assert cells[3] == f"{r['peak_min_mib']:.1f}..{r['peak_max_mib']:.1f}"
        assert float(cells[4]) == pytest.approx(r["growth_mib"], abs=0.051)
    assert rows[1]["growth_mib"] == pytest.approx(rows[1]["peak_max_mib"]
                                                  - rows[0]["peak_max_mib"])


@pytest.mark.skipif(not os.environ.get("FEDWAN_CLI"), reason="FEDWAN_CLI (fedwan) is not set")
def test_real_demo_report_loads_one_row_per_round(tmp_path):
    report = tmp_path / "report.json"
    subprocess.run([os.environ["FEDWAN_CLI"], "demo", "--trainer", "synthetic", "--sites", "2",
                    "--regions", "0", "--rounds", "2", "-H", "1", "--synthetic-size", "1000",
                    "--insecure-plaintext", "--no-baseline", "--dir", str(tmp_path / "run"),
                    "--report", str(report)], check=True, capture_output=True, timeout=120,
                   env=dict(os.environ, FEDWAN_LOG_LEVEL="error"))
    doc = json.loads(report.read_text())
    rows = results.load(report)
    assert [r["round"] for r in rows] == [0, 1]
    assert sum(r["wan_bytes"] for r in rows) == doc["wan_bytes_total"]
    assert all(r["wan_ratio"] == pytest.approx(r["wan_bytes"] / r["fp32_bytes"]) for r in rows)
