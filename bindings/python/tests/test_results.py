"""fedwan_results: every result format loads as rows with the values and the
same-run ratios the harness defines; DataFrames and plots where pandas and
matplotlib are installed, a clear ImportError where they are not; the
command line.

The fixtures are written by the tests in the formats the benchmarks write.
Tests that run the real binaries or read the source tree need
FEDWAN_BUILD_DIR (a build tree), FEDWAN_CLI (the `fedwan` tool) or
FEDWAN_SOURCE_DIR (the checkout) and skip without them.
"""

import contextlib
import csv
import importlib.util
import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import fedwan
import fedwan_results as results

from result_fixtures import (CORE_SYNCS, CPP_SYNCS, MIB, aggregator_memory_doc,
                             aggregator_report, allreduce_output, demo_report,
                             device_codec_output, gb_entry, micro_csv, micro_doc, sync_raw)


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=1))
    return path


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


# ---- tables and the command line ---------------------------------------------------

def test_format_table_prints_the_default_columns_of_the_kind():
    rows = results.loads(json.dumps(demo_report()))
    lines = results.format_table(rows).splitlines()
    assert lines[0].split() == [c for c in results.default_columns("federation")]
    assert lines[1].split() == ["0", "0.4014", "2.136", "182336", "385148", "0.4734", "0.139",
                                "0.5747"]
    assert results.format_table(rows, ["round", "baseline_accuracy"]).splitlines()[3].split() \
        == ["2", "0.6985"]
    with pytest.raises(ValueError, match="unknown kind"):
        results.default_columns("nope")


