#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <set>

#include "security/replay_window.hpp"

namespace fedwan::security {
namespace {

using V = ReplayWindow::Verdict;
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kSize = ReplayWindow::kSize;

// What the window should say, from the full history: seen before -> replay;
// more than kSize - 1 below the highest -> too old; else fresh.
class ReferenceWindow {
 public:
  V check(uint64_t seq) const {
    if (seen_.empty() || seq > highest_) return V::kFresh;
    if (highest_ - seq >= kSize) return V::kTooOld;
    return seen_.count(seq) ? V::kReplay : V::kFresh;
  }
  void accept(uint64_t seq) {
    if (seen_.empty() || seq > highest_) highest_ = seq;
    seen_.insert(seq);
  }

 private:
  std::set<uint64_t> seen_;
  uint64_t highest_ = 0;
};

// Accepts when fresh (as the opener does), returning the verdict.
V offer(ReplayWindow& w, uint64_t seq) {
  const V v = w.check(seq);
  if (v == V::kFresh) w.accept(seq);
  return v;
}

TEST(ReplayWindow, EmptyAcceptsAnythingIncludingZero) {
  ReplayWindow w;
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(w.check(0), V::kFresh);
  EXPECT_EQ(w.check(kMax), V::kFresh);
  EXPECT_TRUE(w.empty()) << "check() must not record";
  EXPECT_EQ(offer(w, 0), V::kFresh);
  EXPECT_FALSE(w.empty());
  EXPECT_EQ(w.highest(), 0u);
  EXPECT_EQ(w.check(0), V::kReplay);
  EXPECT_EQ(w.check(1), V::kFresh);
}

TEST(ReplayWindow, InOrderThenDuplicates) {
  ReplayWindow w;
  for (uint64_t s = 0; s < 5000; ++s) ASSERT_EQ(offer(w, s), V::kFresh) << s;
  EXPECT_EQ(w.highest(), 4999u);
  for (uint64_t s = 4999 - (kSize - 1); s < 5000; ++s) EXPECT_EQ(w.check(s), V::kReplay) << s;
  for (uint64_t s = 0; s < 4999 - (kSize - 1); ++s) ASSERT_EQ(w.check(s), V::kTooOld) << s;
}

TEST(ReplayWindow, CheckNeverMutates) {
  ReplayWindow w;
  offer(w, 10);
  for (uint64_t s : {uint64_t(0), uint64_t(9), uint64_t(11), uint64_t(5000), kMax}) {
    w.check(s);
  }
  EXPECT_EQ(w.highest(), 10u);
  EXPECT_EQ(w.check(11), V::kFresh);
  EXPECT_EQ(w.check(9), V::kFresh);
  EXPECT_EQ(w.check(10), V::kReplay);
}

TEST(ReplayWindow, OutOfOrderWithinTheWindow) {
  ReplayWindow w;
  EXPECT_EQ(offer(w, 2000), V::kFresh);
  // The edges: highest - (kSize - 1) is the oldest still tracked.
  EXPECT_EQ(w.check(2000 - kSize), V::kTooOld);
  EXPECT_EQ(offer(w, 2000 - (kSize - 1)), V::kFresh);
  EXPECT_EQ(offer(w, 2000 - (kSize - 1)), V::kReplay);
  for (uint64_t s = 1999; s > 2000 - (kSize - 1); s -= 3) EXPECT_EQ(offer(w, s), V::kFresh) << s;
  for (uint64_t s = 1999; s > 2000 - (kSize - 1); s -= 3) EXPECT_EQ(offer(w, s), V::kReplay) << s;
  EXPECT_EQ(offer(w, 1998), V::kFresh);
  EXPECT_EQ(w.highest(), 2000u);
}

TEST(ReplayWindow, SlidesEveryShiftAcrossWordBoundaries) {
  // For each shift s, record a pattern, move up by s and verify every
  // distance: catches an undefined shift by 64 or a word carried wrongly.
  for (uint64_t shift = 1; shift <= kSize + 1; ++shift) {
    ReplayWindow w;
    ReferenceWindow ref;
    const uint64_t base = 5000;
    for (uint64_t s = base - (kSize - 1); s <= base; s += 1 + (s % 5)) {
      w.accept(s);
      ref.accept(s);
    }
    w.accept(base);
    ref.accept(base);
    w.accept(base + shift);
    ref.accept(base + shift);
    for (uint64_t s = base - kSize - 2; s <= base + shift + 2; ++s) {
      ASSERT_EQ(w.check(s), ref.check(s)) << "shift " << shift << " seq " << s;
    }
  }
}

TEST(ReplayWindow, BigJumpClearsEverything) {
  ReplayWindow w;
  for (uint64_t s = 0; s < 100; ++s) offer(w, s);
  EXPECT_EQ(offer(w, 1'000'000'000), V::kFresh);
  for (uint64_t s = 1'000'000'000 - (kSize - 1); s < 1'000'000'000; ++s) {
    ASSERT_EQ(w.check(s), V::kFresh) << s;
  }
  EXPECT_EQ(w.check(50), V::kTooOld);
  EXPECT_EQ(w.check(1'000'000'000), V::kReplay);
  // A jump of exactly kSize leaves only the new number recorded.
  ReplayWindow x;
  offer(x, 10);
  offer(x, 10 + kSize);
  EXPECT_EQ(x.check(10), V::kTooOld);
  EXPECT_EQ(x.check(11), V::kFresh);
}

TEST(ReplayWindow, NearTheTopOfTheRange) {
  ReplayWindow w;
  EXPECT_EQ(offer(w, kMax - 1), V::kFresh);
  EXPECT_EQ(offer(w, kMax), V::kFresh);
  EXPECT_EQ(offer(w, kMax), V::kReplay);
  EXPECT_EQ(offer(w, kMax - 1), V::kReplay);
  EXPECT_EQ(offer(w, kMax - 2), V::kFresh);
  EXPECT_EQ(w.check(kMax - (kSize - 1)), V::kFresh);
  EXPECT_EQ(w.check(kMax - kSize), V::kTooOld);
  EXPECT_EQ(w.check(0), V::kTooOld);

  // From 0 straight to the top: a jump larger than any window.
  ReplayWindow z;
  offer(z, 0);
  EXPECT_EQ(offer(z, kMax), V::kFresh);
  EXPECT_EQ(z.check(0), V::kTooOld);
  EXPECT_EQ(z.check(kMax - 1), V::kFresh);
}

TEST(ReplayWindow, AcceptBelowTheWindowRecordsNothing) {
  ReplayWindow w;
  offer(w, 5000);
  w.accept(10);  // precondition broken on purpose: must not corrupt the bitmap
  EXPECT_EQ(w.highest(), 5000u);
  EXPECT_EQ(w.check(10), V::kTooOld);
  for (uint64_t s = 5000 - (kSize - 1); s < 5000; ++s) ASSERT_EQ(w.check(s), V::kFresh) << s;
}

uint64_t add_saturating(uint64_t a, uint64_t b) { return a > kMax - b ? kMax : a + b; }
uint64_t sub_saturating(uint64_t a, uint64_t b) { return a < b ? 0 : a - b; }

// Random reordering, duplication and jumps, against the reference model;
// half the trials run into the top of the sequence space.
TEST(ReplayWindow, MatchesTheReferenceOnRandomTraffic) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    ReplayWindow w;
    ReferenceWindow ref;
    uint64_t next = trial % 2 == 0 ? rng() % 1000 : kMax - 3'000'000;
    for (int i = 0; i < 20'000; ++i) {
      uint64_t seq;
      switch (rng() % 8) {
        case 0:
        case 1:
        case 2: seq = next; break;                                // in order
        case 3: seq = sub_saturating(next, rng() % 1100); break;  // late or duplicate
        case 4: seq = sub_saturating(next, rng() % 70); break;
        case 5: seq = add_saturating(next, rng() % 130); break;    // early
        case 6: seq = sub_saturating(next, rng() % 4000); break;   // very late
        default: seq = add_saturating(next, rng() % 3000); break;  // a lost burst
      }
      if (seq >= next) next = add_saturating(seq, 1);
      const V expected = ref.check(seq);
      ASSERT_EQ(w.check(seq), expected) << "trial " << trial << " step " << i << " seq " << seq;
      if (expected == V::kFresh) {
        w.accept(seq);
        ref.accept(seq);
      }
    }
  }
}

}  // namespace
}  // namespace fedwan::security
