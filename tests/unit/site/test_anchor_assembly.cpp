// site::AnchorAssembly: what each anchor chunk coming down to a site is,
// for the model in full after a welcome and for the next round's anchor,
// whose chunks may come before the site computed its delta of them.
#include "site/anchor_assembly.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace fedwan::site {
namespace {

using Step = AnchorAssembly::Step;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kChunks = 4;
const std::vector<uint8_t> kPayload = {1, 2, 3};

struct Harness {
  AnchorAssembly a{kChunks};
  uint64_t round = 5;         // the site's round
  uint32_t encoded_upto = 0;  // its delta chunks computed so far
  Clock::time_point now = Clock::now();

  AnchorAssembly::Taken update(uint64_t chunk_round, uint32_t chunk) {
    return a.take(chunk_round, chunk, false, round, encoded_upto, 7, kPayload.data(),
                  kPayload.size(), now);
  }
  Step full(uint64_t chunk_round, uint32_t chunk) {
    return a
        .take(chunk_round, chunk, true, round, encoded_upto, 0, kPayload.data(), kPayload.size(),
              now)
        .step;
  }
};

TEST(AnchorAssembly, AModelInFullCompletesOnceWithEveryChunk) {
  Harness h;
  EXPECT_EQ(h.full(9, 0), Step::kIgnored);  // not asked for
  h.a.expect_full(9);
  EXPECT_TRUE(h.a.full_pending());
  EXPECT_EQ(h.a.full_round(), 9u);
  EXPECT_EQ(h.full(8, 0), Step::kIgnored);  // another round's
  EXPECT_EQ(h.full(9, 2), Step::kFull);
  EXPECT_EQ(h.full(9, 2), Step::kIgnored);  // a duplicate
  EXPECT_EQ(h.full(9, 0), Step::kFull);
  EXPECT_EQ(h.full(9, 3), Step::kFull);
  EXPECT_EQ(h.full(9, kChunks), Step::kIgnored);  // past the plan
  EXPECT_EQ(h.full(9, 1), Step::kFullComplete);
  h.a.forget_full();
  EXPECT_FALSE(h.a.full_pending());
  EXPECT_EQ(h.full(9, 1), Step::kIgnored);
}

TEST(AnchorAssembly, AskingForTheModelAgainStartsItsCountOver) {
  Harness h;
  h.a.expect_full(9);
  EXPECT_EQ(h.full(9, 0), Step::kFull);
  h.a.expect_full(9);  // a hello asked again: every chunk comes again
  for (uint32_t c = 0; c + 1 < kChunks; ++c) EXPECT_EQ(h.full(9, c), Step::kFull);
  EXPECT_EQ(h.full(9, kChunks - 1), Step::kFullComplete);
}

TEST(AnchorAssembly, ChunksOfTheNextAnchorApplyOnceTheirDeltaIsComputed) {
  Harness h;
  h.a.expect_next(6);
  h.encoded_upto = 2;
  EXPECT_EQ(h.update(6, 1).step, Step::kApply);
  EXPECT_EQ(h.update(6, 3).step, Step::kEarly);
  EXPECT_EQ(h.update(6, 2).step, Step::kEarly);
  EXPECT_EQ(h.update(6, 3).step, Step::kIgnored);  // a duplicate
  EXPECT_EQ(h.update(7, 0).step, Step::kIgnored);  // another round's
  EXPECT_EQ(h.a.next_received(), 3u);
  EXPECT_TRUE(h.a.next_incomplete());
  // Delta chunk 2 is computed: the chunk kept for it, not the one for 3.
  std::vector<AnchorAssembly::EarlyChunk> ready = h.a.take_early(3);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].chunk, 2u);
  EXPECT_EQ(ready[0].codec, 7);
  EXPECT_EQ(ready[0].payload, kPayload);
  ready = h.a.take_early(kChunks);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].chunk, 3u);
  EXPECT_TRUE(h.a.take_early(kChunks).empty());
  EXPECT_EQ(h.update(6, 0).step, Step::kApply);
  EXPECT_TRUE(h.a.next_complete());
  EXPECT_FALSE(h.a.next_incomplete());
}

TEST(AnchorAssembly, AChunkBeforeTheSyncOpensTheNextAnchorAndIsKept) {
  Harness h;
  h.encoded_upto = 3;  // of the round before: the next sync starts from 0
  const AnchorAssembly::Taken t = h.update(6, 1);
  EXPECT_TRUE(t.opened);
  EXPECT_EQ(t.step, Step::kEarly);
  EXPECT_EQ(h.a.next_round(), 6u);
  // The sync begins: what came for its round stays.
  h.a.expect_next(6);
  EXPECT_EQ(h.a.next_received(), 1u);
  EXPECT_EQ(h.a.take_early(2).size(), 1u);
  // Nor is a round other than the next one opened.
  Harness g;
  EXPECT_EQ(g.update(7, 0).step, Step::kIgnored);
  EXPECT_FALSE(g.a.next_pending());
}

TEST(AnchorAssembly, AModelInFullOnItsWayOpensNoNextAnchor) {
  Harness h;
  h.a.expect_full(5);
  EXPECT_EQ(h.update(6, 0).step, Step::kIgnored);
  EXPECT_FALSE(h.a.next_pending());
}

TEST(AnchorAssembly, AnotherRoundsAssemblyIsReplacedWithWhatItKept) {
  Harness h;
  h.a.expect_next(6);
  EXPECT_EQ(h.update(6, 2).step, Step::kEarly);
  h.a.expect_next(8);  // resynced meanwhile
  EXPECT_EQ(h.a.next_received(), 0u);
  EXPECT_TRUE(h.a.take_early(kChunks).empty());
}

TEST(AnchorAssembly, OnlyEveryChunkCompletesTheNextAnchor) {
  Harness h;
  EXPECT_FALSE(h.a.next_complete());  // nothing awaited
  EXPECT_FALSE(h.a.next_incomplete());
  h.a.expect_next(6);
  h.encoded_upto = kChunks;
  for (uint32_t c = 0; c + 1 < kChunks; ++c) EXPECT_EQ(h.update(6, c).step, Step::kApply);
  EXPECT_FALSE(h.a.next_complete());
  EXPECT_TRUE(h.a.next_incomplete());
  EXPECT_EQ(h.update(6, kChunks - 1).step, Step::kApply);
  EXPECT_TRUE(h.a.next_complete());
  EXPECT_FALSE(h.a.next_incomplete());
  h.a.forget_next();
  EXPECT_FALSE(h.a.next_complete());
}

TEST(AnchorAssembly, ProgressIsWhenAChunkOfTheNextAnchorLastCame) {
  Harness h;
  h.a.expect_next(6);
  const auto later = h.now + std::chrono::seconds(3);
  h.a.progressed(h.now);
  EXPECT_EQ(h.a.progress_at(), h.now);
  h.now = later;
  h.encoded_upto = kChunks;
  EXPECT_EQ(h.update(6, 0).step, Step::kApply);
  EXPECT_EQ(h.a.progress_at(), later);
  h.now = later + std::chrono::seconds(1);
  EXPECT_EQ(h.update(6, 0).step, Step::kIgnored);  // a duplicate is no progress
  EXPECT_EQ(h.a.progress_at(), later);
}

}  // namespace
}  // namespace fedwan::site
