"""Baselines on the links of the tree they are measured against: a flat
tree whose sites sit behind their regions (relays: a namespace, links, no
process). The emulator's configuration (hosts, links, paths), the netem
commands that route through a relay, the kernel counters' watches, the
per-tier accounting, the byte check and the ideal bound over the shared
region links, and the reports; and that a run without regions is as before
(no namespaces, no processes)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fedwan_bench import __main__ as cli  # noqa: E402
from fedwan_bench import federation, kernel_counters, metrics, netem, profiles, report  # noqa: E402
from test_harness import raw_record  # noqa: E402
from test_netem import FakeRunner, LINK_JSON, QDISC_JSON  # noqa: E402

MACHINE = {"cores": 2, "kernel": "k", "tcp_cc": "bbr"}


class Ns:
    def __init__(self, name: str):
        self.name = name


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.add_run_flags(p)
    return p.parse_args(list(argv))


def tree_and_baseline(regions: int = 2, sites_per_region: int = 2):
    """The fedwan spec of an invocation and its flat-fp32 baseline."""
    specs = cli.specs_from(parse("--regions", str(regions), "--sites-per-region",
                                 str(sites_per_region)))
    return specs[0], specs[1]


def config_of(spec: federation.BenchFederation, profile: str = "intercontinental") -> dict:
    nodes = federation.plan_nodes(spec)
    return federation.emulator_config(nodes, {n.id: Ns("ns-" + n.id) for n in nodes},
                                      profiles.named(profile), 7)


def test_baselines_sit_behind_the_regions_of_the_fedwan_run(monkeypatch):
    ours, flat = tree_and_baseline()
    assert (flat.name, flat.regions, flat.sites, flat.via_regions) == ("flat-fp32", 0, 4, 2)
    assert flat.site_count() == 4 and flat.tree() == "flat via 2 regions"
    assert ours.tree() == "2x2"
    # Flower too (a Python with flwr faked).
    monkeypatch.setattr(cli.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    specs = cli.specs_from(parse("--baselines", "flat-fp32,flower", "--regions", "3"))
    assert [(s.name, s.via_regions, s.site_count()) for s in specs] == [
        ("fedwan", 0, 6), ("flat-fp32", 3, 6), ("flower", 3, 6)]
    # Sites straight under the root: the baselines as before.
    ours, flat = cli.specs_from(parse("--regions", "0", "--sites-per-region", "3"))
    assert (flat.via_regions, flat.site_count(), flat.tree()) == (0, 3, "flat")
    with pytest.raises(ValueError, match="via_regions"):
        federation.BenchFederation(name="x", regions=2, via_regions=2)
    with pytest.raises(ValueError, match="via_regions"):
        federation.BenchFederation(name="x", regions=0, sites=5, sites_per_region=2,
                                  via_regions=2)


def test_a_baselines_regions_are_relays_and_its_sites_connect_to_the_root():
    _, flat = tree_and_baseline()
    nodes = federation.plan_nodes(flat)
    assert [(n.id, n.role, n.parent, n.via, n.hop, n.tier, n.runs) for n in nodes] == [
        ("root", "root", None, None, None, None, True),
        ("region-0", "relay", "root", None, "root", "root", False),
        ("site-0", "site", "root", "region-0", "region-0", "site", True),
        ("site-1", "site", "root", "region-0", "region-0", "site", True),
        ("region-1", "relay", "root", None, "root", "root", False),
        ("site-2", "site", "root", "region-1", "region-1", "site", True),
        ("site-3", "site", "root", "region-1", "region-1", "site", True)]
    yaml = federation.topology_yaml(flat, nodes)
    assert "region" not in yaml  # no process in a relay
    assert yaml.count("role: site, parent: root") == 4


def test_the_emulator_config_of_a_baseline_has_the_trees_links_and_a_path_per_site():
    ours, flat = tree_and_baseline()
    tree, base = config_of(ours), config_of(flat)
    assert "paths" not in tree
    # The same hosts (the regions too), names and addresses; the same links.
    strip = lambda hosts: [(h["name"], h["address"]) for h in hosts]  # noqa: E731
    assert strip(base["hosts"]) == strip(tree["hosts"])
    assert [h["name"] for h in base["hosts"]] == ["root", "region-0", "site-0", "site-1",
                                                  "region-1", "site-2", "site-3"]
    assert base["links"] == tree["links"]
    by_child = {l["a"]: l for l in base["links"]}
    assert by_child["region-1"]["b"] == "root"
    assert by_child["region-1"]["profile"]["rate_mbit"] == 200  # the root tier
    assert by_child["site-3"]["b"] == "region-1"
    assert by_child["site-3"]["profile"]["rate_mbit"] == 1000  # the site tier
    assert base["paths"] == [
        {"from": "site-0", "to": "root", "via": ["region-0"]},
        {"from": "site-1", "to": "root", "via": ["region-0"]},
        {"from": "site-2", "to": "root", "via": ["region-1"]},
        {"from": "site-3", "to": "root", "via": ["region-1"]}]
    # Every hop a link; no direct link; each pair once, one direction.
    pairs = {frozenset((l["a"], l["b"])) for l in base["links"]}
    for p in base["paths"]:
        hops = [p["from"], *p["via"], p["to"]]
        assert all(frozenset(h) in pairs for h in zip(hops, hops[1:]))
        assert frozenset((p["from"], p["to"])) not in pairs
    ends = [frozenset((p["from"], p["to"])) for p in base["paths"]]
    assert len(ends) == len(set(ends))
    assert list(base) == ["hosts", "links", "paths", "seed"] and base["seed"] == 7


def test_without_regions_the_baselines_config_is_as_before():
    _, flat = tree_and_baseline(regions=0, sites_per_region=2)
    link = profiles.named("intercontinental").root_link.emulator_profile()
    assert config_of(flat) == {
        "hosts": [{"name": "root", "netns": "ns-root", "address": "10.77.0.1"},
                  {"name": "site-0", "netns": "ns-site-0", "address": "10.77.2.1"},
                  {"name": "site-1", "netns": "ns-site-1", "address": "10.77.2.2"}],
        "links": [{"a": "site-0", "b": "root", "profile": link},
                  {"a": "site-1", "b": "root", "profile": link}],
        "seed": 7}


def test_netem_routes_a_baselines_sites_through_their_region():
    ours, flat = tree_and_baseline(regions=1)
    ns = {"root": "ns0", "region-0": "ns1", "site-0": "ns2", "site-1": "ns3"}
    prof = profiles.named("intercontinental")
    tree = netem.edge_commands(federation.plan_nodes(ours), ns, prof)
    base = netem.edge_commands(federation.plan_nodes(flat), ns, prof)
    # The same veth pairs, addresses and qdiscs as the tree's, then the relay.
    assert base[:len(tree)] == tree
    assert [" ".join(c) for c in base[len(tree):]] == [
        "ip netns exec ns1 sysctl -q -w net.ipv4.ip_forward=1",
        "ip -n ns2 route add 10.77.0.1/32 via 10.77.1.1 dev wan-up",
        "ip -n ns0 route add 10.77.2.1/32 via 10.77.1.1 dev wan-region-0",
        "ip -n ns3 route add 10.77.0.1/32 via 10.77.1.1 dev wan-up",
        "ip -n ns0 route add 10.77.2.2/32 via 10.77.1.1 dev wan-region-0"]
    assert netem.relay_commands(federation.plan_nodes(ours), ns) == []
    # Without regions: no relay, no route.
    _, plain = tree_and_baseline(regions=0)
    nodes = federation.plan_nodes(plain)
    assert netem.relay_commands(nodes, {n.id: n.id for n in nodes}) == []


def test_netem_reads_a_baselines_links_at_both_ends(tmp_path):
    _, flat = tree_and_baseline(regions=1)
    nodes = federation.plan_nodes(flat)
    ns = {n.id: f"ns-{n.id}" for n in nodes}
    runner = FakeRunner({"-s -j link show": (0, LINK_JSON, ""),
                         "-s -j qdisc show": (0, QDISC_JSON, "")})
    links = netem.NetemLinks(nodes, ns, profiles.named("lan"), str(tmp_path), runner=runner)
    built = len(runner.calls)
    assert built == 3 * 9 + 5
    assert (tmp_path / "netem.sh").read_text().splitlines()[-1] == \
        f"{links.ip} -n ns-root route add 10.77.2.2/32 via 10.77.1.1 dev wan-region-0"
    stats = links.stop()
    assert [(l["a"], l["b"]) for l in stats["links"]] == [
        ("region-0", "root"), ("site-0", "region-0"), ("site-1", "region-0")]
    read = [" ".join(c) for c in runner.calls[built:]]
    assert read[4].endswith("-n ns-site-0 -s -j link show dev wan-up")
    assert read[6].endswith("-n ns-region-0 -s -j link show dev wan-site-0")


def test_the_kernel_watches_leave_relays_out():
    _, flat = tree_and_baseline(regions=1)
    nodes = federation.plan_nodes(flat)
    ns = {n.id: f"ns-{n.id}" for n in nodes}
    up = {w.node: w.peers for w in kernel_counters.watches_for(nodes, ns)}
    assert up == {"site-0": {"10.77.0.1": "root"}, "site-1": {"10.77.0.1": "root"}}
    both = {w.node: w.peers for w in kernel_counters.watches_for(nodes, ns, both_ends=True)}
    assert both["root"] == {"10.77.2.1": "site-0", "10.77.2.2": "site-1"}
    assert "region-0" not in both


def baseline_record(regions: int = 1) -> dict:
    """raw_record() as a flat-fp32 run behind `regions` regions of two sites
    records it: each site link carries its own 2050 B up, 2300 B down; each
    region's link both its sites' (the emulator counts every packet it
    carries, relayed or not)."""
    raw = raw_record()
    spec = federation.BenchFederation(name="flat-fp32", regions=0, sites=2 * regions,
                                     via_regions=regions, codec="fp32", params=500, rounds=2)
    nodes = federation.plan_nodes(spec)
    raw["spec"], raw["nodes"] = asdict(spec), [asdict(n) for n in nodes]

    def counters(new: int) -> dict:
        return {"bytes": new + 100, "packets": 10, "tcp_payload_bytes": new,
                "tcp_new_payload_bytes": new, "tcp_retransmitted_bytes": 0,
                "lost_packets": 0, "queue_drop_packets": 0}

    behind = {n.id: sum(1 for m in nodes if m.via == n.id) for n in nodes}
    raw["emulator"]["stats"]["links"] = [
        {"a": n.id, "b": n.hop, "a_to_b": {"counters": counters(2050 * (behind[n.id] or 1))},
         "b_to_a": {"counters": counters(2300 * (behind[n.id] or 1))}}
        for n in nodes if n.parent]
    site = raw["site_reports"]["site-0"]
    raw["site_reports"] = {f"site-{s}": site for s in range(2 * regions)}
    raw["usage"] = {n.id: {"exit": 0, "cpu_s": 1.0, "peak_rss_mb": 50.0 + k}
                    for k, n in enumerate(nodes) if n.runs}
    return raw


def test_a_baselines_root_tier_is_its_regions_shared_links():
    s = metrics.summarise(baseline_record(regions=2))
    root_up, site_up = s["links"]["root/up"], s["links"]["site/up"]
    assert root_up["links"] == 2 and site_up["links"] == 4
    assert root_up["tcp_new_payload_bytes"] == 2 * 4100  # both sites of each region
    assert site_up["tcp_new_payload_bytes"] == 4 * 2050
    assert s["root_tier_ip_bytes"] == 2 * (4200 + 4700)
    # Goodput per link: a region's link carried two sites' payload.
    per_link = s["goodput"]["root/up"]["mbit_per_link_while_waiting"]
    assert per_link == pytest.approx(4100 * 8 / 3.0 / 1e6)  # 2 + 1 s of waiting
    assert s["goodput"]["site/up"]["mbit_per_link_while_waiting"] == \
        pytest.approx(2050 * 8 / 3.0 / 1e6)
    # Each site is checked on its own link, which no other site's packets
    # cross, not on its region's.
    assert {c["site"]: c["ratio"] for c in s["byte_check"]} == \
        {f"site-{k}": pytest.approx(2050 / 2000) for k in range(4)}
    assert s["aggregator_peak_rss_mb"] == 50.0  # the root: relays run nothing
    assert s["tree"] == "flat via 2 regions"


def test_the_ideal_bound_follows_the_link_each_byte_crosses():
    rows = {"site-0": (100, 300), "site-1": (200, 100), "site-2": (50, 50), "site-3": (400, 10)}
    rows = {k: {"bytes_sent": up, "bytes_received": down} for k, (up, down) in rows.items()}

    def nodes_of(spec):
        return {"nodes": [asdict(n) for n in federation.plan_nodes(spec)]}

    _, flat = tree_and_baseline()
    ours = federation.BenchFederation(name="fedwan")
    plain = federation.BenchFederation(name="f", regions=0, sites=4)
    # A relay's link carries the sum of its sites' bytes: region-0 300 up
    # and 400 down, region-1 450 up; a site's link its own.
    assert metrics.tier_bytes(nodes_of(flat), rows) == {"site": 400, "root": 450}
    # A region's aggregator forwards one aggregate of a site's size.
    assert metrics.tier_bytes(nodes_of(ours), rows) == {"site": 400, "root": 400}
    assert metrics.tier_bytes(nodes_of(plain), rows) == {"root": 400}
    assert metrics._path_tiers(nodes_of(flat)) == ["site", "root"]
    assert metrics._path_tiers(nodes_of(plain)) == ["root"]


def test_a_baselines_ideal_bound_has_its_regions_link_as_the_bottleneck():
    raw = baseline_record(regions=1)
    raw["profile"] = profiles.named("intercontinental").to_json()
    rows = metrics.per_round(raw)
    # Round 1: each site 1000 B up, 1200 B down; both over the region's link.
    assert rows[1]["tier_bytes_per_direction"] == {"site": 1200, "root": 2400}
    expected = 2400 * 1500 / 1448 * 8 / 200e6 + 2 * (0.040 + 0.002)
    assert rows[1]["ideal_s"] == pytest.approx(expected)
    # The same record as a plain flat run (each site its own root-tier link).
    plain = raw_record(flat=True)
    plain["profile"] = raw["profile"]
    row = metrics.per_round(plain)[1]
    assert row["tier_bytes_per_direction"] == {"root": 1200}
    assert row["ideal_s"] == pytest.approx(1200 * 1500 / 1448 * 8 / 200e6 + 2 * 0.040)


def test_a_netem_baseline_counts_each_links_payload_from_the_connections_over_it():
    raw = baseline_record(regions=1)
    for link in raw["emulator"]["stats"]["links"]:
        for key in ("a_to_b", "b_to_a"):
            c = link[key]["counters"]
            link[key]["counters"] = netem.direction_counters(
                [{"stats64": {"tx": {"bytes": c["bytes"] + 14 * c["packets"],
                                     "packets": c["packets"]}}}], [{"kind": "netem", "drops": 0}])
    raw["emulator"].update(method=netem.METHOD, kind="netem", cpu_s=0.0)
    conns = []
    for k, site in enumerate(("site-0", "site-1")):
        conns.append({"node": site, "peer_node": "root", "bytes_sent": 2100 + k,
                      "bytes_retrans": 50, "bytes_acked": 2052, "bytes_received": 2301,
                      "final": True})
        conns.append({"node": "root", "peer_node": site, "bytes_sent": 2300,
                      "bytes_retrans": 0, "bytes_acked": 2302, "bytes_received": 2051,
                      "final": True})
    raw["kernel"] = {"method": "ss", "connections": conns}
    assert metrics.link_flows(raw, "region-0") == [("site-0", "root"), ("site-1", "root")]
    assert metrics.link_flows(raw, "site-1") == [("site-1", "root")]
    s = metrics.summarise(raw)
    assert s["links"]["root/up"]["tcp_new_payload_bytes"] == 2050 + 2051
    assert s["links"]["root/down"]["tcp_new_payload_bytes"] == 2 * 2300
    assert s["links"]["site/up"]["tcp_new_payload_bytes"] == 2050 + 2051
    checks = {c["site"]: c for c in s["byte_check"]}
    assert checks["site-1"]["tcp_payload_bytes"] == 2051 and \
        checks["site-1"]["source"] == "kernel (ss)"
    # One site's connections unseen: its region's link has no payload figure.
    raw["kernel"]["connections"] = conns[:2]
    s = metrics.summarise(raw)
    assert s["links"]["root/up"]["tcp_new_payload_bytes"] is None
    assert {c["site"]: c["tcp_payload_bytes"] for c in s["byte_check"]} == \
        {"site-0": 2050, "site-1": None}


def test_the_report_says_the_baseline_ran_over_the_regions_links():
    ours = metrics.summarise(raw_record())
    base = metrics.summarise(baseline_record(regions=1))
    doc = {"runs": [ours, base], "machine": MACHINE,
           "comparisons": report.comparisons([ours, base])}
    text = report.markdown(doc)
    assert "| fedwan | blocking | 2 (1x2) |" in text
    assert "| flat-fp32 | blocking | 2 (flat via 1 region) |" in text
    assert "flat-fp32: flat, over the regions' links: each site's connection to the root " \
           "crosses its site-tier link to its region" in text
    assert "fedwan vs flat-fp32" in doc["comparisons"]
    # Without regions: "flat", and no such note.
    plain = metrics.summarise(raw_record(flat=True))
    assert plain["tree"] == "flat"
    text = report.markdown({"runs": [plain], "machine": MACHINE})
    assert "(flat) |" in text and "over the regions' links" not in text
