"""The harness's pure parts: profiles, the federation plan, the ideal bound,
the per-round figures and the reports, from records built by hand (no
namespaces, no processes)."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fedwan_bench import federation, metrics, profiles, report  # noqa: E402
from fedwan_bench.__main__ import add_run_flags, parse_count, plan_from  # noqa: E402


def parse_run(*argv: str) -> argparse.Namespace:
    """`fedwan bench run`'s flags, parsed as the command parses them."""
    p = argparse.ArgumentParser()
    add_run_flags(p)
    return p.parse_args(list(argv))


def plan_fails(match: str, *argv: str) -> None:
    """The run is refused before anything starts, with a message matching `match`."""
    with pytest.raises(SystemExit, match=match):
        plan_from(parse_run(*argv))


def test_named_profiles_match_the_documented_figures():
    ic = profiles.named("intercontinental").root_link
    assert (ic.rate_mbit, ic.delay_ms, ic.loss_percent) == (200, 40, 0.1)
    deg = profiles.named("degraded").root_link
    assert (deg.rate_mbit, deg.delay_ms, deg.jitter_ms, deg.loss_percent) == (50, 75, 25, 1)
    assert profiles.named("lan").root_link.rate_mbit == 10_000
    assert profiles.named("cross-region").root_link.delay_ms == 15
    with pytest.raises(ValueError, match="unknown profile"):
        profiles.named("moon")


def test_a_custom_profile_changes_only_what_it_names():
    p = profiles.custom(profiles.named("intercontinental"), rate_mbit=50)
    assert p.name == "custom"
    assert p.root_link.rate_mbit == 50 and p.root_link.delay_ms == 40
    assert p.root_link.loss_percent == 0.1
    assert p.site_link == profiles.named("intercontinental").site_link
    assert profiles.custom(profiles.named("lan")).name == "lan"


def test_parse_count():
    assert parse_count("10M") == 10_000_000
    assert parse_count("250k") == 250_000
    assert parse_count("1.5m") == 1_500_000
    assert parse_count("123") == 123
    for bad in ("ten", "0", "3G"):
        with pytest.raises(Exception):
            parse_count(bad)


def test_the_plan_puts_sites_under_regions_or_straight_under_the_root():
    spec = federation.BenchFederation(name="t", regions=2, sites_per_region=3)
    nodes = federation.plan_nodes(spec)
    assert [n.role for n in nodes].count("site") == 6
    assert {n.parent for n in nodes if n.role == "site"} == {"region-0", "region-1"}
    assert all(n.tier == "site" for n in nodes if n.role == "site")
    assert len({n.address for n in nodes}) == len(nodes)
    flat = federation.plan_nodes(federation.BenchFederation(name="f", regions=0, sites=5))
    assert [n.parent for n in flat if n.role == "site"] == ["root"] * 5
    assert all(n.tier == "root" for n in flat if n.role == "site")
    yaml = federation.topology_yaml(spec, nodes)
    assert "codec: fp16" in yaml and 'endpoint: "tcp://10.77.1.2:7000"' in yaml
    assert yaml.count("role: site") == 6


def test_the_emulator_config_gives_each_edge_its_tier():
    class Ns:
        def __init__(self, name):
            self.name = name

    spec = federation.BenchFederation(name="t", regions=1, sites_per_region=2)
    nodes = federation.plan_nodes(spec)
    prof = profiles.named("intercontinental")
    cfg = federation.emulator_config(nodes, {n.id: Ns("ns-" + n.id) for n in nodes}, prof, 3)
    by_child = {link["a"]: link for link in cfg["links"]}
    assert by_child["region-0"]["profile"]["rate_mbit"] == 200
    assert by_child["site-0"]["profile"]["rate_mbit"] == 1000
    assert by_child["site-1"]["b"] == "region-0"
    assert len(cfg["hosts"]) == 4 and cfg["seed"] == 3


