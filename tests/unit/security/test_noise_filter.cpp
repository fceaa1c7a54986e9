#include "security/noise_filter.hpp"

#include <gtest/gtest.h>

#include <string>

namespace fedwan::security {
namespace {

using Clock = NoiseFilter::Clock;
using std::chrono::milliseconds;

NoiseFilter::Options opts(uint32_t burst, size_t max_keys = 256) {
  NoiseFilter::Options o;
  o.window = milliseconds(1000);
  o.burst = burst;
  o.max_keys = max_keys;
  return o;
}

TEST(NoiseFilter, AFloodCostsABurstPerWindowAndIsCountedInFull) {
  NoiseFilter f(opts(20));
  const auto t0 = Clock::time_point{} + std::chrono::hours(1);
  uint64_t written = 0;
  for (int i = 0; i < 20000; ++i) written += f.admit("frame_rejected:plaintext", t0, 100);
  EXPECT_EQ(written, 20u);
  EXPECT_TRUE(f.drain(t0).empty());  // the window is still open
  const auto summaries = f.drain(t0 + milliseconds(1000));
  ASSERT_EQ(summaries.size(), 1u);
  EXPECT_EQ(summaries[0].key, "frame_rejected:plaintext");
  EXPECT_EQ(summaries[0].suppressed, 20000u - 20u);
  EXPECT_EQ(summaries[0].bytes, (20000u - 20u) * 100u);
  // A new window writes again.
  EXPECT_TRUE(f.admit("frame_rejected:plaintext", t0 + milliseconds(1500)));
}

TEST(NoiseFilter, KeysAreIndependentAndBounded) {
  NoiseFilter f(opts(1, /*max_keys=*/8));
  const auto t0 = Clock::time_point{} + std::chrono::hours(1);
  EXPECT_TRUE(f.admit("a", t0));
  EXPECT_FALSE(f.admit("a", t0));
  EXPECT_TRUE(f.admit("b", t0));
  // An attacker inventing a new key per message: the table stays bounded,
  // and the extra keys share the overflow key's burst.
  int written = 0;
  for (int i = 0; i < 10000; ++i) written += f.admit("peer-" + std::to_string(i), t0);
  EXPECT_LE(f.keys(), 8u + 1u);
  EXPECT_LE(written, 8);
  uint64_t suppressed = 0;
  for (const auto& s : f.drain(t0, /*all=*/true)) suppressed += s.suppressed;
  // Everything is accounted for: written, or counted in a summary (one of
  // "a" too).
  EXPECT_EQ(suppressed + static_cast<uint64_t>(written), 10000u + 1u);
}

TEST(NoiseFilter, IdleKeysAreForgotten) {
  NoiseFilter f(opts(5));
  const auto t0 = Clock::time_point{} + std::chrono::hours(1);
  for (int i = 0; i < 100; ++i) f.admit("k" + std::to_string(i), t0);
  EXPECT_EQ(f.keys(), 100u);
  EXPECT_TRUE(f.drain(t0 + milliseconds(1001)).empty());  // nothing held back
  EXPECT_EQ(f.keys(), 0u);
}

TEST(NoiseKey, PeerChosenPartsDoNotMakeNewKeys) {
  EXPECT_EQ(noise_key("refusal", "delta chunk 3 of round 17 refused"),
            noise_key("refusal", "delta chunk 9 of round 2 refused"));
  EXPECT_EQ(noise_key("handshake_refused", "'eve-1' is not a node of topology 8c9d2e43f0e0"),
            noise_key("handshake_refused", "'eve-2' is not a node of topology 8c9d2e43f0e0"));
  EXPECT_NE(noise_key("frame_rejected", "sealed frame refused: bad tag"),
            noise_key("frame_rejected", "sealed frame refused: replay"));
  EXPECT_LE(noise_key("e", std::string(100000, 'x')).size(), 2u + 80u);
}

}  // namespace
}  // namespace fedwan::security
