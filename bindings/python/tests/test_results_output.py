"""fedwan_results: tables and the command line (`python -m fedwan_results`
and its former name `python -m fedwan.results`); DataFrames and plots where
pandas and matplotlib are installed, a clear ImportError where they are not.

The fixtures are written by the tests in the formats the benchmarks write
(result_fixtures.py).
"""

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
                             device_codec_output, micro_doc, sync_raw, write)


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