def test_the_ideal_bound_is_the_bottleneck_plus_one_trip_up_and_down():
    links = {"root": {"rate_mbit": 200, "delay_ms": 40}, "site": {"rate_mbit": 1000, "delay_ms": 2}}
    b = 20_000_000
    t = metrics.ideal_round_seconds({"root": b, "site": b}, links, ["site", "root"])
    expected = b * 1500 / 1448 * 8 / 200e6 + 2 * 0.042
    assert t == pytest.approx(expected)
    # An unlimited tier adds no serialisation time.
    links["root"]["rate_mbit"] = 0
    t = metrics.ideal_round_seconds({"root": b, "site": b}, links, ["site", "root"])
    assert t == pytest.approx(b * 1500 / 1448 * 8 / 1000e6 + 2 * 0.042)


def raw_record(flat: bool = False) -> dict:
    """A record as federation.run returns it, two sites, two rounds."""
    site_rounds = [
        {"round": 0, "train_s": 0.5, "sync_s": 2.0, "bytes_sent": 1000, "bytes_resent": 0,
         "bytes_received": 1000, "sync_start_unix": 100.0},
        {"round": 1, "train_s": 0.5, "sync_s": 1.0, "bytes_sent": 1000, "bytes_resent": 100,
         "bytes_received": 1200, "sync_start_unix": 110.0},
    ]
    site = {"rounds": site_rounds, "utilisation": 0.25, "bytes_sent_total": 2000,
            "bytes_received_total": 2200, "wall_s": 4.0}
    parent = "root" if flat else "region-0"
    tier = "root" if flat else "site"
    nodes = [{"id": "root", "role": "root", "parent": None, "tier": None},
             {"id": "site-0", "role": "site", "parent": parent, "tier": tier},
             {"id": "site-1", "role": "site", "parent": parent, "tier": tier}]
    if not flat:
        nodes.insert(1, {"id": "region-0", "role": "region", "parent": "root", "tier": "root"})

    def counters(new):
        return {"bytes": new + 100, "packets": 10, "tcp_payload_bytes": new,
                "tcp_new_payload_bytes": new, "tcp_retransmitted_bytes": 0, "lost_packets": 0,
                "queue_drop_packets": 0}

    links = [{"a": n["id"], "b": n["parent"], "a_to_b": {"counters": counters(2050)},
              "b_to_a": {"counters": counters(2300)}} for n in nodes if n["parent"]]
    prof = profiles.named("cross-region").to_json()
    return {
        "spec": {"name": "fedwan", "regions": 0 if flat else 1, "sites_per_region": 2,
                 "sites": 2 if flat else 0, "codec": "fp16", "params": 500, "rounds": 2},
        "profile": prof, "nodes": nodes, "wall_s": 10.0,
        "usage": {n["id"]: {"exit": 0, "cpu_s": 1.0, "peak_rss_mb": 50.0 + k}
                  for k, n in enumerate(nodes)},
        "root_report": {"rounds": [{"round": 0, "seconds": 2.6, "wan_bytes": 5000,
                                    "fp32_bytes": 10000},
                                   {"round": 1, "seconds": 1.6, "wan_bytes": 5000,
                                    "fp32_bytes": 10000}],
                        "wan_bytes_total": 10000, "fp32_bytes_total": 20000},
        "site_reports": {"site-0": site, "site-1": site},
        "cpu_samples": [(100.5, 0.3, 0.1), (110.5, 0.95, 0.2), (111.5, 0.9, 0.3), (120, 0.1, 0)],
        "emulator": {"stats": {"links": links}, "cpu_s": 0.5, "method": "fedwan-linkemu"},
    }


def test_per_round_figures_come_from_the_sites_and_the_root():
    rows = metrics.per_round(raw_record())
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[1]["site_wait_s"] == 1.0 and rows[1]["site_train_s"] == 0.5
    assert rows[1]["site_bytes_per_direction"] == 1200  # the larger direction
    assert rows[1]["round_s"] == 1.6
    assert rows[1]["wait_over_ideal"] == pytest.approx(1.0 / rows[1]["ideal_s"])


