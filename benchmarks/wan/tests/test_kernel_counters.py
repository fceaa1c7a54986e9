"""The kernel counter cross-check: parsing `ss -tin` output (captured from
iproute2 6.1 between two namespaces, in data/), the sampler's bookkeeping
with a fake `ss`, and the per-site check in the summary and the report (no
namespaces, no processes)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fedwan_bench import federation, kernel_counters, metrics, report  # noqa: E402
from fedwan_bench.kernel_counters import Sampler, Watch, parse_ss  # noqa: E402
from test_harness import raw_record  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def data(name: str) -> str:
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def test_a_sender_on_a_lossy_link():
    # Two connections through the emulator at 1% loss, one bbr, one cubic.
    bbr, cubic = parse_ss(data("ss_sender_lossy.txt"))
    assert bbr == {"state": "ESTAB", "local": "10.79.0.1", "local_port": "56360",
                   "peer": "10.79.0.2", "peer_port": "7000", "cc": "bbr",
                   "bytes_sent": 6267880, "bytes_retrans": 267880, "bytes_acked": 6000001,
                   "bytes_received": 0, "rtt_ms": 23.51}
    assert cubic["cc"] == "cubic" and cubic["bytes_sent"] == 1517504
    assert cubic["bytes_retrans"] == 21720 and cubic["bytes_acked"] == 1471169


def test_the_receiving_end_counts_what_it_received():
    socks = parse_ss(data("ss_receiver_lossy.txt"))
    assert [(s["local_port"], s["peer_port"]) for s in socks] == [("7000", "56360"),
                                                                  ("7000", "56372")]
    assert [s["bytes_received"] for s in socks] == [6000000, 1484200]
    assert all(s["bytes_sent"] == 0 and s["bytes_acked"] == 0 for s in socks)


def test_closing_sockets_header_lines_and_listeners():
    closing = parse_ss(data("ss_closing.txt"))
    assert [s["state"] for s in closing] == ["FIN-WAIT-1", "FIN-WAIT-1"]
    assert closing[0]["bytes_acked"] == 6000001
    # The same with ss's header line (no -H).
    with_header = parse_ss(data("ss_with_header.txt"))
    assert [s["state"] for s in with_header] == ["FIN-WAIT-1", "FIN-WAIT-1"]
    assert with_header[1]["bytes_sent"] == 2697624
    listen, close_wait, estab = parse_ss(data("ss_listen.txt"))
    assert (listen["state"], listen["peer"], listen["peer_port"]) == ("LISTEN", "0.0.0.0", "*")
    assert close_wait["bytes_received"] == 6000001  # the payload and the FIN
    assert estab["state"] == "ESTAB"


def test_a_destroyed_socket_as_the_event_stream_prints_it():
    # ss -E: the state reads UNCONN, no congestion control name, the SYN and
    # the FIN both in bytes_acked.
    (s,) = parse_ss(data("ss_destroyed.txt"))
    assert s["state"] == "UNCONN" and s["cc"] is None
    assert (s["bytes_sent"], s["bytes_acked"], s["bytes_received"]) == (3000000, 3000002, 1)
    assert s["rtt_ms"] == 0.052
    (veth,) = parse_ss(data("ss_veth.txt"))
    assert veth["cc"] == "cubic" and veth["bytes_sent"] == 5000000


def test_other_layouts_ss_may_print():
    text = ("tcp   ESTAB 0 0 [::ffff:10.77.2.1]:40000 [::ffff:10.77.1.1]:7000 "
            "ts sack bbr wscale:7,7 bytes_sent:10 bytes_acked:11 bytes_received:5\n"
            "ESTAB 0 0 [fe80::1%wan-up]:22 [fe80::2%wan-up]:50000\n"
            "\t ts sack cubic wscale:7,7 rto:204 bytes_retrans:3 bytes_sent:9\n"
            "\n")
    a, b = parse_ss(text)
    assert (a["local"], a["peer"], a["peer_port"], a["cc"]) == ("10.77.2.1", "10.77.1.1", "7000",
                                                                "bbr")
    assert (a["bytes_sent"], a["bytes_acked"], a["bytes_received"]) == (10, 11, 5)
    assert (b["local"], b["peer"], b["cc"], b["bytes_retrans"]) == \
        ("fe80::1", "fe80::2", "cubic", 3)
    # Fields inside a bracket (bbr:(bw:...)) or other names are not taken.
    (c,) = parse_ss("ESTAB 0 0 1.1.1.1:1 2.2.2.2:2\n\t bbr bbr:(bytes_sent:7) "
                    "notsent:99 bytes_sent:8\n")
    assert c["bytes_sent"] == 8 and c["rtt_ms"] is None
    assert parse_ss("") == [] and parse_ss("garbage\n\t bytes_sent:1\n") == []


def test_the_event_stream_is_cut_into_one_text_per_socket():
    lines = (data("ss_destroyed.txt") + "\n" + "UNCONN 0 0 1.1.1.1:5 2.2.2.2:6\n"
             + data("ss_destroyed.txt")).splitlines(keepends=True)
    texts = list(kernel_counters.records(iter(lines)))
    assert len(texts) == 3
    assert [len(parse_ss(t)) for t in texts] == [1, 1, 1]
    assert parse_ss(texts[1])[0]["local_port"] == "5"  # no tcp_info line of its own
    assert parse_ss(texts[2])[0]["bytes_sent"] == 3000000
    assert list(kernel_counters.records(iter(["ESTAB 0 0 1.1.1.1:1 2.2.2.2:2\n"]))) == \
        ["ESTAB 0 0 1.1.1.1:1 2.2.2.2:2\n"]


class FakeSs:
    """Returns the next canned output per namespace."""

    def __init__(self, outputs: dict[str, list[str]]):
        self.outputs = outputs
        self.calls: list[str] = []

    def __call__(self, namespace: str) -> tuple[str, float]:
        self.calls.append(namespace)
        queue = self.outputs[namespace]
        return (queue.pop(0) if len(queue) > 1 else queue[0]), 0.002


def line(state: str, local_port: int, peer: str, sent: int, acked: int, retrans: int = 0) -> str:
    return (f"{state} 0 0 10.77.2.1:{local_port} {peer}:7000\n"
            f"\t bbr wscale:7,7 bytes_sent:{sent} bytes_retrans:{retrans} bytes_acked:{acked}\n")


def test_the_sampler_keeps_each_connections_last_value_and_its_final_one():
    fake = FakeSs({"ns-site": [line("ESTAB", 1, "10.77.1.1", 100, 51) +
                               line("ESTAB", 9, "10.77.9.9", 5, 5),  # not a peer
                               line("ESTAB", 1, "10.77.1.1", 400, 301)]})
    s = Sampler([Watch("site-0", "ns-site", {"10.77.1.1": "region-0"})], run_ss=fake,
                start=False)
    s.sample("site-0")
    s.sample("site-0")
    (c,) = s.connections.values()
    assert (c["bytes_sent"], c["bytes_acked"], c["final"]) == (400, 301, False)
    # Its destruction (the event stream) is final, and a periodic read of
    # the same ports after it does not overwrite it.
    s.record("site-0", line("UNCONN", 1, "10.77.1.1", 1000, 1002), final=True)
    s.sample("site-0")
    rec = s.stop()
    (c,) = rec["connections"]
    assert (c["bytes_sent"], c["final"], c["peer_node"]) == (1000, True, "region-0")
    assert rec["samples"] == 3 and rec["events"] == 1
    assert rec["ss_cpu_s"] == pytest.approx(0.006)
    t = kernel_counters.totals(rec, "site-0", "region-0")
    assert t["payload_acked"] == 1000  # less the SYN and the FIN
    assert t["final"] is True and t["connections"] == 1


def test_the_sampler_with_no_period_reads_nothing():
    fake = FakeSs({"ns": [""]})
    s = Sampler([Watch("n", "ns", {"1.1.1.1": "p"})], period=0, run_ss=fake,
                events=lambda *a: pytest.fail("no event stream without sampling"))
    assert s.stop()["connections"] == [] and fake.calls == []


def test_a_connection_reset_midway_and_a_new_one_are_summed():
    rec = {"connections": [
        {"node": "site-0", "peer_node": "root", "bytes_sent": 500, "bytes_retrans": 20,
         "bytes_acked": 400, "bytes_received": 9, "final": True},
        {"node": "site-0", "peer_node": "root", "bytes_sent": 300, "bytes_retrans": 0,
         "bytes_acked": 250, "bytes_received": 0, "final": False},
        {"node": "root", "peer_node": "site-0", "bytes_sent": 7, "bytes_retrans": 0,
         "bytes_acked": 8, "bytes_received": 700, "final": True}]}
    t = kernel_counters.totals(rec, "site-0", "root")
    assert t["connections"] == 2 and t["final"] is False
    assert t["bytes_sent"] == 800 and t["new_payload_sent"] == 780
    assert t["payload_acked"] == 399 + 249
    assert kernel_counters.totals(rec, "site-1", "root") is None
    assert kernel_counters.totals(None, "site-0", "root") is None


def test_watches_cover_each_node_towards_its_parent_and_with_netem_its_children():
    nodes = federation.plan_nodes(federation.BenchFederation(name="t", regions=1,
                                                            sites_per_region=2))
    ns = {n.id: f"ns-{n.id}" for n in nodes}
    up = {w.node: w.peers for w in kernel_counters.watches_for(nodes, ns)}
    assert up == {"region-0": {"10.77.0.1": "root"}, "site-0": {"10.77.1.1": "region-0"},
                  "site-1": {"10.77.1.1": "region-0"}}
    both = {w.node: w.peers for w in kernel_counters.watches_for(nodes, ns, both_ends=True)}
    assert both["root"] == {"10.77.1.1": "region-0"}
    assert both["region-0"] == {"10.77.0.1": "root", "10.77.2.1": "site-0",
                                "10.77.2.2": "site-1"}


def with_kernel(raw: dict, acked: int, final: bool = True) -> dict:
    raw["kernel"] = {"method": "ss", "period_s": 1.0, "samples": 4, "events": 2,
                     "ss_cpu_s": 0.01, "connections": [
                         {"node": site, "peer_node": "region-0", "bytes_sent": acked,
                          "bytes_retrans": 0, "bytes_acked": acked + 1, "bytes_received": 0,
                          "final": final} for site in ("site-0", "site-1")]}
    return raw


def test_the_summary_sets_each_sites_kernel_count_against_its_own_and_the_emulators():
    s = metrics.summarise(with_kernel(raw_record(), 2050))
    rows = {c["site"]: c for c in s["kernel_check"]}
    assert rows["site-0"]["ratio"] == pytest.approx(2050 / 2000)
    assert rows["site-0"]["kernel_over_emulator"] == pytest.approx(1.0)
    assert rows["site-0"]["semantics"] == "final"
    assert s["kernel_sampling"]["events"] == 2 and "connections" not in s["kernel_sampling"]
    assert sorted(s["kernel_to_parent"]) == ["site-0", "site-1"]  # the region had none
    assert s["kernel_to_parent"]["site-1"]["payload_acked"] == 2050
    text = report.markdown({"runs": [s], "machine": {"cores": 2, "kernel": "k", "tcp_cc": "bbr"}})
    assert "kernel payload acked / fedwan count = 1.0250 to 1.0250 over 2 sites " \
           "(2 final, 0 at least); kernel / emulator = 1.0000 to 1.0000" in text
    # Without kernel counters there is no check and no line.
    s = metrics.summarise(raw_record())
    assert all(c["ratio"] is None and c["kernel"] is None for c in s["kernel_check"])
    assert s["kernel_sampling"] is None and s["kernel_to_parent"] == {}
    assert "Kernel counters" not in report.markdown(
        {"runs": [s], "machine": {"cores": 2, "kernel": "k", "tcp_cc": "bbr"}})


def test_a_count_that_missed_the_end_says_at_least():
    s = metrics.summarise(with_kernel(raw_record(), 1000, final=False))
    assert {c["semantics"] for c in s["kernel_check"]} == {"at least"}
    assert report.kernel_line(s).endswith("(0 final, 2 at least); kernel / emulator = "
                                          "0.4878 to 0.4878")
