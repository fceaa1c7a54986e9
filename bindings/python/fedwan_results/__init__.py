"""Benchmark results and federation reports in Python: rows, DataFrames, plots.

A package of its own beside the ``fedwan`` runtime (installed with it; pure
Python, the standard library only until a DataFrame or a plot is asked for),
so that reading results never loads the runtime's extension. ``fedwan.results``
is the same module under its former name.

Every result file that fedwan's benchmarks and command-line tool write loads
as a list of plain dicts, one per result, whatever the file's format; the
format is recognised from the content::

    import fedwan_results as results

    rows = results.load("report.json")         # fedwan demo --report report.json
    rows[-1]["accuracy"], rows[-1]["wan_ratio"]
    df = results.load_frame("micro.json")     # a pandas.DataFrame (needs pandas)
    ax = results.plot("micro.json")           # a matplotlib Axes (needs matplotlib)
    ax.figure.savefig("micro.png")

From the shell, ``python -m fedwan_results show FILE`` prints a file's rows as
a table (``--format csv|json`` for other tools) and ``python -m fedwan_results
plot FILE -o out.png`` draws its plot.

The formats, and the ``kind`` of their rows:

=====================  ===========================================================
``micro``              Google Benchmark JSON or CSV (``fedwan_micro_bench``): one
                       row per benchmark, ``ratio`` against its group's baseline
                       of the same chunk (memcpy; raw AES-256-GCM for Seal)
``federation``         ``fedwan aggregator --report`` / ``fedwan demo --report``:
                       one row per round; ``wan_ratio`` = WAN bytes / fp32
                       bytes, ``accuracy_ratio`` against central training
``aggregator_memory``  ``fedwan_aggregator_memory --json``: one row per site
                       count, growth against the smallest
``sync``               ``fedwan_site_sync --out`` / ``sync_overhead.py --raw``:
                       one row per sync, ``ratio`` against the C++ driver
``gpu_codec``          the saved output of ``fedwan_gpu_bench_device_codec``
``gpu_allreduce``      the saved output of ``fedwan_gpu_bench_allreduce``
=====================  ===========================================================

docs/benchmarks.md ("Results in Python") lists every row's fields. Importing
this module imports neither pandas nor matplotlib; ``to_frame`` and ``plot``
import them when called and raise ImportError saying what to install when
they are missing. ``plot`` without an ``ax`` makes its figure with pyplot,
whose state is global: call it from one thread at a time.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _formats
from ._formats import KINDS, FormatError, Row

__all__ = ["FormatError", "KINDS", "Row", "default_columns", "format_table", "load",
           "load_frame", "loads", "main", "plot", "to_frame"]

PathLike = Union[str, "os.PathLike[str]"]
# A matplotlib.axes.Axes. Spelt Any so that type-checking it needs no
# matplotlib, as importing it does not.
_Axes = Any

# What `show` prints by default: the columns a reader compares first.
_DEFAULT_COLUMNS: Dict[str, List[str]] = {
    "micro": ["benchmark", "label", "time", "time_ns", "bytes_per_second", "baseline", "ratio"],
    "federation": ["round", "accuracy", "loss", "wan_bytes", "fp32_bytes", "wan_ratio",
                   "seconds", "accuracy_ratio"],
    "aggregator_memory": ["sites", "idle_mib", "peak_min_mib", "peak_max_mib", "growth_mib",
                          "growth_chunks", "growth_models", "every_delta_mib",
                          "window_bound_mib", "growth_share", "ok"],
    "sync": ["role", "driver", "run", "sync", "sync_s", "timed", "bytes_sent",
             "bytes_received", "round_s", "wan_bytes", "ratio"],
    "gpu_codec": ["codec", "ef", "chunk_mib", "copy_gb_per_s", "encode_gb_per_s",
                  "kernel_ratio", "traffic_ratio", "d2h_gb_per_s", "host_ratio"],
    "gpu_allreduce": ["size_mib", "method", "ms", "gb_per_s", "ratio"],
}
# sync_overhead.py's names for the drivers.
_DRIVER_LABELS = {"cpp": "C++ SiteCore", "core": "Python SiteCore", "site": "Python Site (torch)"}


def load(path: PathLike) -> List[Row]:
    """The results in ``path`` as a list of plain dicts, one per result.

    The format is recognised from the content (see the module's docstring);
    every row has a ``"kind"`` naming it. Raises FormatError (a ValueError)
    for a file that is none of them, or a newer version of one, and OSError
    when the file cannot be read."""
    with open(path, encoding="utf-8") as f:
        return loads(f.read(), source=os.fspath(path))


def loads(text: str, *, source: str = "<string>") -> List[Row]:
    """The results in ``text``, the content of a result file, as ``load``
    returns them. ``source`` names the text in error messages."""
    return _formats.parse(text, source)


def _rows_of(source: Union[PathLike, Sequence[Row]]) -> List[Row]:
    if isinstance(source, (str, os.PathLike)):
        return load(source)
    return list(source)


def _optional(module: str, package: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"fedwan_results.{what} needs {package}, which cannot be imported ({e}). Install "
            f"it (pip install {package}, or apt install python3-{package}); "
            "fedwan_results.load() gives the same rows as plain dicts without it.") from e


def _columns(rows: Sequence[Row]) -> List[str]:
    seen: Dict[str, None] = {}
    for r in rows:
        for key in r:
            seen.setdefault(key, None)
    return list(seen)


def to_frame(rows: Sequence[Row]) -> Any:
    """``rows`` (as ``load`` returns them) as a ``pandas.DataFrame``, one
    row per result, the columns in the order they first appear; a missing
    value is None (NaN in numeric columns). Raises ImportError saying what to
    install when pandas is not installed."""
    pandas = _optional("pandas", "pandas", "to_frame")
    return pandas.DataFrame.from_records(list(rows), columns=_columns(rows))


def load_frame(path: PathLike) -> Any:
    """``to_frame(load(path))``: the results in ``path`` as a
    ``pandas.DataFrame``. Raises ImportError without pandas."""
    return to_frame(load(path))


def default_columns(kind: str) -> List[str]:
    """The columns ``show`` and ``format_table`` print for rows of ``kind``
    when not told otherwise. Raises ValueError for an unknown kind."""
    if kind not in _DEFAULT_COLUMNS:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    return list(_DEFAULT_COLUMNS[kind])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def format_table(rows: Sequence[Row], columns: Optional[Sequence[str]] = None) -> str:
    """``rows`` as a text table with a header line. ``columns`` picks and
    orders the columns; by default those of ``default_columns`` for the
    rows' kind that some row fills in (every column for mixed kinds). Floats keep
    four significant digits (whole numbers from 1000 up); None prints as ``-``."""
    if columns is None:
        kinds = {r.get("kind") for r in rows}
        present = [c for c in _columns(rows) if any(r.get(c) not in (None, "") for r in rows)]
        if len(kinds) == 1 and next(iter(kinds)) in _DEFAULT_COLUMNS:
            columns = [c for c in _DEFAULT_COLUMNS[str(next(iter(kinds)))] if c in present]
        else:
            columns = present
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows)
               for c in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    return "\n".join([line(list(columns))] + [line(row) for row in cells])


# ---- plots -------------------------------------------------------------------

def plot(source: Union[PathLike, Sequence[Row]], ax: Optional[_Axes] = None, *,
         title: Optional[str] = None) -> _Axes:
    """Draws the standard plot of a result file (or of its rows) and returns
    the matplotlib Axes; ``ax.figure`` is its figure.

    ``micro``: each benchmark's ratio to its group's baseline (memcpy; AES-
    256-GCM for Seal) as horizontal bars. ``federation``: the accuracy per
    round, with the central-training baseline when the report has one, and
    the WAN bytes per round against what fp32 updates would have sent (on a
    second y axis when there is an accuracy). ``aggregator_memory``: the
    region's peak memory per site count against the window bound and a
    design that kept every child's delta. ``sync``: the timed sync times of
    each driver, labelled with their median ratio to C++. ``gpu_codec``:
    the kernel ratio per chunk size for each codec. ``gpu_allreduce``: each
    method's ratio to the baseline per size.

    Draws into ``ax`` when given, else into a new pyplot figure. Raises
    ImportError without matplotlib, ValueError when the rows mix kinds or
    hold nothing to plot."""
    rows = _rows_of(source)
    kinds = {r.get("kind") for r in rows}
    if len(kinds) != 1:
        raise ValueError("plot() takes the rows of one kind of result; got "
                         + (", ".join(sorted(map(str, kinds))) or "no rows"))
    kind = str(kinds.pop())
    draw = _PLOTTERS.get(kind)
    if draw is None:
        raise ValueError(f"no plot for rows of kind {kind!r}")
    if ax is None:
        plt = _optional("matplotlib.pyplot", "matplotlib", "plot")
        height = max(3.5, 0.3 * len(rows) + 1.0) if kind == "micro" else 4.5
        _, ax = plt.subplots(figsize=(8.0, height), layout="constrained")
    default_title = draw(rows, ax)
    ax.set_title(title if title is not None else default_title)
    return ax


def _plot_micro(rows: List[Row], ax: _Axes) -> str:
    shown = [r for r in rows if r["ratio"] is not None]
    if not shown:
        raise ValueError("no ratios to plot: the results hold no baseline benchmark "
                         "(BM_<group>_Memcpy, BM_Seal_RawAes256Gcm) of the same chunk")
    groups = list(dict.fromkeys(r["group"] for r in shown))
    colors = {g: f"C{i % 10}" for i, g in enumerate(groups)}
    ys = list(range(len(shown)))[::-1]  # the first result at the top
    ax.barh(ys, [r["ratio"] for r in shown], color=[colors[r["group"]] for r in shown])
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{r['group']} {r['what']} {r['chunk']}" for r in shown])
    ax.set_ylim(-0.6, len(shown) - 0.4)
    ax.axvline(1.0, color="black", linewidth=0.8)
    patch = importlib.import_module("matplotlib.patches").Patch
    ax.legend(handles=[patch(color=colors[g], label=f"{g}: baseline {_formats.group_baseline(g)}")
                       for g in groups], loc="lower right", fontsize="small")
    ax.set_xlabel("bytes/s over the baseline's, same run and chunk")
    return "ratio to the baseline of the same run"


def _plot_federation(rows: List[Row], ax: _Axes) -> str:
    rounds = [r["round"] for r in rows]
    handles: List[Any] = []
    bytes_ax = ax
    if any(r["accuracy"] is not None for r in rows):
        handles += ax.plot(rounds, [r["accuracy"] for r in rows], marker="o", color="C0",
                           label="accuracy")
        base = rows[0].get("baseline_accuracy")
        if base is not None:
            handles.append(ax.axhline(base, color="C0", linestyle="--",
                                      label="central training (baseline)"))
        ax.set_ylabel("accuracy of the global model")
        bytes_ax = ax.twinx()
        ax.set_zorder(bytes_ax.get_zorder() + 1)  # the accuracy line over the bars
        ax.patch.set_visible(False)
    handles.append(bytes_ax.bar(rounds, [(r["wan_bytes"] or 0) / 1e6 for r in rows],
                                width=0.6, alpha=0.4, color="C1", label="WAN bytes"))
    handles += bytes_ax.plot(rounds, [(r["fp32_bytes"] or 0) / 1e6 for r in rows],
                             color="C1", linestyle=":", marker="_", label="fp32 updates")
    bytes_ax.set_ylabel("MB per round")
    bytes_ax.set_ylim(bottom=0)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(importlib.import_module("matplotlib.ticker").MaxNLocator(
        integer=True))
    ax.legend(handles=handles, loc="best", fontsize="small")
    wan = sum(r["wan_bytes"] or 0 for r in rows)
    fp32 = sum(r["fp32_bytes"] or 0 for r in rows)
    share = f" = {wan / fp32:.3f} of fp32" if fp32 else ""
    return f"federation: {len(rows)} rounds, WAN {wan / 1e6:.2f} MB{share}"


def _plot_aggregator_memory(rows: List[Row], ax: _Axes) -> str:
    rows = sorted(rows, key=lambda r: r["sites"])
    base = rows[0]
    sites = [r["sites"] for r in rows]
    ax.fill_between(sites, [r["peak_min_mib"] for r in rows], [r["peak_max_mib"] for r in rows],
                    alpha=0.25, color="C0", label="peak, lowest..highest run")
    ax.plot(sites, [r["peak_max_mib"] for r in rows], marker="o", color="C0",
            label="peak (highest run)")
    compared = [r for r in rows if r.get("window_bound_mib") is not None]
    xs = [base["sites"]] + [r["sites"] for r in compared]
    ax.plot(xs, [base["peak_max_mib"]] + [base["peak_max_mib"] + r["window_bound_mib"]
                                          for r in compared],
            color="C2", linestyle="--", label="allowed: window bound")
    ax.plot(xs, [base["peak_max_mib"]] + [base["peak_max_mib"] + r["extra_deltas_mib"]
                                          for r in compared],
            color="C3", linestyle=":", label="if it kept every child's delta")
    ax.set_xticks(sites)
    ax.set_xlabel("sites under the region")
    ax.set_ylabel("region peak RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize="small")
    verdict = "PASS" if all(r.get("ok") is not False for r in rows) else "FAIL"
    return (f"region aggregator memory: {base.get('params')} parameters, {base.get('codec')}: "
            f"{verdict}")


def _plot_sync(rows: List[Row], ax: _Axes) -> str:
    site = [r for r in rows if r["role"] == "site" and r["timed"]]
    if not site:  # root reports alone
        for run in dict.fromkeys(r["run"] for r in rows):
            mine = [r for r in rows if r["run"] == run]
            ax.plot([r["sync"] for r in mine], [r["round_s"] for r in mine], marker="o",
                    label=f"run {run}")
        ax.set_xlabel("round")
        ax.set_ylabel("seconds per round (root)")
        ax.legend(fontsize="small")
        return "root: time per round"
    drivers = list(dict.fromkeys(r["driver"] for r in site))
    ax.boxplot([[r["sync_s"] for r in site if r["driver"] == d] for d in drivers])
    labels = []
    for d in drivers:
        ratios = [r["ratio"] for r in site if r["driver"] == d and r["ratio"] is not None]
        ratio = f"\n{statistics.median(ratios):.3f}x C++" if ratios else ""
        labels.append(_DRIVER_LABELS.get(d, str(d)) + ratio)
    ax.set_xticks(range(1, len(drivers) + 1))
    ax.set_xticklabels(labels)
    ax.set_ylabel("seconds per sync (timed syncs)")
    ax.set_ylim(bottom=0)
    return f"time per sync, {site[0].get('params')} parameters, {site[0].get('codec')}"


def _plot_gpu_codec(rows: List[Row], ax: _Axes) -> str:
    for i, codec in enumerate(dict.fromkeys(r["codec"] for r in rows)):
        for ef in (False, True):
            mine = sorted((r for r in rows if r["codec"] == codec and r["ef"] == ef),
                          key=lambda r: r["chunk_mib"])
            if mine:
                ax.plot([r["chunk_mib"] for r in mine], [r["kernel_ratio"] for r in mine],
                        marker="o", color=f"C{i % 10}", linestyle="--" if ef else "-",
                        label=codec + (" + error feedback" if ef else ""))
    _log2_axis(ax, [r["chunk_mib"] for r in rows])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("chunk (MiB of fp32)")
    ax.set_ylabel("device copy time / encode time")
    ax.legend(fontsize="small")
    return f"GPU codecs against the device's copy ({rows[0].get('device') or 'GPU'})"


def _plot_gpu_allreduce(rows: List[Row], ax: _Axes) -> str:
    baseline = rows[0]["baseline"]
    for i, method in enumerate(m for m in _formats.ALLREDUCE_METHODS if m != baseline):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["size_mib"])
        if mine:
            ax.plot([r["size_mib"] for r in mine], [r["ratio"] for r in mine], marker="o",
                    color=f"C{i}", label=method)
    ax.axhline(1.0, color="black", linewidth=0.8, label=f"{baseline} (baseline)")
    _log2_axis(ax, [r["size_mib"] for r in rows])
    ax.set_xlabel("allreduce size (MiB)")
    ax.set_ylabel("baseline time / time")
    ax.legend(fontsize="small")
    return f"bucketed allreduce, {rows[0].get('ranks')} ranks, against {baseline}"


def _log2_axis(ax: _Axes, sizes: List[int]) -> None:
    """A log2 x axis with a tick, written out, at each size."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(sizes))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()


_PLOTTERS = {
    "micro": _plot_micro,
    "federation": _plot_federation,
    "aggregator_memory": _plot_aggregator_memory,
    "sync": _plot_sync,
    "gpu_codec": _plot_gpu_codec,
    "gpu_allreduce": _plot_gpu_allreduce,
}


# ---- the command line --------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fedwan_results show|plot ...``; returns the exit status:
    0, or 2 when the file cannot be read or plotted (the reason on stderr)."""
    p = argparse.ArgumentParser(prog="python -m fedwan_results",
                                description="Show or plot a fedwan result file.")
    sub = p.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print the file's rows")
    show.add_argument("file")
    show.add_argument("--columns", help="comma-separated columns (default: the main ones)")
    show.add_argument("--all", action="store_true", help="print every column")
    show.add_argument("--format", choices=("table", "csv", "json"), default="table",
                      help="table (default), csv, or json (one object per line)")
    pl = sub.add_parser("plot", help="draw the file's plot into an image")
    pl.add_argument("file")
    pl.add_argument("-o", "--output", required=True,
                    help="image to write; the format follows the extension (.png, .svg, .pdf)")
    pl.add_argument("--title", help="the plot's title (default: one saying what it shows)")
    pl.add_argument("--dpi", type=float, default=150.0)
    args = p.parse_args(argv)
    try:
        rows = load(args.file)
        if args.command == "plot":
            return _plot_to_file(rows, args.output, args.title, args.dpi)
        _show(rows, args)
        return 0
    except (OSError, ValueError, ImportError) as e:
        print(f"fedwan_results: {e}", file=sys.stderr)
        return 2


def _show(rows: List[Row], args: argparse.Namespace) -> None:
    columns: Optional[List[str]] = None
    if args.columns:
        columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    elif args.all or args.format != "table":
        columns = _columns(rows)
    if args.format == "json":
        for r in rows:
            print(json.dumps({c: r.get(c) for c in columns or _columns(rows)}))
    elif args.format == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(columns or [])
        for r in rows:
            w.writerow(["" if r.get(c) is None else r.get(c) for c in columns or []])
    else:
        kinds = sorted({str(r.get("kind")) for r in rows})
        print(f"{args.file}: {len(rows)} rows of kind {', '.join(kinds)}")
        print(format_table(rows, columns))


def _plot_to_file(rows: List[Row], output: str, title: Optional[str], dpi: float) -> int:
    matplotlib = _optional("matplotlib", "matplotlib", "plot")
    matplotlib.use("Agg")  # a file, never a window
    plt = importlib.import_module("matplotlib.pyplot")
    figure = plot(rows, title=title).figure
    try:
        figure.savefig(output, dpi=dpi)
    finally:
        plt.close(figure)
    print(f"wrote {output}")
    return 0
