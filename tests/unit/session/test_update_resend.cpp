// session::UpdateResend: a child sends again only what its parent names, and
// only once the parent's count of chunks received stopped growing for the
// patience (never on a fixed timer while a slow link still delivers).
#include "session/update_resend.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace fedwan::session {
namespace {

using namespace std::chrono_literals;
using Clock = UpdateResend::Clock;
using Chunks = std::vector<uint32_t>;

wire::NeedUpdatePayload need(uint32_t delivered, Chunks missing) {
  wire::NeedUpdatePayload p;
  p.delivered = delivered;
  p.missing = std::move(missing);
  p.progress_known = true;
  return p;
}

TEST(UpdateResend, ASlowLinkThatStillDeliversIsNeverResent) {
  UpdateResend r(1000ms);
  const Clock::time_point t0 = Clock::now();
  r.begin(4, t0);
  r.handed_over(t0 + 10ms);
  // A chunk every 800 ms, 4 s in all: always less than the patience apart.
  for (uint32_t k = 1; k <= 5; ++k) {
    const auto t = t0 + k * 800ms;
    Chunks missing;
    for (uint32_t c = k; c < 6; ++c) missing.push_back(c);
    EXPECT_TRUE(r.on_need(4, need(k, missing), t).empty()) << "at " << k;
  }
}

TEST(UpdateResend, OnlyTheChunksNamedGoOnceProgressStalls) {
  UpdateResend r(1000ms);
  const Clock::time_point t0 = Clock::now();
  r.begin(2, t0);
  r.handed_over(t0);
  EXPECT_TRUE(r.on_need(2, need(4, {3}), t0 + 200ms).empty());   // progress
  EXPECT_TRUE(r.on_need(2, need(4, {3}), t0 + 1100ms).empty());  // stalled, not for long
  EXPECT_EQ(r.on_need(2, need(4, {3}), t0 + 1300ms), Chunks{3});
  // Not again before another patience without progress.
  EXPECT_TRUE(r.on_need(2, need(4, {3}), t0 + 2000ms).empty());
  EXPECT_EQ(r.on_need(2, need(4, {3}), t0 + 2400ms), Chunks{3});
}

TEST(UpdateResend, ThePatienceRunsFromTheHandOverAtTheEarliest) {
  UpdateResend r(1000ms);
  const Clock::time_point t0 = Clock::now();
  r.begin(0, t0);
  r.handed_over(t0 + 5s);  // a long upload: nothing is late before it is sent
  EXPECT_TRUE(r.on_need(0, need(0, {0, 1}), t0 + 5500ms).empty());
  EXPECT_EQ(r.on_need(0, need(0, {0, 1}), t0 + 6100ms), (Chunks{0, 1}));
}

TEST(UpdateResend, OtherRoundsAndNothingMissingAskForNothing) {
  UpdateResend r(100ms);
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(r.on_need(0, need(0, {0}), t0 + 1s).empty());  // no update yet
  r.begin(3, t0);
  EXPECT_TRUE(r.on_need(2, need(0, {0}), t0 + 1s).empty());
  EXPECT_TRUE(r.on_need(4, need(0, {0}), t0 + 1s).empty());
  EXPECT_TRUE(r.on_need(3, need(5, {}), t0 + 1s).empty());
  // A new round starts its count from nothing.
  r.begin(4, t0 + 2s);
  EXPECT_TRUE(r.on_need(4, need(1, {1}), t0 + 2050ms).empty());
}

TEST(UpdateResend, AParentThatSaysNothingOfProgressGetsEveryChunkAfterThePatience) {
  UpdateResend r(1000ms);
  const Clock::time_point t0 = Clock::now();
  r.begin(1, t0);
  wire::NeedUpdatePayload all;
  ASSERT_TRUE(wire::decode_need_update(nullptr, 0, 3, &all));
  EXPECT_TRUE(r.on_need(1, all, t0 + 900ms).empty());
  EXPECT_EQ(r.on_need(1, all, t0 + 1100ms), (Chunks{0, 1, 2}));
}

}  // namespace
}  // namespace fedwan::session
