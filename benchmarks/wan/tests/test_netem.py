"""The netem back end without netem: the exact ip and tc command lines for
a small tree, the detection of netem and the choice of shaper with a fake
command runner, its counters in the emulator's shape, and a netem run's
figures and reports (no namespaces, no processes)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fedwan_bench import __main__ as cli  # noqa: E402
from fedwan_bench import federation, metrics, netem, profiles, report  # noqa: E402
from fedwan_bench.profiles import Link  # noqa: E402
from test_harness import raw_record  # noqa: E402


class FakeRunner:
    """Records every command; answers from `answers` (a substring of the
    command line -> (exit status, stdout, stderr)), else succeeds."""

    def __init__(self, answers: dict | None = None):
        self.answers = answers or {}
        self.calls: list[list[str]] = []

    def __call__(self, argv: list) -> subprocess.CompletedProcess:
        self.calls.append(list(argv))
        line = " ".join(argv)
        for pattern, (rc, out, err) in self.answers.items():
            if pattern in line:
                return subprocess.CompletedProcess(argv, rc, out, err)
        return subprocess.CompletedProcess(argv, 0, "", "")


NO_NETEM = {"root netem": (2, "", "Error: Specified qdisc kind is unknown.\n")}


def test_the_commands_for_one_region_of_two_sites():
    spec = federation.BenchFederation(name="t", regions=1, sites_per_region=2)
    nodes = federation.plan_nodes(spec)
    ns = {"root": "ns0", "region-0": "ns1", "site-0": "ns2", "site-1": "ns3"}
    lines = [" ".join(c) for c in netem.edge_commands(nodes, ns,
                                                      profiles.named("intercontinental"))]
    wan = "limit 2000 delay 40ms loss 0.1% rate 200mbit"
    regional = "limit 500 delay 2ms rate 1000mbit"
    edge = lambda child, c, p, ca, pa, args: [  # noqa: E731
        f"ip -n {p} link add wan-{child} type veth peer name wan-up netns {c}",
        f"ip -n {c} addr add {ca} peer {pa}/32 dev wan-up",
        f"ip -n {c} link set dev wan-up gso_max_segs 1",
        f"ip -n {c} link set dev wan-up up",
        f"ip -n {p} addr add {pa} peer {ca}/32 dev wan-{child}",
        f"ip -n {p} link set dev wan-{child} gso_max_segs 1",
        f"ip -n {p} link set dev wan-{child} up",
        f"tc -n {c} qdisc add dev wan-up root netem {args}",
        f"tc -n {p} qdisc add dev wan-{child} root netem {args}",
    ]
    assert lines == (edge("region-0", "ns1", "ns0", "10.77.1.1", "10.77.0.1", wan)
                     + edge("site-0", "ns2", "ns1", "10.77.2.1", "10.77.1.1", regional)
                     + edge("site-1", "ns3", "ns1", "10.77.2.2", "10.77.1.1", regional))


def test_a_flat_tree_puts_every_site_on_the_root_tier():
    nodes = federation.plan_nodes(federation.BenchFederation(name="f", regions=0, sites=2))
    ns = {n.id: f"ns-{n.id}" for n in nodes}
    cmds = netem.edge_commands(nodes, ns, profiles.named("degraded"), ip="/sbin/ip",
                               tc="/sbin/tc")
    qdiscs = [c for c in cmds if c[0] == "/sbin/tc"]
    assert len(qdiscs) == 4 and len(cmds) == 18
    assert qdiscs[0] == ["/sbin/tc", "-n", "ns-site-0", "qdisc", "add", "dev", "wan-up", "root",
                         "netem", "limit", "1042", "delay", "75ms", "25ms", "loss", "1%",
                         "rate", "50mbit"]
    assert qdiscs[1][6] == "wan-site-0" and qdiscs[3][6] == "wan-site-1"


def test_netem_options_and_queue_limits():
    assert netem.netem_args(Link(100, 20, jitter_ms=5, loss_percent=0.5, duplicate_percent=1,
                                 reorder_percent=2)) == \
        ["limit", "542", "delay", "20ms", "5ms", "loss", "0.5%", "duplicate", "1%",
         "reorder", "2%", "rate", "100mbit"]
    # In flight over 20 + 5 ms at 100 Mbit/s: 208.3 packets; the queue one
    # 40 ms round trip's product: 333.3.
    assert netem.queue_limit(Link(100, 20, jitter_ms=5)) == 542
    assert netem.queue_limit(Link(10, 1)) == 64 + 1  # the queue's floor of 64 packets
    assert netem.netem_args(Link(0, 0.1)) == ["limit", "1000", "delay", "0.1ms"]


def test_long_node_names_get_short_devices():
    assert netem.device("site-12") == "wan-site-12"
    long = netem.device("a-very-long-node-name")
    assert len(long) <= 15 and long == netem.device("a-very-long-node-name")


def test_detection_adds_a_netem_qdisc_on_a_throw_away_veth_and_cleans_up():
    ok = FakeRunner()
    assert netem.probe(ok, tag="1") is None
    assert [" ".join(c) for c in ok.calls] == [
        "ip netns add fwb-netem-probe1",
        "ip -n fwb-netem-probe1 link add probe0 type veth peer name probe1",
        "tc -n fwb-netem-probe1 qdisc add dev probe0 root netem delay 1ms",
        "ip netns del fwb-netem-probe1"]
    missing = FakeRunner(NO_NETEM)
    why = netem.probe(missing, tag="1")
    assert why == "this kernel has no netem qdisc (tc: Error: Specified qdisc kind is unknown.)"
    assert missing.calls[-1][1:] == ["netns", "del", "fwb-netem-probe1"]
    assert netem.probe(FakeRunner({"qdisc": (127, "", "")})) == "no tc (iproute2)"
    no_ns = FakeRunner({"netns add": (1, "", "Operation not permitted")})
    assert "cannot create a network namespace" in netem.probe(no_ns)
    assert len(no_ns.calls) == 1  # nothing to clean
    no_veth = FakeRunner({"type veth": (2, "", "Unknown device type.")})
    assert "cannot create a veth pair" in netem.probe(no_veth)
    assert " ".join(no_veth.calls[-1]).endswith("netns del fwb-netem-probe" + str(os.getpid()))


def test_the_choice_of_shaper():
    assert netem.choose("auto", FakeRunner()) == ("netem", None)
    kind, why = netem.choose("auto", FakeRunner(NO_NETEM))
    assert kind == "linkemu" and "no netem qdisc" in why
    assert netem.choose("netem", FakeRunner()) == ("netem", None)
    kind, why = netem.choose("netem", FakeRunner(NO_NETEM))
    assert kind == "netem" and "no netem qdisc" in why
    untouched = FakeRunner()
    assert netem.choose("linkemu", untouched) == ("linkemu", None) and untouched.calls == []
    with pytest.raises(ValueError):
        netem.choose("tbf", FakeRunner())


def test_asking_for_netem_where_the_kernel_lacks_it_fails_with_a_clear_message(capsys):
    assert netem.pick("netem", runner=FakeRunner(NO_NETEM)) is None
    err = capsys.readouterr().err
    assert "fedwan bench: cannot run here: --shaper netem: this kernel has no netem qdisc" in err
    assert "use --shaper linkemu" in err
    assert netem.pick("auto", runner=FakeRunner(NO_NETEM)) == "linkemu"
    assert "shaping with linkemu (this kernel has no netem qdisc" in capsys.readouterr().out
    assert netem.pick("auto", runner=FakeRunner()) == "netem"


def test_run_stops_before_anything_starts_when_netem_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(cli.netns, "unavailable_reason", lambda tun=True: None)
    monkeypatch.setattr(netem, "probe", lambda *a, **k: "this kernel has no netem qdisc (tc: x)")
    monkeypatch.setattr(federation, "run", lambda *a, **k: pytest.fail("a run started"))
    out = tmp_path / "out"
    assert cli.main(["run", "--quick", "--shaper", "netem", "--out", str(out)]) == cli.SKIP
    assert not out.exists()


def test_the_flag_is_on_run_and_streams():
    for argv in (["run", "--help"], ["streams", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
    p = argparse.ArgumentParser()
    cli.add_run_flags(p)
    assert p.parse_args([]).shaper == "auto"
    assert p.parse_args(["--shaper", "linkemu"]).shaper == "linkemu"
    with pytest.raises(SystemExit):
        p.parse_args(["--shaper", "tbf"])


LINK_JSON = json.dumps([{"ifname": "wan-up", "stats64": {
    "rx": {"bytes": 4670, "packets": 71},
    "tx": {"bytes": 5006100, "packets": 3400, "dropped": 0}}}])
QDISC_JSON = json.dumps([{"kind": "netem", "handle": "8001:", "root": True,
                          "options": {"limit": 2000}, "bytes": 5006100, "packets": 3400,
                          "drops": 7, "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0}])


def test_counters_come_from_ip_and_tc():
    c = netem.direction_counters(json.loads(LINK_JSON), json.loads(QDISC_JSON))
    assert c["packets"] == 3400 and c["bytes"] == 5006100 - 14 * 3400
    assert c["dropped_packets"] == 7
    assert c["tcp_new_payload_bytes"] is None and c["lost_packets"] is None
    empty = netem.direction_counters(None, None)
    assert empty["packets"] is None and empty["bytes"] is None and empty["dropped_packets"] is None


def test_the_links_are_built_and_read_back(tmp_path):
    runner = FakeRunner({"-s -j link show": (0, LINK_JSON, ""),
                         "-s -j qdisc show": (0, QDISC_JSON, "")})
    nodes = federation.plan_nodes(federation.BenchFederation(name="f", regions=0, sites=2))
    ns = {n.id: f"ns-{n.id}" for n in nodes}
    links = netem.NetemLinks(nodes, ns, profiles.named("lan"), str(tmp_path), runner=runner)
    assert len(runner.calls) == 18 and links.proc is None and links.cpu_seconds() == 0.0
    script = (tmp_path / "netem.sh").read_text().splitlines()
    assert len(script) == 18 and script[-1].endswith("root netem limit 250 delay 0.1ms rate "
                                                     "10000mbit")
    stats = links.stop()
    assert [(l["a"], l["b"]) for l in stats["links"]] == [("site-0", "root"), ("site-1", "root")]
    assert stats["links"][1]["b_to_a"]["counters"]["dropped_packets"] == 7
    read = [" ".join(c) for c in runner.calls[18:]]
    assert read[2].endswith("-n ns-root -s -j link show dev wan-site-0")
    failing = FakeRunner({"root netem": (2, "", "Error: Specified qdisc kind is unknown.")})
    with pytest.raises(RuntimeError, match="netem: .*qdisc add.*kind is unknown"):
        netem.NetemLinks(nodes, ns, profiles.named("lan"), str(tmp_path), runner=failing)


def netem_record() -> dict:
    """raw_record() as a netem run records it: the links' packet counts, no
    TCP payload from them, the kernel's counters at both ends."""
    raw = raw_record()
    for link in raw["emulator"]["stats"]["links"]:
        for key in ("a_to_b", "b_to_a"):
            c = link[key]["counters"]
            link[key]["counters"] = netem.direction_counters(
                [{"stats64": {"tx": {"bytes": c["bytes"] + 14 * c["packets"],
                                     "packets": c["packets"]}}}],
                [{"kind": "netem", "drops": 1}])
    raw["emulator"].update(method=netem.METHOD, kind="netem", cpu_s=0.0)
    conns = []
    for child, parent in (("region-0", "root"), ("site-0", "region-0"), ("site-1", "region-0")):
        conns.append({"node": child, "peer_node": parent, "bytes_sent": 2100,
                      "bytes_retrans": 50, "bytes_acked": 2052, "bytes_received": 2301,
                      "final": True})
        conns.append({"node": parent, "peer_node": child, "bytes_sent": 2300,
                      "bytes_retrans": 0, "bytes_acked": 2302, "bytes_received": 2051,
                      "final": True})
    raw["kernel"] = {"method": "ss", "period_s": 1.0, "samples": 3, "events": 6,
                     "ss_cpu_s": 0.01, "connections": conns}
    return raw


