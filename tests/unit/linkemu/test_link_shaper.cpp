#include "link_shaper.hpp"

#include <gtest/gtest.h>

namespace fedwan::linkemu {
namespace {

constexpr int64_t kMs = 1'000'000;

LinkProfile rate_and_delay(double mbit, double delay_ms) {
  LinkProfile p;
  p.rate_bps = mbit * 1e6;
  p.delay_s = delay_ms / 1e3;
  return p;
}

TEST(LinkDirection, PacketsLeaveAtTheLinkRateAfterThePropagationDelay) {
  // 12 Mbit/s: a 1500-byte packet takes exactly 1 ms to serialise.
  LinkDirection link(rate_and_delay(12, 10), 1);
  for (int k = 0; k < 5; ++k) {
    const Verdict v = link.admit(0, 1500);
    ASSERT_EQ(v.fate, Verdict::Fate::kDeliver);
    EXPECT_EQ(v.copies, 1);
    EXPECT_EQ(v.deliver_ns[0], (k + 1) * kMs + 10 * kMs) << "packet " << k;
  }
  EXPECT_EQ(link.backlog_bytes(0), 5 * 1500u);
  EXPECT_EQ(link.backlog_bytes(2 * kMs), 3 * 1500u);
  // An idle link sends at once: only serialisation and propagation.
  EXPECT_EQ(link.admit(100 * kMs, 1500).deliver_ns[0], 111 * kMs);
}

TEST(LinkDirection, AFullQueueDropsTheTail) {
  LinkProfile p = rate_and_delay(12, 10);
  p.queue_bytes = 3000;
  LinkDirection link(p, 1);
  EXPECT_EQ(link.admit(0, 1500).fate, Verdict::Fate::kDeliver);
  EXPECT_EQ(link.admit(0, 1500).fate, Verdict::Fate::kDeliver);
  EXPECT_EQ(link.admit(0, 1500).fate, Verdict::Fate::kQueueFull);
  // Once one packet has drained there is room for one more.
  EXPECT_EQ(link.admit(1 * kMs, 1500).fate, Verdict::Fate::kDeliver);
  EXPECT_EQ(link.admit(1 * kMs, 1500).fate, Verdict::Fate::kQueueFull);
}

TEST(LinkDirection, TheDefaultQueueIsOneBandwidthDelayProduct) {
  // 200 Mbit/s, 40 ms one way: 2 x 0.04 s x 25 MB/s = 2 MB.
  EXPECT_EQ(rate_and_delay(200, 40).effective_queue_bytes(), 2'000'000u);
  // A short link still buffers 64 full packets.
  EXPECT_EQ(rate_and_delay(1000, 0.1).effective_queue_bytes(), 64u * 1500u);
  EXPECT_EQ(rate_and_delay(0, 40).effective_queue_bytes(), 64u << 20);
  LinkProfile p = rate_and_delay(200, 40);
  p.queue_bytes = 9000;
  EXPECT_EQ(p.effective_queue_bytes(), 9000u);
}

TEST(LinkDirection, AnUnlimitedLinkOnlyDelays) {
  LinkDirection link(rate_and_delay(0, 40), 1);
  for (int k = 0; k < 1000; ++k) {
    const Verdict v = link.admit(k, 1500);
    ASSERT_EQ(v.fate, Verdict::Fate::kDeliver);
    ASSERT_EQ(v.deliver_ns[0], k + 40 * kMs);
  }
  EXPECT_EQ(link.backlog_bytes(0), 0u);
}

TEST(LinkDirection, LossDropsTheConfiguredShareIndependentlyOfRate) {
  LinkProfile p = rate_and_delay(0, 5);
  p.loss = 0.01;
  LinkDirection link(p, 42);
  int lost = 0;
  constexpr int kPackets = 200'000;
  for (int k = 0; k < kPackets; ++k) {
    if (link.admit(k * 1000, 1500).fate == Verdict::Fate::kLost) ++lost;
  }
  // Binomial(200000, 0.01): mean 2000, sd 44.5; 5 sd either side.
  EXPECT_NEAR(lost, 2000, 225);
}

TEST(LinkDirection, JitterStaysInItsRangeAndKeepsPacketsInOrder) {
  LinkProfile p = rate_and_delay(0, 75);
  p.jitter_s = 0.025;
  LinkDirection link(p, 7);
  int64_t last = 0;
  int64_t min_delay = INT64_MAX, max_delay = 0;
  for (int k = 0; k < 10'000; ++k) {
    const int64_t sent = k * 10 * kMs;  // far apart: no ordering floor
    const Verdict v = link.admit(sent, 100);
    ASSERT_GE(v.deliver_ns[0], last);
    last = v.deliver_ns[0];
    min_delay = std::min(min_delay, v.deliver_ns[0] - sent);
    max_delay = std::max(max_delay, v.deliver_ns[0] - sent);
  }
  EXPECT_GE(min_delay, 50 * kMs);
  EXPECT_LE(max_delay, 100 * kMs);
  EXPECT_LT(min_delay, 52 * kMs);  // the whole range is used
  EXPECT_GT(max_delay, 98 * kMs);
  // Packets sent close together: the later one never overtakes.
  LinkDirection close(p, 8);
  last = 0;
  for (int k = 0; k < 10'000; ++k) {
    const Verdict v = close.admit(k * 1000, 100);
    ASSERT_GE(v.deliver_ns[0], last) << "packet " << k;
    last = v.deliver_ns[0];
  }
}

TEST(LinkDirection, ReorderedPacketsSkipThePropagationDelay) {
  LinkProfile p = rate_and_delay(0, 40);
  p.reorder = 0.05;
  LinkDirection link(p, 3);
  int reordered = 0;
  for (int k = 0; k < 100'000; ++k) {
    const Verdict v = link.admit(k * 1000, 1500);
    if (v.reordered) {
      ++reordered;
      EXPECT_EQ(v.deliver_ns[0], k * 1000);
    } else {
      EXPECT_EQ(v.deliver_ns[0], k * 1000 + 40 * kMs);
    }
  }
  EXPECT_NEAR(reordered, 5000, 350);  // sd 69
}

TEST(LinkDirection, DuplicatesArriveTogether) {
  LinkProfile p = rate_and_delay(0, 1);
  p.duplicate = 0.02;
  LinkDirection link(p, 11);
  int doubled = 0;
  for (int k = 0; k < 100'000; ++k) {
    const Verdict v = link.admit(k, 1500);
    if (v.copies == 2) {
      ++doubled;
      EXPECT_EQ(v.deliver_ns[0], v.deliver_ns[1]);
    }
  }
  EXPECT_NEAR(doubled, 2000, 225);  // sd 44
}

TEST(LinkDirection, TheSameSeedGivesTheSameFates) {
  LinkProfile p = rate_and_delay(100, 20);
  p.loss = 0.1;
  p.jitter_s = 0.005;
  LinkDirection a(p, 99), b(p, 99), c(p, 100);
  bool differs = false;
  for (int k = 0; k < 1000; ++k) {
    const Verdict va = a.admit(k * 50'000, 1500), vb = b.admit(k * 50'000, 1500);
    const Verdict vc = c.admit(k * 50'000, 1500);
    ASSERT_EQ(va.fate, vb.fate);
    ASSERT_EQ(va.deliver_ns[0], vb.deliver_ns[0]);
    differs |= va.fate != vc.fate || va.deliver_ns[0] != vc.deliver_ns[0];
  }
  EXPECT_TRUE(differs);
}

TEST(LinkProfile, SaysWhatIsInvalid) {
  EXPECT_EQ(rate_and_delay(100, 20).invalid_reason(), "");
  EXPECT_NE(rate_and_delay(-1, 20).invalid_reason(), "");
  EXPECT_NE(rate_and_delay(0.001, 20).invalid_reason(), "");  // 1 kbit/s: a typo
  EXPECT_NE(rate_and_delay(100, -1).invalid_reason(), "");
  LinkProfile p = rate_and_delay(100, 20);
  p.jitter_s = 0.03;  // more than the delay: a negative delay
  EXPECT_NE(p.invalid_reason().find("jitter"), std::string::npos);
  p = rate_and_delay(100, 20);
  p.loss = 1;
  EXPECT_NE(p.invalid_reason().find("loss"), std::string::npos);
  p.loss = 0;
  p.queue_bytes = 100;
  EXPECT_NE(p.invalid_reason().find("queue"), std::string::npos);
}

}  // namespace
}  // namespace fedwan::linkemu
