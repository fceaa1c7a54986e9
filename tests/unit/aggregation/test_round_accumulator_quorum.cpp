// RoundAccumulator's fault-tolerance bookkeeping, without sockets: which
// chunks an aggregator may close when every expected child is in, when a
// child is lost, and at a deadline with quorum; what a late or repeated
// arrival does once a chunk is closed; and that a chunk closed without some
// children is the weighted mean of exactly those that were in.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "aggregation/round_accumulator.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

using Ids = std::vector<uint32_t>;

class RoundAccumulatorQuorumTest : public ::testing::Test {
 protected:
  // Three children with weights 1, 2, 3 (total 6); a quorum of 0.6 asks for
  // 3.6 behind a chunk: children 9 + 11 (5) reach it, 7 + 9 (3) do not.
  static constexpr uint32_t kA = 7, kB = 9, kC = 11;
  static constexpr double kMinWeight = 0.6 * 6;
  const Codec& fp32 = codec_by_name("fp32");
  tensor::ChunkPlan plan{10, 4};  // chunks of 4, 4, 2
  aggregation::RoundAccumulator acc{plan, {kA, kB, kC}};

  static double weight_of(uint32_t child) { return child == kA ? 1.0 : child == kB ? 2.0 : 3.0; }

  std::vector<float> values(uint32_t chunk, float base) const {
    std::vector<float> v(plan.size(chunk));
    for (size_t i = 0; i < v.size(); ++i) v[i] = base + 0.25f * static_cast<float>(i);
    return v;
  }

  aggregation::AddOutcome add(uint64_t round, uint32_t child, uint32_t chunk, float base = 1.0f) {
    return add_result(round, child, chunk, base).outcome;
  }
  aggregation::RoundAccumulator::Result add_result(uint64_t round, uint32_t child, uint32_t chunk,
                                                   float base = 1.0f) {
    const std::vector<float> v = values(chunk, base);
    std::vector<uint8_t> bytes(fp32.encoded_size(v.size()));
    fp32.encode(v.data(), v.size(), nullptr, bytes.data());
    return acc.add(round, child, chunk, plan.size(chunk), weight_of(child), fp32, bytes.data(),
                   bytes.size());
  }
};

TEST_F(RoundAccumulatorQuorumTest, ChunkIsReadyOnlyOnceEveryExpectedChildDelivered) {
  acc.open(0);
  EXPECT_FALSE(add_result(0, kA, 0).chunk_complete);
  EXPECT_FALSE(add_result(0, kB, 0).chunk_complete);
  EXPECT_TRUE(acc.ready_chunks().empty());
  const aggregation::RoundAccumulator::Result last = add_result(0, kC, 0);
  EXPECT_EQ(last.outcome, aggregation::AddOutcome::kAccepted);
  EXPECT_TRUE(last.chunk_complete);
  EXPECT_EQ(acc.ready_chunks(), Ids{0});
  EXPECT_DOUBLE_EQ(acc.chunk_weight(0), 6.0);
}

TEST_F(RoundAccumulatorQuorumTest, ChunkIsNotReadyBelowTheMinimumWeightEvenWithEveryoneIn) {
  acc.open(0, kMinWeight);
  acc.set_expected(kC, false);  // the heaviest child is lost
  add(0, kA, 0);
  EXPECT_FALSE(add_result(0, kB, 0).chunk_complete);  // 3 < 3.6: every expected child is in
  EXPECT_TRUE(acc.ready_chunks().empty());
  EXPECT_TRUE(acc.quorate_chunks().empty());
  // A chunk with the weight behind it is ready as soon as the expected are in.
  acc.set_expected(kC, true);
  acc.set_expected(kA, false);
  add(0, kB, 1);
  EXPECT_TRUE(add_result(0, kC, 1).chunk_complete);
  EXPECT_EQ(acc.ready_chunks(), Ids{1});
}