def test_replicas_count_on_the_links_they_cross():
    raw = raw_record()
    site_rows = {s: dict(rep["rounds"][1]) for s, rep in raw["site_reports"].items()}
    before = metrics.tier_bytes(raw, site_rows)
    assert before == {"site": 1200, "root": 1200}
    # A site's replica goes up its own link, to its region, no further.
    site_rows["site-0"]["replica_bytes"] = 900
    assert metrics.tier_bytes(raw, site_rows) == {"site": 1900, "root": 1200}
    # The region's replica, as the root reported receiving it, goes up the
    # region's link; a site named there (a flat tree) is counted by the
    # site already.
    both = metrics.tier_bytes(raw, site_rows, {"region-0": 800, "site-0": 900})
    assert both == {"site": 1900, "root": 1800}
    # And the bound of the round follows.
    raw["root_report"]["rounds"][1]["replica_bytes"] = {"region-0": 800}
    raw["site_reports"] = {s: dict(rep, rounds=[dict(r) for r in rep["rounds"]])
                           for s, rep in raw["site_reports"].items()}
    raw["site_reports"]["site-0"]["rounds"][1]["replica_bytes"] = 900
    rows = metrics.per_round(raw)
    assert rows[1]["tier_bytes_per_direction"] == {"site": 1900, "root": 1800}
    assert rows[1]["ideal_s"] > metrics.per_round(raw_record())[1]["ideal_s"]


def test_the_summary_adds_up():
    s = metrics.summarise(raw_record())
    assert s["resent_bytes"] == 200  # 100 per site, round 1
    assert s["aggregator_peak_rss_mb"] == 51.0  # the region; sites left out
    assert s["site_peak_rss_mb"] == 53.0
    assert s["wan_over_fp32"] == 0.5
    assert s["links"]["site/up"]["links"] == 2
    assert s["links"]["root/up"]["tcp_new_payload_bytes"] == 2050
    assert s["root_tier_ip_bytes"] == 2150 + 2400
    checks = {c["site"]: c["ratio"] for c in s["byte_check"]}
    assert checks == {"site-0": pytest.approx(1.025), "site-1": pytest.approx(1.025)}
    # Only the sample inside the round-1 syncs counts (round 0 warms up).
    assert s["machine_busy_while_waiting"] == 0.95
    assert s["emulator_busy_while_waiting"] == 0.2
    assert s["cpu_bound"] is True


def test_the_report_compares_against_the_baseline():
    ours = metrics.summarise(raw_record())
    flat = metrics.summarise(raw_record(flat=True))
    flat["name"] = "flat-fp32"
    flat["root_tier_ip_bytes"] *= 4
    doc = {"runs": [ours, flat], "machine": {"cores": 2, "kernel": "k", "tcp_cc": "bbr"},
           "comparisons": report.comparisons([ours, flat])}
    assert doc["comparisons"]["fedwan vs flat-fp32"]["root_tier_bytes_ratio"] == \
        pytest.approx(ours["root_tier_ip_bytes"] / flat["root_tier_ip_bytes"])
    text = report.markdown(doc)
    assert "| fedwan |" in text and "| flat-fp32 |" in text
    assert "CPU-bound" in text
    assert "fedwan-linkemu" in text


def test_plots_are_written_when_matplotlib_is_there(tmp_path):
    pytest.importorskip("matplotlib")
    from fedwan_bench import plots
    a, b = metrics.summarise(raw_record()), metrics.summarise(raw_record())
    a["sweep_value"], b["sweep_value"] = 50.0, 200.0
    doc = {"runs": [a, b], "sweep": {"key": "rate_mbit", "values": [50.0, 200.0]}}
    paths = plots.write(doc, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["rounds.png", "round_time_vs_rate_mbit.png"]
    assert all(os.path.getsize(p) > 1000 for p in paths)
