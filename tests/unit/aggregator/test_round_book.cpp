// RoundBook: when a root reports a round and a region sends its telemetry,
// and how each child's telemetry is counted (once, for a round that waits).
#include <gtest/gtest.h>

#include "aggregator/round_book.hpp"

namespace fedwan::aggregator {
namespace {

using T = RoundBook::Telemetry;

TEST(RoundBook, RootReportsACompleteRoundOnceEveryLiveRegionReported) {
  RoundBook book(/*is_root=*/true);
  book.report(0).weight = 5;
  EXPECT_FALSE(book.ready(0, 2, false));  // the model is not final yet
  book.complete(0);
  EXPECT_FALSE(book.ready(0, 2, false));
  EXPECT_EQ(book.add_telemetry(0, 1, node::Traffic{100, 200, 2}), T::kTaken);
  EXPECT_FALSE(book.ready(0, 2, false));
  EXPECT_TRUE(book.ready(0, 2, /*force=*/true));  // finishing without a lost region
  EXPECT_EQ(book.add_telemetry(0, 2, node::Traffic{10, 20, 1}), T::kTaken);
  ASSERT_TRUE(book.ready(0, 2, false));
  const node::Traffic t = book.take_subtree(0);
  EXPECT_EQ(t.wan_bytes, 110u);
  EXPECT_EQ(t.fp32_bytes, 220u);
  EXPECT_EQ(t.frames, 3u);
  const RoundReport r = book.take_report(0);
  EXPECT_EQ(r.round, 0u);
  EXPECT_EQ(r.weight, 5);
  EXPECT_TRUE(book.nothing_owed());
}

TEST(RoundBook, EachChildCountsOncePerRound) {
  RoundBook book(true);
  book.report(3);
  EXPECT_EQ(book.add_telemetry(3, 7, node::Traffic{1, 1, 1}), T::kTaken);
  EXPECT_EQ(book.add_telemetry(3, 7, node::Traffic{1, 1, 1}), T::kAgain);
  EXPECT_EQ(book.take_subtree(3).wan_bytes, 1u);
}

TEST(RoundBook, RootDropsTelemetryOfARoundThatDoesNotWait) {
  RoundBook book(true);
  EXPECT_EQ(book.add_telemetry(9, 1, node::Traffic{1, 1, 1}), T::kNoRoundWaits);
  book.report(0);
  book.complete(0);
  (void)book.take_report(0);
  EXPECT_EQ(book.add_telemetry(0, 1, node::Traffic{1, 1, 1}), T::kNoRoundWaits);  // late
}

TEST(RoundBook, RegionSendsARoundOnlyAfterRelayingTheNextAnchor) {
  RoundBook book(/*is_root=*/false);
  EXPECT_EQ(book.add_telemetry(0, 1, node::Traffic{1, 1, 1}), T::kNotRelayedYet);
  EXPECT_FALSE(book.ready(0, 0, false));
  book.relayed_through(1);
  EXPECT_TRUE(book.ready(0, 0, false));  // no region children: nothing to wait for
  EXPECT_FALSE(book.ready(0, 1, false));
  EXPECT_EQ(book.add_telemetry(0, 1, node::Traffic{1, 1, 1}), T::kTaken);
  EXPECT_TRUE(book.ready(0, 1, false));
  EXPECT_EQ(book.owed(), (std::vector<uint64_t>{0}));
  book.sent_through(1);
  EXPECT_TRUE(book.nothing_owed());
  EXPECT_FALSE(book.ready(0, 0, false));  // sent already
  EXPECT_EQ(book.add_telemetry(0, 2, node::Traffic{1, 1, 1}), T::kNoRoundWaits);
}

TEST(RoundBook, AResumedRegionOwesNothingBeforeItsRound) {
  RoundBook book(false);
  book.resume_at(5);
  EXPECT_TRUE(book.nothing_owed());
  EXPECT_EQ(book.add_telemetry(4, 1, node::Traffic{1, 1, 1}), T::kNoRoundWaits);
  EXPECT_EQ(book.add_telemetry(5, 1, node::Traffic{1, 1, 1}), T::kNotRelayedYet);
  book.relayed_through(7);
  EXPECT_EQ(book.owed(), (std::vector<uint64_t>{5, 6}));
}

}  // namespace
}  // namespace fedwan::aggregator
