"""`fedwan bench streams`: its flags and plan, the figures of one case from
what was measured, the table and the chart (no namespaces, no processes)."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fedwan_bench import streams  # noqa: E402
from fedwan_bench.__main__ import main  # noqa: E402


def parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command")
    streams.add_parser(sub)
    return ap.parse_args(["streams", *argv])


def test_the_default_plan_is_one_two_and_four_streams_under_bbr_and_cubic():
    link, name, cases = streams.plan(parse())
    assert name == "intercontinental" and (link.rate_mbit, link.delay_ms) == (200, 40)
    assert cases == [("bbr", 1), ("bbr", 2), ("bbr", 4), ("cubic", 1), ("cubic", 2),
                     ("cubic", 4)]
    args = parse("--streams", "8, 1,1", "--cc", "reno")
    assert streams.plan(args)[2] == [("reno", 8), ("reno", 1)]


def test_quick_and_custom_links():
    args = parse("--quick")
    _, _, cases = streams.plan(args)
    assert cases == [("bbr", 1), ("bbr", 2), ("cubic", 1), ("cubic", 2)]
    assert args.seconds == 1.0
    link, name, _ = streams.plan(parse("--profile", "degraded", "--rate-mbit", "20"))
    assert name == "custom" and (link.rate_mbit, link.delay_ms, link.loss_percent) == (20, 75, 1)
    link, name, _ = streams.plan(parse("--profile", "custom", "--delay-ms", "5"))
    assert name == "custom" and link.delay_ms == 5


@pytest.mark.parametrize("argv, match", [
    (("--streams", "0"), "1 to 64"),
    (("--streams", "two"), "'two' is not valid"),
    (("--streams", ","), "--streams is empty"),
    (("--cc", ""), "--cc is empty"),
    (("--seconds", "0"), "--seconds must be positive"),
    (("--profile", "moon"), "unknown profile"),
])
def test_bad_flags_are_refused_before_anything_starts(argv, match):
    with pytest.raises(SystemExit, match=match):
        streams.plan(parse(*argv))


def test_the_subcommand_is_listed(capsys):
    with pytest.raises(SystemExit):
        main(["streams", "--help"])
    text = capsys.readouterr().out
    for flag in ("--streams", "--cc", "--seconds", "--quick", "--out"):
        assert flag in text


def test_fairness():
    assert streams.jain([5.0, 5.0, 5.0]) == pytest.approx(1.0)
    assert streams.jain([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert streams.jain([]) is None and streams.jain([0.0, 0.0]) is None


def case(cc: str = "bbr", n: int = 2, **over) -> dict:
    kernel = [{"bytes_sent": 10_000_000, "bytes_retrans": 100_000, "rtt_ms": 90.0},
              {"bytes_sent": 10_000_000, "bytes_retrans": 0, "rtt_ms": 110.0}][:n]
    counters = {"packets": 20_000, "lost_packets": 20, "queue_drop_packets": 80,
                "tcp_retransmitted_bytes": 99_000, "tcp_new_payload_bytes": 19_900_000}
    args = dict(cc=cc, streams=n, seconds=4.0, link={"rate_mbit": 50, "delay_ms": 40},
                per_stream=[12_000_000, 8_000_000][:n],
                series=[(0.0, 0), (1.0, 2_000_000), (2.0, 8_000_000), (4.0, 20_000_000)],
                counters=counters, kernel=kernel, busy=0.5, emulator_busy=0.3)
    args.update(over)
    return streams.summarise_case(**args)


def test_a_case_is_summarised_from_what_was_measured():
    c = case()
    assert c["received_bytes"] == 20_000_000
    assert c["goodput_mbit"] == pytest.approx(40.0)  # 20 MB in 4 s
    assert c["share_of_rate"] == pytest.approx(40.0 * 1500 / 1448 / 50)
    # Steady: the second half of the window, 8 MB -> 20 MB in 2 s.
    assert c["steady_mbit"] == pytest.approx(48.0)
    assert c["steady_share_of_rate"] == pytest.approx(48.0 * 1500 / 1448 / 50)
    assert c["fairness"] == pytest.approx(400 / (2 * (144 + 64)))
    assert c["kernel_retrans_share"] == pytest.approx(0.005)
    assert c["rtt_ms_mean"] == pytest.approx(100.0)
    assert c["drop_share"] == pytest.approx(0.005)
    assert c["emulator_retransmitted_bytes"] == 99_000
    assert c["cpu_bound"] is False
    assert case(emulator_busy=0.95)["cpu_bound"] is True


def test_a_case_on_an_unlimited_link_without_link_counters():
    c = case(link={"rate_mbit": 0, "delay_ms": 1}, counters=None, kernel=[],
             series=[(0.0, 0)], busy=None, emulator_busy=None)
    assert c["share_of_rate"] is None and c["steady_mbit"] is None
    assert c["lost_packets"] is None and c["drop_share"] is None
    assert c["rtt_ms_mean"] is None and c["kernel_retrans_share"] is None
    assert c["cpu_bound"] is False


def doc() -> dict:
    return {"profile": "intercontinental", "seconds": 4.0,
            "link": {"rate_mbit": 50, "delay_ms": 40, "text": "50 Mbit/s, 40 ms"},
            "shaping": "fedwan-linkemu (userspace TUN emulator)",
            "machine": {"cores": 2, "kernel": "k", "tcp_wmem": "4096 16384 4194304",
                        "tcp_rmem": "4096 131072 6291456"},
            "cases": [case("bbr", 1), case("bbr", 2), case("cubic", 1)]}


def test_the_table_has_a_row_per_case_and_names_the_shaping():
    text = streams.markdown(doc())
    assert "Shaping: fedwan-linkemu" in text and "tcp_wmem 4096 16384 4194304" in text
    rows = [line for line in text.splitlines() if line.startswith("| bbr") or
            line.startswith("| cubic")]
    assert len(rows) == 3
    assert rows[1].startswith("| bbr | 2 | 40.0 | 0.83 | 0.99 | 0.50 | 20 + 80 | 0.962 | 100.0 |")


def test_the_chart_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = streams.plot(doc(), str(tmp_path))
    assert os.path.basename(path) == "streams.png" and os.path.getsize(path) > 1000
