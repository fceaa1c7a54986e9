"""fedwan_results: every result format loads as rows with the values and the
same-run ratios the harness defines: Google Benchmark JSON and CSV,
federation reports, aggregator memory, sync reports and the GPU benchmarks'
tables; files that hold no results raise a FormatError.

The fixtures are written by the tests in the formats the benchmarks write
(result_fixtures.py).
"""

import json
import statistics

import pytest

import fedwan_results as results

from result_fixtures import (CORE_SYNCS, CPP_SYNCS, MIB, aggregator_memory_doc,
                             aggregator_report, allreduce_output, demo_report,
                             device_codec_output, gb_entry, micro_csv, micro_doc, sync_raw,
                             write)


def by_name(rows):
    return {r["benchmark"]: r for r in rows}


# ---- micro benchmarks (Google Benchmark) ---------------------------------------

def test_micro_json_rows_hold_medians_and_the_ratio_to_memcpy_of_the_same_chunk(tmp_path):
    rows = results.load(write(tmp_path, "micro.json", micro_doc()))
    assert {r["kind"] for r in rows} == {"micro"}
    r = by_name(rows)
    memcpy, fp16 = r[f"BM_Codec_Memcpy/{MIB}"], r[f"BM_Codec_Fp16Encode/{MIB}"]
    # Google Benchmark's median aggregate where there is one, else the median of the samples.
    assert memcpy["bytes_per_second"] == 11e9 and memcpy["time_ns"] == pytest.approx(95e3)
    assert fp16["bytes_per_second"] == 5.5e9 and fp16["time_ns"] == pytest.approx(190e3)
    assert (memcpy["repetitions"], fp16["repetitions"]) == (3, 3)
    assert memcpy["ratio"] == 1.0 and memcpy["baseline"] == "Memcpy"
    assert fp16["ratio"] == pytest.approx(5.5 / 11)
    assert r[f"BM_Codec_Fp16Encode/{4 * MIB}"]["ratio"] == pytest.approx(0.8)
    assert (fp16["group"], fp16["what"], fp16["chunk_bytes"], fp16["chunk"]) == (
        "Codec", "Fp16Encode", MIB, "1 MiB")


def test_micro_seal_rows_use_wall_time_and_divide_by_raw_aes(tmp_path):
    r = by_name(results.load(write(tmp_path, "micro.json", micro_doc())))
    aes = r[f"BM_Seal_RawAes256Gcm/{MIB}/real_time"]
    pipe = r[f"BM_Seal_Pipelined/{MIB}/manual_time"]
    assert (aes["time"], aes["time_ns"]) == ("wall", pytest.approx(200e3))
    assert (pipe["time"], pipe["time_ns"]) == ("wall", pytest.approx(400e3))
    assert aes["ratio"] == 1.0 and pipe["baseline"] == "RawAes256Gcm"
    assert pipe["ratio"] == pytest.approx(0.5)


def test_micro_rows_without_bytes_or_baseline_have_no_ratio_and_failures_are_left_out(
        tmp_path):
    doc = micro_doc()
    r = by_name(results.load(write(tmp_path, "micro.json", doc)))
    hs = r["Handshake/MutualTls13/1"]
    assert (hs["group"], hs["bytes_per_second"], hs["ratio"]) == (None, None, None)
    assert hs["label"] == "aes-256-gcm" and hs["time_ns"] == pytest.approx(2.6e6)
    pipeline = r[f"BM_Pipeline_Fp16EF/{MIB}"]
    assert pipeline["ratio"] is None and pipeline["baseline"] == "Memcpy"
    assert f"BM_Codec_Int8Encode/{MIB}" not in r
    from fedwan_results import _formats
    assert _formats.google_benchmark_errors(doc) == [
        (f"BM_Codec_Int8Encode/{MIB}", "int8 kernel unavailable")]