def test_show_prints_a_table_and_csv_that_round_trips(tmp_path, capsys):
    path = write(tmp_path, "micro.json", micro_doc())
    assert results.main(["show", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"{len(results.load(path))} rows of kind micro")
    assert out[1].split()[0] == "benchmark" and out[1].split()[-1] == "ratio"
    line = next(ln for ln in out if ln.startswith(f"BM_Codec_Fp16Encode/{MIB} "))
    assert line.split()[-1] == f"{5.5 / 11:.4g}"

    assert results.main(["show", str(path), "--format", "csv", "--columns", "benchmark,ratio"]) \
        == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    ratios = {r["benchmark"]: r["ratio"] for r in table}
    assert float(ratios[f"BM_Codec_Fp16Encode/{4 * MIB}"]) == pytest.approx(0.8)
    assert ratios["Handshake/MutualTls13/1"] == ""

    assert results.main(["show", str(path), "--format", "json"]) == 0
    objs = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert objs == results.load(path)


def test_show_of_a_file_that_is_no_result_exits_2_saying_why(tmp_path, capsys):
    path = write(tmp_path, "x.txt", "nothing here\n")
    assert results.main(["show", str(path)]) == 2
    assert "not a result format" in capsys.readouterr().err
    assert results.main(["show", str(tmp_path / "missing.json")]) == 2


def _env_with_fedwan():
    """The environment of a child Python that imports this very fedwan."""
    env = dict(os.environ)
    pkg_parent = str(Path(fedwan.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + ([env["PYTHONPATH"]]
                                                        if env.get("PYTHONPATH") else []))
    return env


@pytest.mark.parametrize("module", ["fedwan_results", "fedwan.results"])
def test_python_dash_m_show(tmp_path, module):
    path = write(tmp_path, "report.json", demo_report())
    out = subprocess.run([sys.executable, "-m", module, "show", str(path)],
                         env=_env_with_fedwan(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].split()[:2] == ["2", "0.5775"]


def test_importing_fedwan_results_imports_neither_pandas_matplotlib_nor_the_runtime():
    code = ("import sys, fedwan_results; "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'fedwan', 'fedwan._fedwan') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=_env_with_fedwan(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_former_name_fedwan_results_is_the_same_api():
    import fedwan.results as former
    assert set(former.__all__) == set(results.__all__)
    for name in results.__all__:
        assert getattr(former, name) is getattr(results, name), name


# ---- pandas ----------------------------------------------------------------------------

def test_to_frame_without_pandas_raises_import_error_saying_what_to_install(monkeypatch,
                                                                            tmp_path):
    path = write(tmp_path, "report.json", demo_report())
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails
    with pytest.raises(ImportError, match=r"needs pandas.*pip install pandas"):
        results.load_frame(path)
    assert len(results.load(path)) == 3  # the dict path needs nothing


def test_frame_has_a_row_per_result_and_the_rows_values():
    pandas = pytest.importorskip("pandas")
    rows = results.loads(json.dumps(micro_doc()))
    df = results.to_frame(rows)
    assert isinstance(df, pandas.DataFrame)
    assert len(df) == len(rows) and list(df.columns) == list(rows[0])
    fp16 = df[(df["what"] == "Fp16Encode") & (df["chunk_bytes"] == MIB)].iloc[0]
    assert fp16["ratio"] == pytest.approx(0.5)
    assert df.loc[df["benchmark"] == "Handshake/MutualTls13/1", "ratio"].isna().all()


def test_load_frame_of_a_federation_report():
    pytest.importorskip("pandas")
    df = results.to_frame(results.loads(json.dumps(demo_report())))
    assert df["wan_bytes"].sum() == 454814
    assert list(df["accuracy"]) == [0.4014, 0.4781, 0.5775]


# ---- matplotlib ---------------------------------------------------------------------------

@pytest.fixture
def mpl():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    yield plt
    plt.close("all")


def test_plot_without_matplotlib_raises_import_error_saying_what_to_install(monkeypatch,
                                                                            tmp_path):
    path = write(tmp_path, "report.json", demo_report())
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"needs matplotlib.*pip install matplotlib"):
        results.plot(path)


def test_plot_micro_draws_each_ratio_as_a_bar(mpl):
    rows = results.loads(json.dumps(micro_doc()))
    ax = results.plot(rows)
    with_ratio = [r for r in rows if r["ratio"] is not None]
    assert [p.get_width() for p in ax.patches] == pytest.approx([r["ratio"] for r in with_ratio])
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:2] == ["Codec Memcpy 1 MiB", "Codec Fp16Encode 1 MiB"]  # the first on top
    assert ax.get_yticks()[0] == len(with_ratio) - 1


def test_plot_federation_draws_accuracy_and_wan_bytes_per_round(mpl, tmp_path):
    _, given = mpl.subplots()
    ax = results.plot(write(tmp_path, "report.json", demo_report()), ax=given, title="run 1")
    assert ax is given and ax.get_title() == "run 1"
    accuracy = ax.get_lines()[0]
    assert list(accuracy.get_xdata()) == [0, 1, 2]
    assert list(accuracy.get_ydata()) == [0.4014, 0.4781, 0.5775]
    assert list(ax.get_lines()[1].get_ydata()) == [0.6985, 0.6985]  # the central baseline
    twin = [a for a in ax.figure.axes if a is not ax][0]
    assert [p.get_height() for p in twin.patches] == pytest.approx(
        [182336 / 1e6, 136101 / 1e6, 136377 / 1e6])


def test_plot_federation_without_accuracy_puts_bytes_on_one_axis(mpl):
    ax = results.plot(results.loads(json.dumps(aggregator_report())))
    assert len(ax.figure.axes) == 1
    assert [p.get_height() for p in ax.patches] == pytest.approx([500 / 1e6, 250 / 1e6])
    assert "0.375 of fp32" in ax.get_title()


def test_plot_of_the_other_kinds(mpl):
    ax = results.plot(results.loads(json.dumps(aggregator_memory_doc())))
    peak = [ln for ln in ax.get_lines() if ln.get_label() == "peak (highest run)"][0]
    assert list(peak.get_ydata()) == [97.9, 129.4]
    bound = [ln for ln in ax.get_lines() if ln.get_label() == "allowed: window bound"][0]
    assert list(bound.get_ydata()) == pytest.approx([97.9, 97.9 + 104.0])
    assert ax.get_title().endswith("PASS")

    ax = results.plot(results.loads(json.dumps(sync_raw())))
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == "C++ SiteCore\n1.000x C++"
    harness = statistics.median(CORE_SYNCS[1:] + [0.3, 0.2]) / statistics.median(CPP_SYNCS[1:])
    assert ticks[1] == f"Python SiteCore\n{harness:.3f}x C++"

    ax = results.plot(results.loads(device_codec_output()))
    fp16 = [ln for ln in ax.get_lines() if ln.get_label() == "fp16 + error feedback"][0]
    assert list(fp16.get_ydata()) == [0.36]

    ax = results.plot(results.loads(allreduce_output()))
    chunk = [ln for ln in ax.get_lines() if ln.get_label() == "chunk"][0]
    assert list(chunk.get_xdata()) == [25, 100]


def test_plot_refuses_mixed_kinds(mpl):
    rows = results.loads(json.dumps(demo_report())) + results.loads(json.dumps(micro_doc()))
    with pytest.raises(ValueError, match="one kind"):
        results.plot(rows)


def test_plot_command_writes_an_image_or_says_matplotlib_is_missing(tmp_path, capsys):
    path = write(tmp_path, "report.json", demo_report())
    png = tmp_path / "out.png"
    rc = results.main(["plot", str(path), "-o", str(png)])
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2 and "pip install matplotlib" in capsys.readouterr().err
        return
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the harness's own code and the real binaries ----------------------------------------

def _load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def source_dir():
    src = os.environ.get("FEDWAN_SOURCE_DIR")
    if not src:
        pytest.skip("FEDWAN_SOURCE_DIR (the fedwan checkout) is not set")
    return Path(src)


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
    build = os.environ.get("FEDWAN_BUILD_DIR")
    if not build:
        pytest.skip("FEDWAN_BUILD_DIR (a fedwan build tree) is not set")
    return Path(build)


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
