"""PNG plots of a bench.json (matplotlib, Debian's python3-matplotlib).

What is drawn depends on what the invocation varied (`--sweep`):
  rate_mbit / delay_ms  -> round time against bandwidth / one-way delay, with
                           the ideal bound and each baseline;
  codec                 -> WAN bytes per round by codec;
  inner_steps           -> site compute utilisation against H;
  overlap_steps         -> site compute utilisation against tau (0: blocking);
  streams               -> round time against TCP connections per link;
  params / sites        -> round time against model size / number of sites;
and, for runs that trained the Fashion-MNIST model, accuracy against
cumulative WAN bytes. Every invocation also gets rounds.png: each run's
round time and site wait per round against the ideal bound. Blocking and
overlapped runs are separate series (unless the sweep is over tau itself).
"""

from __future__ import annotations

import os

from . import report

LABELS = {
    "rate_mbit": "root-tier rate (Mbit/s)",
    "delay_ms": "root-tier one-way delay (ms)",
    "codec": "codec",
    "inner_steps": "inner steps per round (H)",
    "overlap_steps": "overlap steps (tau; 0 = blocking)",
    "streams": "TCP connections per link (streams)",
    "params": "parameters",
    "sites": "sites",
}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def series(runs: list[dict], key: str) -> dict[str, list[tuple]]:
    """Legend -> [(sweep value, run)], in sweep order: one series per run name
    and, when the invocation has overlapped runs, per mode ("fedwan
    (blocking)", "fedwan-overlap (overlap tau=2)"), so that blocking and
    overlap are separate lines; a sweep over tau (`key` overlap_steps) keeps
    each name one line across the modes it runs through."""
    overlapped = any(report.mode(r) != "blocking" for r in runs)
    out: dict[str, list[tuple]] = {}
    for r in runs:
        label = r["name"]
        if overlapped and key != "overlap_steps":
            label += f" ({report.mode(r)})"
        out.setdefault(label, []).append((r.get("sweep_value"), r))
    return out


def write(doc: dict, out_dir: str) -> list[str]:
    """Writes the plots; returns their paths. Raises ImportError without
    matplotlib."""
    plt = _pyplot()
    paths = []
    runs = doc["runs"]

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        label = _label(r)
        xs = [row["round"] for row in r["rounds"]]
        ax.plot(xs, [row["round_s"] for row in r["rounds"]], marker="o", label=f"{label}: round")
        ax.plot(xs, [row["site_wait_s"] for row in r["rounds"]], ls="--", label=f"{label}: wait")
        ax.plot(xs, [row["ideal_s"] for row in r["rounds"]], ls=":", label=f"{label}: ideal")
    ax.set_xlabel("round")
    ax.set_ylabel("seconds")
    ax.set_title(f"Rounds under {runs[0]['profile']['name']}")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out_dir, "rounds.png", plt))

    sweep = doc.get("sweep")
    if sweep:
        key = sweep["key"]
        lines = series(runs, key)
        ours = [(r["sweep_value"], r) for r in runs if r["name"] == "fedwan"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if key == "codec":
            ax.bar([str(v) for v, _ in ours],
                   [r["wan_bytes_total"] / len(r["rounds"]) / 1e6 for _, r in ours])
            ax.set_ylabel("WAN bytes per round (MB)")
            name = "bytes_by_codec.png"
        elif key in ("inner_steps", "overlap_steps"):
            for n, pts in lines.items():
                ax.plot([v for v, _ in pts], [r["site_utilisation_mean"] for _, r in pts],
                        marker="o", label=n)
            ax.set_ylabel("site compute utilisation")
            ax.set_ylim(0, 1.05)
            name = "utilisation_vs_h.png" if key == "inner_steps" else "utilisation_vs_tau.png"
        else:
            for n, pts in lines.items():
                ax.plot([v for v, _ in pts], [r["round_s_median"] for _, r in pts], marker="o",
                        label=f"{n}: round time")
            ax.plot([v for v, _ in ours], [r["ideal_s_median"] for _, r in ours], ls=":",
                    label="fedwan: ideal bound")
            ax.set_ylabel("median round time (s)")
            if key in ("rate_mbit", "params"):
                ax.set_xscale("log")
            name = f"round_time_vs_{key}.png"
        ax.set_xlabel(LABELS.get(key, key))
        ax.legend(fontsize=8)
        paths.append(_save(fig, out_dir, name, plt))

    accuracy_runs = [r for r in runs if any(row.get("accuracy") is not None for row in r["rounds"])]
    if accuracy_runs:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in accuracy_runs:
            total, xs, ys = 0, [], []
            for row in r["rounds"]:
                total += row["wan_bytes"]
                if row.get("accuracy") is not None:
                    xs.append(total / 1e6)
                    ys.append(row["accuracy"])
            ax.plot(xs, ys, marker=".", label=_label(r))
        ax.set_xlabel("cumulative WAN bytes (MB)")
        ax.set_ylabel("test accuracy")
        ax.legend(fontsize=8)
        paths.append(_save(fig, out_dir, "accuracy_vs_wan_bytes.png", plt))
    return paths


def _label(r: dict) -> str:
    """A run's name, its mode when overlapped, its streams when more than one
    and its sweep value."""
    label = r["name"]
    if report.mode(r) != "blocking":
        label += f", {report.mode(r)}"
    if report.streams(r) != 1:
        label += f", {report.streams(r)} streams"
    v = r.get("sweep_value")
    return label if v is None else f"{label} ({v})"


def _save(fig, out_dir: str, name: str, plt) -> str:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
