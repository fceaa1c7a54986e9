"""TCP connections per tree link in the harness: --streams and the streams
sweep, the topology they write, and how the reports and plots name a run
with more than one connection per link (no namespaces, no processes)."""

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



def federation_section(spec: federation.BenchFederation) -> str:
    text = federation.topology_yaml(spec, federation.plan_nodes(spec))
    return text[text.index("federation:"):text.index("nodes:")]


def test_fedwan_runs_auto_and_the_baselines_one_connection_by_default():
    assert federation.BenchFederation(name="fedwan").streams == 1
    auto = federation.AUTO_STREAMS
    specs = specs_from(parse("--baselines", "flat-fp32"))
    assert [(s.name, s.streams) for s in specs] == [("fedwan", auto), ("flat-fp32", 1)]
    modes = specs_from(parse("--modes", "blocking,overlap", "--overlap-steps", "2",
                             "--baselines", "none"))
    assert {s.streams for s in modes} == {auto}
    assert specs_from(parse("--streams", "auto"))[0].streams == auto


def test_streams_sets_the_fedwan_runs_and_not_the_baselines():
    specs = specs_from(parse("--streams", "4"))
    assert [(s.name, s.streams) for s in specs] == [("fedwan", 4), ("flat-fp32", 1)]
    # The same federation otherwise.
    assert replace(specs[0], streams=federation.AUTO_STREAMS) == specs_from(parse())[0]
    both = specs_from(parse("--streams", "16", "--modes", "blocking,overlap",
                            "--overlap-steps", "3"))
    assert [(s.name, s.overlap_steps, s.streams) for s in both] == [
        ("fedwan", 0, 16), ("fedwan-overlap", 3, 16), ("flat-fp32", 0, 1)]
    assert specs_from(parse("--streams", "2", "--baselines", "none"))[0].streams == 2


def test_streams_are_checked_before_anything_runs():
    assert specs_from(parse("--streams", "auto", "--plaintext"))[0].streams == 0
    fails(r"--streams 17: 1 to 16 TCP connections per tree link", "--streams", "17")
    fails(r"--streams -1: 1 to 16", "--streams", "-1")
    # Plaintext frames have no sequence numbers to put back in order.
    fails(r"--streams 4 needs the secure channel: drop --plaintext", "--streams", "4",
          "--plaintext")
    assert specs_from(parse("--streams", "1", "--plaintext"))[0].streams == 1
    with pytest.raises(SystemExit):
        parse("--streams", "two")


def test_the_topology_carries_streams_in_its_federation_section():
    spec = federation.BenchFederation(name="fedwan", streams=4)
    section = federation_section(spec)
    assert "\n  streams: 4\n" in section
    assert "\n  rounds: 4\n" in section
    text = federation.topology_yaml(spec, federation.plan_nodes(spec))
    assert text.count("streams") == 1  # the federation's only, not per node
    # One connection is written out: fedwan's own default is auto.
    one = federation.BenchFederation(name="fedwan")
    assert "\n  streams: 1\n" in federation_section(one)
    auto = federation.BenchFederation(name="fedwan", streams=federation.AUTO_STREAMS)
    assert "streams" not in federation.topology_yaml(auto, federation.plan_nodes(auto))
    # From the command line: the fedwan run's topology has it, the
    # baseline keeps one connection.
    ours, flat = specs_from(parse("--streams", "4"))
    assert "\n  streams: 4\n" in federation_section(ours)
    assert "\n  streams: 1\n" in federation_section(flat)


def test_the_streams_sweep_is_one_fedwan_run_per_value():
    plan, sweep = plan_from(parse("--sweep", "streams=1,2,4"))
    assert sweep == ("streams", [1, 2, 4])
    assert [(v, s.streams) for v, s, _ in plan if s.name == "fedwan"] == [(1, 1), (2, 2), (4, 4)]
    # The baselines keep one connection at every point.
    assert {s.streams for _, s, _ in plan if s.name == "flat-fp32"} == {1}
    fails(r"--streams 17: 1 to 16 .*\(--sweep streams=1,17, at streams=17\)",
          "--sweep", "streams=1,17")
    fails(r"needs the secure channel.*at streams=2\)", "--sweep", "streams=1,2", "--plaintext")
    fails("--sweep streams=1,x", "--sweep", "streams=1,x")


def test_the_help_names_the_flag():
    p = argparse.ArgumentParser()
    add_run_flags(p)
    text = " ".join(p.format_help().split())
    assert "--streams N|auto" in text
    assert "TCP connections per tree link (topology federation.streams)" in text
    assert "auto (the default: as many as pay" in text
    assert "--unprivileged-cc CC" in text
    assert "overlap-steps (0 = blocking; not with --modes), streams, params" in text


def summary(name: str = "fedwan", streams=None, value=None, flat: bool = False,
            overlap_steps: int = 0) -> dict:
    raw = raw_record(flat=flat)
    raw["spec"] = dict(raw["spec"], name=name, overlap_steps=overlap_steps)
    if streams is not None:
        raw["spec"]["streams"] = streams
    s = metrics.summarise(raw)
    s["sweep_value"] = value
    return s