TEST_F(RoundAccumulatorQuorumTest, LosingAChildMakesTheChunksTheOthersDeliveredReady) {
  acc.open(2);
  for (uint32_t c : {0u, 1u}) {
    add(2, kA, c);
    add(2, kC, c);
  }
  add(2, kA, 2);
  EXPECT_TRUE(acc.ready_chunks().empty());
  EXPECT_EQ(acc.missing_children(), (Ids{kB, kC}));  // kA delivered every chunk

  acc.set_expected(kB, false);
  EXPECT_FALSE(acc.expected(kB));
  EXPECT_TRUE(acc.expected(kA));
  EXPECT_FALSE(acc.expected(12345));           // not a child
  EXPECT_EQ(acc.ready_chunks(), (Ids{0, 1}));  // chunk 2 still lacks kC
  EXPECT_EQ(acc.missing_children(), Ids{kC});  // a lost child is not waited for

  // The lost child comes back before anything was taken: it is waited for again.
  acc.set_expected(kB, true);
  EXPECT_TRUE(acc.ready_chunks().empty());
  EXPECT_THROW(acc.set_expected(12345, false), Error);
}

TEST_F(RoundAccumulatorQuorumTest, AtADeadlineOnlyChunksWithTheMinimumWeightAreQuorate) {
  acc.open(0, kMinWeight);
  add(0, kB, 0);
  add(0, kC, 0);  // 5
  add(0, kA, 1);
  add(0, kB, 1);  // 3
  add(0, kC, 2);  // 3
  // Nothing is ready (kA is still expected for chunk 0) ...
  EXPECT_TRUE(acc.ready_chunks().empty());
  // ... but at a deadline chunk 0 may close without it.
  EXPECT_EQ(acc.quorate_chunks(), Ids{0});
  acc.take(0);
  EXPECT_TRUE(acc.quorate_chunks().empty());
  EXPECT_TRUE(acc.chunk_taken(0));
  EXPECT_FALSE(acc.chunk_taken(1));
  // More weight arriving makes a chunk quorate.
  add(0, kC, 1);
  EXPECT_EQ(acc.quorate_chunks(), Ids{1});
  // A closed accumulator has nothing quorate.
  aggregation::RoundAccumulator closed(plan, {kA});
  EXPECT_TRUE(closed.quorate_chunks().empty());
  EXPECT_TRUE(closed.ready_chunks().empty());
}

TEST_F(RoundAccumulatorQuorumTest, ExactlyTheMinimumWeightIsEnough) {
  acc.open(0, 3.0);
  add(0, kA, 0);
  add(0, kB, 0);  // 1 + 2
  EXPECT_EQ(acc.quorate_chunks(), Ids{0});
  acc.set_expected(kC, false);
  EXPECT_EQ(acc.ready_chunks(), Ids{0});
}

TEST_F(RoundAccumulatorQuorumTest, LateArrivalForATakenChunkIsStaleWhileOtherChunksAcceptIt) {
  acc.open(4, kMinWeight);
  add(4, kB, 0);
  add(4, kC, 0);
  const aggregation::ChunkSum closed = acc.take(0);
  const size_t in_flight = acc.chunks_in_flight();

  EXPECT_EQ(add(4, kA, 0, 100.0f), aggregation::AddOutcome::kStale);
  EXPECT_EQ(acc.chunks_in_flight(), in_flight);  // no accumulator came back for it
  EXPECT_TRUE(acc.chunk_taken(0));
  EXPECT_EQ(acc.contributors(0), (Ids{kB, kC}));  // the late child was not counted
  // The same child's other chunks of the round still count.
  EXPECT_EQ(add(4, kA, 1), aggregation::AddOutcome::kAccepted);
  EXPECT_DOUBLE_EQ(acc.chunk_weight(1), 1.0);
  EXPECT_EQ(add(4, kA, 2), aggregation::AddOutcome::kAccepted);
  EXPECT_DOUBLE_EQ(closed.weight, 5.0);
}