def test_a_netem_run_takes_its_payload_from_the_kernel_and_says_so():
    s = metrics.summarise(netem_record())
    assert s["shaper"] == "netem" and s["shaping"] == netem.METHOD
    up = s["links"]["site/up"]
    assert up["links"] == 2 and up["ip_bytes"] == 2 * 2150 and up["dropped_packets"] == 2
    assert up["tcp_payload_bytes"] == 2 * 2100 and up["tcp_new_payload_bytes"] == 2 * 2050
    assert up["tcp_retransmitted_bytes"] == 100 and up["lost_packets"] is None
    assert s["links"]["root/down"]["tcp_new_payload_bytes"] == 2300
    checks = {c["site"]: c for c in s["byte_check"]}
    assert checks["site-0"]["source"] == "kernel (ss)"
    assert checks["site-0"]["ratio"] == pytest.approx(2050 / 2000)
    kernel = {c["site"]: c for c in s["kernel_check"]}
    assert kernel["site-0"]["ratio"] == pytest.approx(2050 / 2000)
    assert "kernel_over_emulator" not in kernel["site-0"]  # no emulator to hold it against
    assert s["emulator_busy_while_waiting"] is None
    assert s["goodput"]["site/up"]["mbit_per_link_while_waiting"] is not None
    text = report.markdown({"runs": [s], "machine": {"cores": 2, "kernel": "k",
                                                     "tcp_cc": "bbr"}})
    assert f"Shaping: {netem.METHOD}." in text
    assert "TCP payload (kernel (ss)) / fedwan count = 1.0250" in text
    # A linkemu run says the emulator.
    s = metrics.summarise(raw_record())
    assert s["shaper"] == "linkemu" and s["byte_check"][0]["source"] == "emulator"
    assert "TCP payload (emulator) / fedwan count" in report.markdown(
        {"runs": [s], "machine": {"cores": 2, "kernel": "k", "tcp_cc": "bbr"}})


def test_a_netem_run_without_kernel_counters_has_no_payload_figures():
    raw = netem_record()
    raw["kernel"] = None
    s = metrics.summarise(raw)
    assert s["links"]["site/up"]["tcp_new_payload_bytes"] is None
    assert s["links"]["site/up"]["ip_bytes"] == 2 * 2150
    assert all(c["ratio"] is None for c in s["byte_check"])
    assert s["goodput"]["site/up"]["mbit_per_link_while_waiting"] is None