def test_micro_csv_with_context_lines_loads_as_the_json_does(tmp_path):
    doc = micro_doc()
    from_json = results.load(write(tmp_path, "micro.json", doc))
    from_csv = results.load(write(tmp_path, "micro.csv", micro_csv(doc)))
    assert [r["benchmark"] for r in from_csv] == [r["benchmark"] for r in from_json]
    for a, b in zip(from_csv, from_json):
        for key in ("ratio", "bytes_per_second", "time_ns"):
            assert a[key] == pytest.approx(b[key]), (a["benchmark"], key)
        assert (a["time"], a["label"], a["repetitions"]) == (b["time"], b["label"],
                                                             b["repetitions"])


def test_micro_with_aggregates_only_takes_the_median_aggregate():
    """--benchmark_report_aggregates_only: no samples, only mean, median, ..."""
    doc = {"benchmarks": [
        gb_entry(f"BM_Codec_Memcpy/{MIB}", 100e3, bps=10e9, run_type="aggregate",
                 aggregate="mean", repetitions=5),
        gb_entry(f"BM_Codec_Memcpy/{MIB}", 90e3, bps=11e9, run_type="aggregate",
                 aggregate="median", repetitions=5),
        gb_entry(f"BM_Codec_Int8Encode/{MIB}", 120e3, bps=8.8e9, run_type="aggregate",
                 aggregate="median", repetitions=5),
    ]}
    rows = by_name(results.loads(json.dumps(doc)))
    memcpy, int8 = rows[f"BM_Codec_Memcpy/{MIB}"], rows[f"BM_Codec_Int8Encode/{MIB}"]
    assert (memcpy["bytes_per_second"], memcpy["time_ns"], memcpy["repetitions"]) == (
        11e9, pytest.approx(90e3), 5)
    assert int8["ratio"] == pytest.approx(0.8)


# ---- federation reports --------------------------------------------------------

def test_demo_report_rows_per_round_with_wan_and_accuracy_ratios(tmp_path):
    rows = results.load(write(tmp_path, "report.json", demo_report()))
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert [r["accuracy"] for r in rows] == [0.4014, 0.4781, 0.5775]
    assert [r["wan_bytes"] for r in rows] == [182336, 136101, 136377]
    assert rows[0]["wan_ratio"] == pytest.approx(182336 / 385148)
    assert rows[2]["accuracy_ratio"] == pytest.approx(0.5775 / 0.6985)
    assert all(r["baseline_accuracy"] == 0.6985 and r["kind"] == "federation" for r in rows)
    assert sum(r["wan_bytes"] for r in rows) == demo_report()["wan_bytes_total"]


def test_root_report_without_evaluation_has_no_accuracy(tmp_path):
    rows = results.load(write(tmp_path, "root.json", aggregator_report()))
    assert [r["wan_ratio"] for r in rows] == [0.5, 0.25]
    assert all(r["accuracy"] is None and r["accuracy_ratio"] is None
               and r["baseline_accuracy"] is None for r in rows)


# ---- aggregator memory, sync overhead, GPU tables -------------------------------

def test_aggregator_memory_rows_carry_the_benchmarks_figures_and_its_configuration(tmp_path):
    rows = results.load(write(tmp_path, "mem.json", aggregator_memory_doc()))
    assert [r["sites"] for r in rows] == [2, 8]
    base, eight = rows
    assert (base["ok"], base["growth_share"], base["window_bound_mib"]) == (None, None, None)
    assert eight["ok"] is True and eight["growth_mib"] == 31.5
    assert eight["growth_share"] == 0.1376 and eight["window_bound_mib"] == 104.0
    assert all(r["codec"] == "fp16" and r["params"] == 10000000 and r["baseline_sites"] == 2
               and r["window"] == 8 for r in rows)


def test_aggregator_memory_of_a_newer_version_is_refused(tmp_path):
    with pytest.raises(results.FormatError, match="version 2.*upgrade fedwan"):
        results.load(write(tmp_path, "mem.json", aggregator_memory_doc(version=2)))