TEST_F(RoundAccumulatorQuorumTest, DuplicatesStayDuplicatesBeforeAndAfterTheChunkCloses) {
  acc.open(1, kMinWeight);
  EXPECT_EQ(add(1, kB, 0), aggregation::AddOutcome::kAccepted);
  EXPECT_EQ(add(1, kB, 0, 50.0f), aggregation::AddOutcome::kDuplicate);
  add(1, kC, 0);
  EXPECT_DOUBLE_EQ(acc.chunk_weight(0), 5.0);  // the duplicate added no weight
  acc.take(0);
  // A resend of a counted chunk is a duplicate, not stale: it was counted.
  EXPECT_EQ(add(1, kB, 0), aggregation::AddOutcome::kDuplicate);
  EXPECT_EQ(add(1, kC, 0), aggregation::AddOutcome::kDuplicate);
  // One that was never counted is stale.
  EXPECT_EQ(add(1, kA, 0), aggregation::AddOutcome::kStale);
  // And once the round is over, everything of it is stale.
  acc.open(2);
  EXPECT_EQ(add(1, kB, 1), aggregation::AddOutcome::kStale);
}

TEST_F(RoundAccumulatorQuorumTest, ContributorsAreTheChildrenWhoseChunkIsIn) {
  acc.open(0);
  EXPECT_TRUE(acc.contributors(0).empty());
  add(0, kC, 0);
  add(0, kA, 0);
  add(0, kB, 1);
  EXPECT_EQ(acc.contributors(0), (Ids{kA, kC}));  // in child order, not arrival order
  EXPECT_EQ(acc.contributors(1), Ids{kB});
  EXPECT_TRUE(acc.contributors(2).empty());
  // A refused arrival is a delivery (nobody waits for it again), with its
  // weight excused.
  std::vector<uint8_t> junk(8, 0xff);  // fp32 NaNs
  EXPECT_EQ(acc.add(0, kA, 2, 2, 1.0, fp32, junk.data(), junk.size()).outcome,
            aggregation::AddOutcome::kRefused);
  EXPECT_EQ(acc.contributors(2), Ids{kA});
}

TEST_F(RoundAccumulatorQuorumTest, DeliveredCountsAndMissingChunksNameWhatAChildOwes) {
  acc.open(0, kMinWeight);
  EXPECT_EQ(acc.delivered(kA), 0u);
  EXPECT_EQ(acc.missing_chunks(kA), (std::vector<uint32_t>{0, 1, 2}));
  add(0, kA, 1);
  EXPECT_EQ(acc.delivered(kA), 1u);
  EXPECT_EQ(acc.missing_chunks(kA), (std::vector<uint32_t>{0, 2}));
  add(0, kA, 1);  // a duplicate counts once
  EXPECT_EQ(acc.delivered(kA), 1u);
  add(0, kB, 0);
  add(0, kC, 0);
  acc.take(0);  // closed without kA: it owes nothing there any more
  EXPECT_EQ(acc.missing_chunks(kA), std::vector<uint32_t>{2});
  EXPECT_EQ(acc.delivered(kA), 1u);
  EXPECT_EQ(acc.delivered(12345), 0u);  // not a child
  EXPECT_TRUE(acc.missing_chunks(12345).empty());
  acc.open(1, kMinWeight);  // a new round starts from nothing
  EXPECT_EQ(acc.delivered(kA), 0u);
  EXPECT_EQ(acc.missing_chunks(kA).size(), 3u);
}

TEST_F(RoundAccumulatorQuorumTest, DeliveredAllCountsOnlyChunksStillOpen) {
  acc.open(0, kMinWeight);
  EXPECT_FALSE(acc.delivered_all(kA));
  add(0, kB, 0);
  add(0, kC, 0);
  add(0, kA, 1);
  add(0, kA, 2);
  EXPECT_FALSE(acc.delivered_all(kA));  // chunk 0 is still open and lacks it
  acc.take(0);
  EXPECT_TRUE(acc.delivered_all(kA));  // it owes nothing to a closed chunk
  EXPECT_FALSE(acc.delivered_all(kB));
  add(0, kB, 1);
  add(0, kB, 2);
  EXPECT_TRUE(acc.delivered_all(kB));
  EXPECT_FALSE(acc.delivered_all(12345));  // not a child
  aggregation::RoundAccumulator closed(plan, {kA});
  EXPECT_FALSE(closed.delivered_all(kA));  // no round open
}

