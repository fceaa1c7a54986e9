"""The link emulator accuracy test's reading of TCP's steady goodput, from
arrival records built by hand (no namespaces, no processes)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import linkemu_accuracy  # noqa: E402

RATE = 12.5e6  # payload bytes a second: 100 Mbit/s


def arrivals(total: int, stall_at: float | None = None, stall_s: float = 0.0):
    """(cumulative bytes, time) every 64 KiB at RATE, with one gap of
    stall_s when `stall_at` of the bytes have arrived."""
    out, t, got, stalled = [], 0.0, 0, False
    while got < total:
        got = min(total, got + 65536)
        t += 65536 / RATE
        if stall_at is not None and not stalled and got >= stall_at * total:
            t += stall_s
            stalled = True
        out.append((got, t))
    return out


def ip_mbit(payload_bytes_a_second: float) -> float:
    return payload_bytes_a_second * 1500 / linkemu_accuracy.MSS * 8 / 1e6


def test_a_steady_transfer_reads_the_rate():
    rate, left_out = linkemu_accuracy.steady_rate_bps(arrivals(40_000_000), drops=0)
    assert rate / 1e6 == pytest.approx(ip_mbit(RATE), rel=0.01)
    assert left_out == 0


def test_a_retransmission_timeout_after_drops_is_left_out():
    samples = arrivals(40_000_000, stall_at=0.7, stall_s=2.0)
    rate, left_out = linkemu_accuracy.steady_rate_bps(samples, drops=900)
    assert left_out == pytest.approx(2.0, abs=0.01)
    assert rate / 1e6 == pytest.approx(ip_mbit(RATE), rel=0.01)


def test_a_link_that_stalls_without_dropping_is_not_excused():
    samples = arrivals(40_000_000, stall_at=0.7, stall_s=2.0)
    rate, left_out = linkemu_accuracy.steady_rate_bps(samples, drops=0)
    assert left_out == 0
    assert rate / 1e6 < 0.6 * ip_mbit(RATE)


def test_short_gaps_of_loss_recovery_count():
    # A hole repaired within a round trip holds bytes back for less than
    # STALL_S: that is the link's time and counts.
    samples = arrivals(40_000_000, stall_at=0.7, stall_s=0.05)
    rate, left_out = linkemu_accuracy.steady_rate_bps(samples, drops=10)
    assert left_out == 0
    assert rate / 1e6 < ip_mbit(RATE)
