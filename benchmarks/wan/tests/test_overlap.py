"""Overlapped rounds in the harness: --overlap-steps, --modes and the
overlap-steps sweep, the topology they write, and how the reports and plots
tell blocking runs from overlapped ones (no namespaces, no processes)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fedwan_bench import federation, metrics, plots, report  # noqa: E402
from fedwan_bench.__main__ import add_run_flags, plan_from, specs_from  # noqa: E402
from test_harness import parse_run as parse, plan_fails as fails, raw_record  # noqa: E402



def test_blocking_is_the_default():
    specs = specs_from(parse())
    assert [(s.name, s.overlap_steps, s.mode) for s in specs] == \
        [("fedwan", 0, "blocking"), ("flat-fp32", 0, "blocking")]


def test_overlap_steps_sets_the_fedwan_run_and_not_the_baselines():
    specs = specs_from(parse("--overlap-steps", "3", "--baselines", "flat-fp32"))
    assert [(s.name, s.overlap_steps, s.mode) for s in specs] == \
        [("fedwan", 3, "overlap tau=3"), ("flat-fp32", 0, "blocking")]
    # tau = H is allowed: the anchor merges a whole round late.
    assert specs_from(parse("--overlap-steps", "10"))[0].overlap_steps == 10


def test_overlap_steps_are_checked_against_the_inner_steps_before_anything_runs():
    fails("--overlap-steps 11 is more than --inner-steps 10", "--overlap-steps", "11")
    fails("--overlap-steps 5 is more than --inner-steps 4",
          "--overlap-steps", "5", "--inner-steps", "4")
    fails(r"--quick runs H=2", "--quick", "--overlap-steps", "3")
    fails("0 \\(blocking rounds\\) or more", "--overlap-steps", "-1")


def test_modes_run_blocking_and_overlap_side_by_side():
    for modes in ("blocking,overlap", "overlap,blocking", " overlap , blocking "):
        specs = specs_from(parse("--modes", modes, "--overlap-steps", "2"))
        assert [(s.name, s.mode) for s in specs] == [
            ("fedwan", "blocking"), ("fedwan-overlap", "overlap tau=2"),
            ("flat-fp32", "blocking")]
        # The same federation otherwise: only the rounds differ.
        assert specs[0] == replace(specs[1], name="fedwan", overlap_steps=0)
    only = specs_from(parse("--modes", "overlap", "--overlap-steps", "1", "--baselines", "none"))
    assert [(s.name, s.mode) for s in only] == [("fedwan-overlap", "overlap tau=1")]


def test_modes_are_checked():
    fails("--modes overlap needs --overlap-steps N", "--modes", "blocking,overlap")
    fails("add overlap to --modes", "--modes", "blocking", "--overlap-steps", "2")
    fails("a comma-separated list of blocking, overlap", "--modes", "blocking,eager")
    fails("a comma-separated list", "--modes", ",")
    fails("more than --inner-steps", "--modes", "blocking,overlap", "--overlap-steps", "12")


def test_the_overlap_steps_sweep_is_one_fedwan_run_per_value():
    plan, sweep = plan_from(parse("--sweep", "overlap-steps=0,2,10"))
    assert sweep == ("overlap_steps", [0, 2, 10])
    ours = [(v, s.name, s.mode) for v, s, _ in plan if s.name != "flat-fp32"]
    assert ours == [(0, "fedwan", "blocking"), (2, "fedwan", "overlap tau=2"),
                    (10, "fedwan", "overlap tau=10")]
    assert {s.overlap_steps for _, s, _ in plan if s.name == "flat-fp32"} == {0}
    fails(r"--overlap-steps 11 is more than --inner-steps 10: "
          r".*\(--sweep overlap-steps=0,11, at overlap-steps=11\)", "--sweep", "overlap-steps=0,11")
    fails("sets each run's mode", "--sweep", "overlap-steps=0,2", "--modes", "blocking,overlap")


def test_an_inner_steps_sweep_checks_tau_at_every_point():
    fails(r"--overlap-steps 5 is more than --inner-steps 2: .*at inner-steps=2\)",
          "--sweep", "inner-steps=2,10", "--overlap-steps", "5")
    plan, _ = plan_from(parse("--sweep", "inner-steps=5,10", "--modes", "blocking,overlap",
                              "--overlap-steps", "5"))
    assert [(v, s.name, s.inner_steps, s.overlap_steps) for v, s, _ in plan] == [
        (5, "fedwan", 5, 0), (5, "fedwan-overlap", 5, 5), (5, "flat-fp32", 5, 0),
        (10, "fedwan", 10, 0), (10, "fedwan-overlap", 10, 5), (10, "flat-fp32", 10, 0)]


def test_the_help_names_the_new_flags():
    p = argparse.ArgumentParser()
    add_run_flags(p)
    text = " ".join(p.format_help().split())
    assert "--overlap-steps N" in text and "0 = blocking rounds (default), at most H" in text
    assert "--modes MODE,..." in text and "fedwan-overlap" in text
    assert "overlap-steps (0 = blocking; not with --modes)" in text


def test_the_topology_carries_overlap_steps_in_its_federation_section():
    spec = federation.BenchFederation(name="fedwan", inner_steps=10, overlap_steps=4)
    text = federation.topology_yaml(spec, federation.plan_nodes(spec))
    federation_section = text[text.index("federation:"):text.index("nodes:")]
    assert "\n  overlap_steps: 4\n" in federation_section
    assert "\n  inner_steps: 10\n" in federation_section
    blocking = federation.BenchFederation(name="fedwan")
    assert "overlap_steps" not in federation.topology_yaml(blocking,
                                                           federation.plan_nodes(blocking))


def summary(name: str = "fedwan", overlap_steps: int = 0, utilisation: float = 0.25,
            value=None, flat: bool = False) -> dict:
    raw = raw_record(flat=flat)
    raw["spec"] = dict(raw["spec"], name=name, overlap_steps=overlap_steps)
    raw["site_reports"] = {k: dict(v, utilisation=utilisation)
                           for k, v in raw["site_reports"].items()}
    s = metrics.summarise(raw)
    s["sweep_value"] = value
    return s


def test_each_run_states_its_mode_and_utilisation():
    blocking = summary()
    overlapped = summary("fedwan-overlap", overlap_steps=2, utilisation=0.8)
    assert (blocking["mode"], blocking["overlap_steps"]) == ("blocking", 0)
    assert (overlapped["mode"], overlapped["overlap_steps"]) == ("overlap tau=2", 2)
    assert overlapped["site_utilisation_mean"] == 0.8
    # The site's wait is still its sync_s (time at the merge in overlap mode).
    assert overlapped["site_wait_s_median"] == blocking["site_wait_s_median"]
    # The transfer overlapped training: without the overlap window in the
    # reports nothing times it; with it, the goodput is over that window.
    assert blocking["goodput"]["root/up"]["mbit_per_link_while_waiting"] is not None
    assert overlapped["goodput"]["root/up"]["mbit_per_link_while_waiting"] is None
    assert overlapped["rounds"][1]["site_overlap_s"] is None
    raw = raw_record()
    raw["spec"] = dict(raw["spec"], overlap_steps=2)
    for rep in raw["site_reports"].values():
        rep["rounds"] = [dict(r, overlap_s=4.0) for r in rep["rounds"]]
    timed = metrics.summarise(raw)
    assert [r["site_overlap_s"] for r in timed["rounds"]] == [4.0, 4.0]
    assert timed["site_wait_s_median"] == blocking["site_wait_s_median"]
    # root/up carried 2050 B of new payload over 2 x 4 s on its one link.
    assert timed["goodput"]["root/up"]["mbit_per_link_while_waiting"] == \
        pytest.approx(2050 * 8 / 8.0 / 1e6)
    # A record from before overlap existed reads as blocking.
    old = raw_record()
    assert "overlap_steps" not in old["spec"]
    assert metrics.summarise(old)["mode"] == "blocking"
    assert report.mode({"name": "x"}) == "blocking"


def test_the_report_puts_blocking_and_overlap_side_by_side(tmp_path):
    blocking = summary(utilisation=0.5)
    overlapped = summary("fedwan-overlap", overlap_steps=2, utilisation=0.9)
    flat = summary("flat-fp32", flat=True, utilisation=0.4)
    overlapped["round_s_median"] = blocking["round_s_median"] / 2
    runs = [blocking, overlapped, flat]
    doc = {"runs": runs, "machine": {"cores": 2, "kernel": "k", "tcp_cc": "bbr"},
           "failed": [{"name": "fedwan-overlap", "mode": "overlap tau=2", "sweep_value": 20,
                       "error": "node site-1 exited 1"}],
           "comparisons": report.comparisons(runs)}
    assert set(doc["comparisons"]) == {"fedwan vs flat-fp32", "fedwan-overlap vs flat-fp32",
                                       "fedwan-overlap vs fedwan"}
    c = doc["comparisons"]["fedwan-overlap vs fedwan"]
    assert c["round_time_speedup"] == pytest.approx(2.0)
    assert c["site_utilisation"] == {"ours": 0.9, "baseline": 0.5}
    text = report.markdown(doc)
    assert "| run | mode | sites |" in text
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| f")}
    assert rows["| fedwan"].startswith("| fedwan | blocking | 2 (1x2) |")
    assert rows["| fedwan-overlap"].startswith("| fedwan-overlap | overlap tau=2 | 2 (1x2) |")
    assert rows["| flat-fp32"].startswith("| flat-fp32 | blocking | 2 (flat) |")
    assert "| 0.900 |" in rows["| fedwan-overlap"] and "| 0.500 |" in rows["| fedwan"]
    assert "- fedwan-overlap vs fedwan: 2.00x less time per round" in text
    assert "site utilisation 0.900 against 0.500" in text
    assert "waited at the merge" in text
    json_path, _ = report.write(doc, str(tmp_path))
    with open(json_path) as f:
        written = json.load(f)
    assert [(r["name"], r["mode"], r["site_utilisation_mean"]) for r in written["runs"]] == [
        ("fedwan", "blocking", 0.5), ("fedwan-overlap", "overlap tau=2", 0.9),
        ("flat-fp32", "blocking", 0.4)]


def inner_steps_sweep(overlap: bool) -> list[dict]:
    runs = []
    for h in (5, 10, 20):
        runs.append(summary(utilisation=h / 40, value=h))
        if overlap:
            runs.append(summary("fedwan-overlap", overlap_steps=5, utilisation=h / 25, value=h))
        runs.append(summary("flat-fp32", flat=True, utilisation=h / 50, value=h))
    return runs


def test_the_utilisation_plot_splits_blocking_and_overlap():
    lines = plots.series(inner_steps_sweep(overlap=True), "inner_steps")
    assert list(lines) == ["fedwan (blocking)", "fedwan-overlap (overlap tau=5)",
                           "flat-fp32 (blocking)"]
    assert [(v, r["site_utilisation_mean"]) for v, r in lines["fedwan-overlap (overlap tau=5)"]] \
        == [(5, 0.2), (10, 0.4), (20, 0.8)]
    assert [v for v, _ in lines["fedwan (blocking)"]] == [5, 10, 20]
    # Without overlapped runs the legend is the run's name, as before.
    assert list(plots.series(inner_steps_sweep(overlap=False), "inner_steps")) == \
        ["fedwan", "flat-fp32"]
    # A sweep over tau is one line per name, blocking point included.
    tau_sweep = [summary(overlap_steps=t, value=t) for t in (0, 2, 5)]
    assert {k: [v for v, _ in pts] for k, pts in plots.series(tau_sweep, "overlap_steps").items()} \
        == {"fedwan": [0, 2, 5]}


def test_the_utilisation_plot_draws_each_mode(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    drawn = {}
    save = plots._save

    def keep_legend(fig, out_dir, name, plt):
        drawn[name] = fig.axes[0].get_legend_handles_labels()[1]
        return save(fig, out_dir, name, plt)

    monkeypatch.setattr(plots, "_save", keep_legend)
    doc = {"runs": inner_steps_sweep(overlap=True),
           "sweep": {"key": "inner_steps", "values": [5, 10, 20]}}
    paths = plots.write(doc, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["rounds.png", "utilisation_vs_h.png"]
    assert drawn["utilisation_vs_h.png"] == ["fedwan (blocking)", "fedwan-overlap (overlap tau=5)",
                                             "flat-fp32 (blocking)"]
    assert "fedwan-overlap, overlap tau=5 (10): round" in drawn["rounds.png"]
    doc = {"runs": [summary(overlap_steps=t, value=t) for t in (0, 2)],
           "sweep": {"key": "overlap_steps", "values": [0, 2]}}
    assert os.path.basename(plots.write(doc, str(tmp_path))[1]) == "utilisation_vs_tau.png"
    assert drawn["utilisation_vs_tau.png"] == ["fedwan"]


def test_fashion_runs_show_their_accuracy_and_the_payload_ratio_is_reported():
    blocking = summary(utilisation=0.5)
    overlapped = summary("fedwan-overlap", overlap_steps=2, utilisation=0.9)
    for r, acc in ((blocking, 0.8649), (overlapped, 0.8605)):
        r["spec"] = dict(r["spec"], trainer="fashion-cnn")
        r["final_accuracy"] = acc
    blocking["links"] = {"root/up": {"tcp_new_payload_bytes": 1000},
                         "root/down": {"tcp_new_payload_bytes": 1000}}
    overlapped["links"] = {"root/up": {"tcp_new_payload_bytes": 500},
                           "root/down": {"tcp_new_payload_bytes": 502}}
    runs = [blocking, overlapped]
    doc = {"runs": runs, "machine": {"cores": 2, "kernel": "k", "tcp_cc": "bbr"},
           "failed": [], "comparisons": report.comparisons(runs)}
    c = doc["comparisons"]["fedwan-overlap vs fedwan"]
    assert c["root_tier_payload_ratio"] == pytest.approx(1002 / 2000)
    text = report.markdown(doc)
    header = next(line for line in text.splitlines() if line.startswith("| run |"))
    assert header.endswith("| busy | accuracy |")
    rows = [line for line in text.splitlines() if line.startswith("| fedwan")]
    assert rows[0].endswith(" 0.8649 |") and rows[1].endswith(" 0.8605 |")
    assert "| fashion-cnn |" in rows[0]
    assert "root-tier payload 0.5010 of the baseline's" in text
    # Without a payload count per tier (a record without links) no ratio.
    assert report.root_tier_payload({"links": {}}) is None
    # Synthetic runs keep their size and no accuracy column.
    plain = report.markdown({"runs": [summary()], "machine": doc["machine"], "failed": [],
                             "comparisons": {}})
    assert "accuracy" not in next(line for line in plain.splitlines()
                                  if line.startswith("| run |"))