def test_sync_rows_mark_the_warm_up_and_their_median_ratio_is_the_harness_figure(tmp_path):
    rows = results.load(write(tmp_path, "raw.json", sync_raw()))
    assert len(rows) == len(CPP_SYNCS) + len(CORE_SYNCS) + 2
    cpp = [r for r in rows if r["driver"] == "cpp"]
    assert [r["timed"] for r in cpp] == [False, True, True, True]
    short = [r for r in rows if r["run"] == 2]
    assert [r["timed"] for r in short] == [True, True]  # two syncs: nothing left out
    core = [r for r in rows if r["driver"] == "core" and r["run"] == 1]
    assert core[2]["ratio"] == pytest.approx(0.13 / 0.11)
    assert (core[2]["bytes_sent"], core[2]["bytes_received"], core[2]["wan_bytes"]) == (
        102, 202, 302)
    assert core[2]["round_s"] == pytest.approx(0.14)
    # sync_overhead.py: median of the driver's timed syncs / median of cpp's.
    timed_core = [r for r in rows if r["driver"] == "core" and r["timed"]]
    harness = statistics.median(CORE_SYNCS[1:] + [0.3, 0.2]) / statistics.median(CPP_SYNCS[1:])
    assert statistics.median(r["ratio"] for r in timed_core) == pytest.approx(harness)


def test_a_lone_site_or_root_report_of_fedwan_site_sync_loads(tmp_path):
    site = sync_raw()[1]
    root = site.pop("root")
    rows = results.load(write(tmp_path, "site.json", site))
    assert [r["sync_s"] for r in rows] == CORE_SYNCS
    assert all(r["ratio"] is None and r["round_s"] is None for r in rows)  # no cpp baseline
    rows = results.load(write(tmp_path, "root.json", root))
    assert [(r["role"], r["sync"], r["wan_bytes"]) for r in rows] == [
        ("root", i, 300 + i) for i in range(len(CORE_SYNCS))]


def test_device_codec_output_loads_one_row_per_codec_mode_and_chunk(tmp_path):
    rows = results.load(write(tmp_path, "codec.txt", device_codec_output()))
    assert [(r["codec"], r["ef"], r["chunk_mib"]) for r in rows] == [
        ("fp16", False, 1), ("fp16", True, 1), ("int8", False, 4)]
    assert rows[1]["kernel_ratio"] == 0.36 and rows[1]["traffic_ratio"] == 0.81
    assert rows[2]["host_ratio"] == 3.4 and rows[2]["encode_gb_per_s"] == 2200.0
    assert all(r["device"] == "NVIDIA H100 80GB HBM3" for r in rows)


@pytest.mark.parametrize("with_nccl", [True, False])
def test_allreduce_output_loads_one_row_per_size_and_measured_method(tmp_path, with_nccl):
    rows = results.load(write(tmp_path, "ar.txt", allreduce_output(with_nccl)))
    baseline = "nccl" if with_nccl else "raw"
    got = {(r["size_mib"], r["method"]): r for r in rows}
    expected = {(25, "raw"), (25, "chunk"), (25, "dp"), (100, "raw"), (100, "chunk")}
    if with_nccl:
        expected |= {(25, "nccl"), (100, "nccl")}
    assert set(got) == expected  # no dp at 100 MiB, no nccl without its headers
    assert got[(25, baseline)]["ratio"] == 1.0
    base_ms = 2.0 if with_nccl else 2.2
    assert got[(100, "chunk")]["ratio"] == pytest.approx(base_ms / 8.4, abs=1e-3)
    assert got[(25, "dp")]["ms"] == 2.5
    assert all(r["baseline"] == baseline and r["ranks"] == 4 for r in rows)


@pytest.mark.parametrize("content,match", [
    ("skipped: no CUDA device on this machine\n", "skipped"),
    ("bench_allreduce: skipped: needs >= 2 GPUs (found 1)\n", "skipped"),
    ('{"hello": 1}', "JSON, but not a result format"),
    ("[1, 2]", "JSON, but not a result format"),
    ('{"rounds": [', "not valid JSON"),
    ("some log output\n", "not a result format"),
])
def test_files_that_hold_no_results_raise_a_format_error_naming_the_file(tmp_path, content,
                                                                         match):
    path = write(tmp_path, "x.out", content)
    with pytest.raises(results.FormatError, match=match) as info:
        results.load(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_loads_takes_text_and_load_takes_str_or_path(tmp_path):
    path = write(tmp_path, "report.json", demo_report())
    assert results.load(str(path)) == results.load(path) == results.loads(path.read_text())