def test_each_run_records_its_streams():
    assert summary(streams=4)["streams"] == 4
    assert summary(streams=1)["streams"] == 1
    # A record from before the knob: one connection per link.
    assert "streams" not in raw_record()["spec"]
    assert summary()["streams"] == 1
    # The mode stays the rounds' mode.
    assert summary(streams=4)["mode"] == "blocking"
    assert report.streams({"name": "x"}) == 1


def table_rows(runs: list[dict]) -> dict[str, str]:
    doc = {"runs": runs, "machine": {"cores": 2, "kernel": "k", "tcp_cc": "bbr"},
           "failed": [], "comparisons": report.comparisons(runs)}
    text = report.markdown(doc)
    assert "| run | mode | sites |" in text
    return {line.split(" | ")[0][2:]: line for line in text.splitlines()
            if line.startswith("| f")}


def test_the_report_names_the_streams_only_when_more_than_one():
    rows = table_rows([summary(streams=4), summary("fedwan-overlap", streams=2, overlap_steps=3),
                       summary("flat-fp32", flat=True, streams=1)])
    assert rows["fedwan"].startswith("| fedwan | blocking, 4 streams | 2 (1x2) |")
    assert rows["fedwan-overlap"].startswith(
        "| fedwan-overlap | overlap tau=3, 2 streams | 2 (1x2) |")
    assert rows["flat-fp32"].startswith("| flat-fp32 | blocking | 2 (flat) |")
    # One connection (set, or a record from before the knob): as before.
    for r in (summary(streams=1), summary()):
        assert table_rows([r])["fedwan"].startswith("| fedwan | blocking | 2 (1x2) |")
    sweep = table_rows([summary(streams=v, value=v) for v in (1, 4)])
    assert sweep["fedwan (1)"].startswith("| fedwan (1) | blocking | ")
    assert sweep["fedwan (4)"].startswith("| fedwan (4) | blocking, 4 streams | ")


def test_the_report_json_keeps_the_streams(tmp_path):
    runs = [summary(streams=4), summary("flat-fp32", flat=True)]
    doc = {"runs": runs, "machine": {"cores": 2, "kernel": "k", "tcp_cc": "bbr"},
           "failed": [], "comparisons": report.comparisons(runs)}
    json_path, _ = report.write(doc, str(tmp_path))
    with open(json_path) as f:
        written = json.load(f)
    assert [(r["name"], r["mode"], r["streams"]) for r in written["runs"]] == [
        ("fedwan", "blocking", 4), ("flat-fp32", "blocking", 1)]
    # More streams is no second mode: no fedwan-vs-fedwan comparison.
    assert set(doc["comparisons"]) == {"fedwan vs flat-fp32"}


def test_a_streams_sweep_plots_round_time_against_the_connections(tmp_path, monkeypatch):
    assert plots.LABELS["streams"] == "TCP connections per link (streams)"
    runs = []
    for v in (1, 2, 4):
        runs += [summary(streams=v, value=v), summary("flat-fp32", flat=True, value=v)]
    # One line per name across the values, as in the other sweeps.
    assert {k: [v for v, _ in pts] for k, pts in plots.series(runs, "streams").items()} == \
        {"fedwan": [1, 2, 4], "flat-fp32": [1, 2, 4]}
    assert plots._label(summary(streams=4)) == "fedwan, 4 streams"
    assert plots._label(summary(streams=1, value=1)) == "fedwan (1)"
    pytest.importorskip("matplotlib")
    drawn = {}
    save = plots._save

    def keep_axes(fig, out_dir, name, plt):
        ax = fig.axes[0]
        drawn[name] = (ax.get_xlabel(), ax.get_legend_handles_labels()[1])
        return save(fig, out_dir, name, plt)

    monkeypatch.setattr(plots, "_save", keep_axes)
    doc = {"runs": runs, "sweep": {"key": "streams", "values": [1, 2, 4]}}
    paths = plots.write(doc, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["rounds.png", "round_time_vs_streams.png"]
    xlabel, legend = drawn["round_time_vs_streams.png"]
    assert xlabel == "TCP connections per link (streams)"
    assert legend == ["fedwan: round time", "flat-fp32: round time", "fedwan: ideal bound"]
    assert "fedwan, 4 streams (4): round" in drawn["rounds.png"][1]


def test_an_unprivileged_host_runs_the_nodes_without_cap_net_admin():
    spec = specs_from(parse("--unprivileged-cc", "cubic", "--baselines", "none"))[0]
    assert spec.unprivileged_cc == "cubic"
    node = federation.plan_nodes(spec)[0]
    argv = federation._node_argv(spec, node, "fedwan", "/w")
    assert argv[:3] == ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin"]
    assert argv[3] == "fedwan"
    plain = specs_from(parse("--baselines", "none"))[0]
    assert federation._node_argv(plain, node, "fedwan", "/w")[0] == "fedwan"