TEST_F(RoundAccumulatorQuorumTest, OpenResetsExpectationsArrivalsAndTheMinimumWeight) {
  acc.open(0, 100.0);
  acc.set_expected(kA, false);
  acc.set_expected(kC, false);
  add(0, kB, 0);
  acc.open(1);
  EXPECT_TRUE(acc.expected(kA));
  EXPECT_TRUE(acc.expected(kC));
  EXPECT_EQ(acc.chunks_in_flight(), 0u);
  EXPECT_TRUE(acc.contributors(0).empty());
  EXPECT_EQ(acc.missing_children(), (Ids{kA, kB, kC}));
  // Minimum weight 0 again: the chunk closes with the weight of all three.
  add(1, kA, 0);
  add(1, kB, 0);
  EXPECT_TRUE(add_result(1, kC, 0).chunk_complete);
  // A chunk taken in the last round is open again.
  EXPECT_FALSE(acc.chunk_taken(0));
}

TEST_F(RoundAccumulatorQuorumTest, PartialChunkIsTheWeightedMeanOfExactlyItsContributors) {
  acc.open(0, kMinWeight);
  add(0, kA, 0, 1000.0f);  // kA is in for chunk 0 only, with values far from the others
  add(0, kB, 0, 2.0f);
  add(0, kC, 0, -3.5f);
  add(0, kB, 1, 2.0f);
  add(0, kC, 1, -3.5f);
  add(0, kB, 2, 2.0f);
  add(0, kC, 2, -3.5f);
  ASSERT_EQ(acc.quorate_chunks(), (Ids{0, 1, 2}));
  const aggregation::ChunkSum s = acc.take(1);  // closed without kA
  EXPECT_EQ(s.index, 1u);
  EXPECT_DOUBLE_EQ(s.weight, 5.0);
  const std::vector<float> b = values(1, 2.0f), c = values(1, -3.5f);
  ASSERT_EQ(s.mean.size(), b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_FLOAT_EQ(s.mean[i], (2.0f * b[i] + 3.0f * c[i]) / 5.0f) << i;
  }
  // Bit for bit what the root's replay computes from the same two updates.
  std::vector<float> expect(b.size(), 0.0f);
  accumulate_weighted(expect.data(), b.data(), b.size(), 2.0f);
  accumulate_weighted(expect.data(), c.data(), c.size(), 3.0f);
  aggregation::finalize_mean(expect.data(), expect.size(), 5.0);
  EXPECT_EQ(0, std::memcmp(expect.data(), s.mean.data(), expect.size() * sizeof(float)));
  // The late child's chunk 1 is now stale and changes nothing that was taken.
  EXPECT_EQ(add(0, kA, 1, 1000.0f), aggregation::AddOutcome::kStale);
  EXPECT_EQ(acc.missing_children(), Ids{kA});
}

TEST_F(RoundAccumulatorQuorumTest, RoundClosedAtADeadlineIsCompleteAndNamesTheMissing) {
  acc.open(3, kMinWeight);
  for (uint32_t c = 0; c < plan.count(); ++c) {
    add(3, kB, c);
    add(3, kC, c);
  }
  EXPECT_TRUE(acc.ready_chunks().empty());
  for (uint32_t c : acc.quorate_chunks()) acc.take(c);
  EXPECT_TRUE(acc.round_complete());
  EXPECT_EQ(acc.missing_children(), Ids{kA});
  EXPECT_TRUE(acc.quorate_chunks().empty());
  for (uint32_t c = 0; c < plan.count(); ++c)
    EXPECT_EQ(add(3, kA, c), aggregation::AddOutcome::kStale);
}

}  // namespace
}  // namespace fedwan
