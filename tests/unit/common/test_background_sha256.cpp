// BackgroundSha256 (common/background_sha256.hpp): each range's digest is
// the one SHA-256 gives it on this thread, whatever the number of helpers
// and however the ranges fall against its 16 MiB pieces.
#include "common/background_sha256.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "common/keep_alive.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

std::vector<uint8_t> random_bytes(size_t n, unsigned seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(BackgroundSha256, EachRangeGetsItsOwnDigestWhateverTheHelpers) {
  // Sizes around the 16 MiB piece, an empty range with no bytes at all,
  // and a small one.
  const std::vector<size_t> sizes = {(size_t{16} << 20) + 3, 0, 17, size_t{16} << 20,
                                     (size_t{32} << 20) - 1};
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < sizes.size(); ++i) data.push_back(random_bytes(sizes[i], 5 + i));
  std::vector<Sha256Digest> want;
  std::vector<BackgroundSha256::Range> ranges;
  for (const auto& d : data) {
    want.push_back(sha256(d.data(), d.size()));
    ranges.push_back({d.empty() ? nullptr : d.data(), d.size()});
  }
  for (unsigned threads : {0U, 1U, 2U, 16U}) {
    BackgroundSha256 h(ranges, threads);
    EXPECT_EQ(h.wait(), want) << threads << " helpers";
  }
}

TEST(BackgroundSha256, NoRangesGiveNoDigests) {
  BackgroundSha256 h({}, 4);
  EXPECT_TRUE(h.wait().empty());
}

TEST(BackgroundSha256, WaitingTwiceIsRefused) {
  const std::vector<uint8_t> d = random_bytes(100, 1);
  BackgroundSha256 h({{d.data(), d.size()}}, 1);
  (void)h.wait();
  EXPECT_THROW((void)h.wait(), Error);
}

// Destroyed without a wait (the writer failed): the helpers stop at the end
// of their piece, and the destructor returns once they have, before the
// bytes go (a sanitizer build sees any read after).
TEST(BackgroundSha256, DestroyedUnwaitedStopsItsHelpers) {
  for (unsigned threads : {1U, 3U}) {
    const std::vector<uint8_t> d = random_bytes(size_t{40} << 20, threads);
    BackgroundSha256 h({{d.data(), d.size()}, {d.data(), d.size()}, {d.data(), d.size()}}, threads);
  }
}

// While it waits for a helper, the caller's heartbeats go on: its
// KeepAlive scope beats.
TEST(BackgroundSha256, WaitingPulsesTheCallersKeepAlive) {
  const std::vector<uint8_t> d = random_bytes(size_t{48} << 20, 3);
  unsigned long beats = 0;
  {
    KeepAlive keep(std::chrono::nanoseconds(1), [] {});
    BackgroundSha256 h({{d.data(), d.size()}}, 1);
    EXPECT_EQ(h.wait().at(0), sha256(d.data(), d.size()));
    beats = keep.beats();
  }
  // Whichever thread hashed the range, this one pulsed: between pieces
  // if it hashed, while it waited otherwise.
  EXPECT_GE(beats, 1u);
}

}  // namespace
}  // namespace fedwan
