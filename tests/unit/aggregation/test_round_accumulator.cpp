#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "aggregation/round_accumulator.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"

#include <limits>

namespace fedwan {
namespace {

std::vector<uint8_t> encode_fp32(const std::vector<float>& v) {
  const Codec& c = codec_by_name("fp32");
  std::vector<uint8_t> out(c.encoded_size(v.size()));
  c.encode(v.data(), v.size(), nullptr, out.data());
  return out;
}

class RoundAccumulatorTest : public ::testing::Test {
 protected:
  const Codec& fp32 = codec_by_name("fp32");
  tensor::ChunkPlan plan{10, 4};  // chunks of 4, 4, 2
  aggregation::RoundAccumulator acc{plan, {7, 9}};

  aggregation::RoundAccumulator::Result add(uint64_t round, uint32_t sender, uint32_t chunk,
                                            float value, double weight) {
    std::vector<float> v(plan.size(chunk), value);
    const auto bytes = encode_fp32(v);
    return acc.add(round, sender, chunk, plan.size(chunk), weight, fp32, bytes.data(),
                   bytes.size());
  }
};

TEST_F(RoundAccumulatorTest, WeightedMeanOfTwoChildren) {
  acc.open(3);
  EXPECT_FALSE(add(3, 7, 1, 1.0f, 1.0).chunk_complete);
  EXPECT_EQ(acc.chunks_in_flight(), 1u);
  auto r = add(3, 9, 1, 4.0f, 3.0);
  EXPECT_EQ(r.outcome, aggregation::AddOutcome::kAccepted);
  EXPECT_TRUE(r.chunk_complete);
  aggregation::ChunkSum s = acc.take(1);
  EXPECT_EQ(s.weight, 4.0);
  for (float x : s.mean) EXPECT_FLOAT_EQ(x, (1.0f * 1 + 4.0f * 3) / 4);
  // The chunk's accumulator is released as soon as it is taken.
  EXPECT_EQ(acc.chunks_in_flight(), 0u);
  EXPECT_FALSE(acc.round_complete());
}

// Finite copies whose weighted mean overflows fp32 (possible only without
// max_abs): the chunk is an error naming the cause, never a model with an
// Inf in it, wherever in the chunk the overflow lands.
TEST_F(RoundAccumulatorTest, AMeanThatOverflowsIsAnErrorNotAModel) {
  for (size_t at = 0; at < plan.size(0); ++at) {
    acc.open(at);
    std::vector<float> v(plan.size(0), 1.0f);
    v[at] = 3e38f;
    const auto bytes = encode_fp32(v);
    ASSERT_EQ(acc.add(at, 7, 0, plan.size(0), 1.0, fp32, bytes.data(), bytes.size()).outcome,
              aggregation::AddOutcome::kAccepted);
    ASSERT_TRUE(
        acc.add(at, 9, 0, plan.size(0), 1.0, fp32, bytes.data(), bytes.size()).chunk_complete);
    try {
      acc.take(0);
      FAIL() << "an overflowed mean was taken (element " << at << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("overflows fp32"), std::string::npos) << e.what();
    }
  }
}

// The mean's division, eight values at a time where the CPU can: each
// value divided as the scalar loop divides it, whatever the length.
TEST(FinalizeMean, DividesEveryValueAsOneDivisionDoes) {
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 1000, 100003}) {
    for (double w : {1.0, 3.0, 0.7, 1e-3, 12345.678}) {
      std::vector<float> sum(n), expect(n);
      for (size_t i = 0; i < n; ++i) {
        sum[i] = std::ldexp(std::sin(static_cast<float>(i) * 0.37f), static_cast<int>(i % 41) - 20);
        expect[i] = sum[i] / static_cast<float>(w);
      }
      aggregation::finalize_mean(sum.data(), n, w);
      // Bit for bit; an empty vector's null data is not memcmp's to read.
      ASSERT_TRUE(n == 0 || std::memcmp(sum.data(), expect.data(), n * sizeof(float)) == 0)
          << n << " " << w;
    }
  }
}

TEST_F(RoundAccumulatorTest, CountsEachSenderChunkOnce) {
  acc.open(0);
  EXPECT_EQ(add(0, 7, 0, 1.0f, 1.0).outcome, aggregation::AddOutcome::kAccepted);
  EXPECT_EQ(add(0, 7, 0, 100.0f, 1.0).outcome, aggregation::AddOutcome::kDuplicate);
  add(0, 9, 0, 3.0f, 1.0);
  aggregation::ChunkSum s = acc.take(0);
  EXPECT_FLOAT_EQ(s.mean[0], 2.0f);  // the duplicate left no trace
}

TEST_F(RoundAccumulatorTest, StaleFutureAndStrangers) {
  acc.open(5);
  EXPECT_EQ(add(4, 7, 0, 1.0f, 1.0).outcome, aggregation::AddOutcome::kStale);
  EXPECT_EQ(add(6, 7, 0, 1.0f, 1.0).outcome, aggregation::AddOutcome::kFuture);
  EXPECT_EQ(add(5, 8, 0, 1.0f, 1.0).outcome, aggregation::AddOutcome::kUnknownSender);
  EXPECT_EQ(acc.chunks_in_flight(), 0u);
}

TEST_F(RoundAccumulatorTest, RejectsChunksThatDisagreeWithThePlan) {
  acc.open(0);
  std::vector<float> v(3, 1.0f);
  auto bytes = encode_fp32(v);
  // Chunk 2 has 2 elements, not 3.
  EXPECT_EQ(acc.add(0, 7, 2, 3, 1.0, fp32, bytes.data(), bytes.size()).outcome,
            aggregation::AddOutcome::kBadChunk);
  EXPECT_EQ(acc.add(0, 7, 3, 2, 1.0, fp32, bytes.data(), bytes.size()).outcome,
            aggregation::AddOutcome::kBadChunk);
  EXPECT_EQ(acc.chunks_in_flight(), 0u);
}

TEST_F(RoundAccumulatorTest, RejectsBadWeightsWithoutATraceAndRefusesMalformedPayloads) {
  acc.open(0);
  std::vector<float> v(4, 1.0f);
  v[2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> nan_bytes(16);
  std::memcpy(nan_bytes.data(), v.data(), 16);
  EXPECT_EQ(add(0, 7, 0, 1.0f, 0.0).outcome, aggregation::AddOutcome::kBadPayload);
  EXPECT_EQ(add(0, 7, 0, 1.0f, -2.0).outcome, aggregation::AddOutcome::kBadPayload);
  EXPECT_EQ(add(0, 7, 0, 1.0f, std::numeric_limits<double>::infinity()).outcome,
            aggregation::AddOutcome::kBadPayload);
  EXPECT_EQ(acc.chunks_in_flight(), 0u);
  // The sender can still deliver the chunk properly afterwards.
  EXPECT_EQ(add(0, 7, 0, 1.0f, 1.0).outcome, aggregation::AddOutcome::kAccepted);
  // A payload the codec finds malformed (fp32 NaN) is refused, and it is a
  // delivery: the chunk does not wait for that child again.
  const auto r = acc.add(0, 9, 0, 4, 2.0, fp32, nan_bytes.data(), nan_bytes.size());
  EXPECT_EQ(r.outcome, aggregation::AddOutcome::kRefused);
  EXPECT_TRUE(r.chunk_complete);
  const aggregation::ChunkSum sum = acc.take(0);
  EXPECT_EQ(sum.weight, 1.0);
  EXPECT_EQ(sum.excused, 2.0);
  EXPECT_EQ(sum.behind, std::vector<uint32_t>{7});
  for (float x : sum.mean) EXPECT_EQ(x, 1.0f);
}

TEST_F(RoundAccumulatorTest, RoundCompletesWhenEveryChunkIsTakenAndReportsMissing) {
  acc.open(1);
  for (uint32_t c = 0; c < plan.count(); ++c) add(1, 7, c, 1.0f, 1.0);
  EXPECT_EQ(acc.missing_children(), std::vector<uint32_t>{9});
  for (uint32_t c = 0; c < plan.count(); ++c) {
    ASSERT_TRUE(add(1, 9, c, 1.0f, 1.0).chunk_complete);
    acc.take(c);
  }
  EXPECT_TRUE(acc.round_complete());
  EXPECT_TRUE(acc.missing_children().empty());
  EXPECT_THROW(acc.take(0), Error);
  acc.open(2);
  EXPECT_FALSE(acc.round_complete());
}

TEST_F(RoundAccumulatorTest, ArrivalOrderOfTwoChildrenDoesNotChangeBits) {
  const std::vector<float> a = {0.1f, 1e-7f, 3.3f, -2.5f}, b = {0.7f, 5e-8f, -1.1f, 9.0f};
  auto run = [&](bool a_first) {
    aggregation::RoundAccumulator r(tensor::ChunkPlan(4, 4), {1, 2});
    r.open(0);
    const auto ba = encode_fp32(a), bb = encode_fp32(b);
    if (a_first) {
      r.add(0, 1, 0, 4, 3.0, fp32, ba.data(), ba.size());
      r.add(0, 2, 0, 4, 7.0, fp32, bb.data(), bb.size());
    } else {
      r.add(0, 2, 0, 4, 7.0, fp32, bb.data(), bb.size());
      r.add(0, 1, 0, 4, 3.0, fp32, ba.data(), ba.size());
    }
    return r.take(0).mean;
  };
  const auto x = run(true), y = run(false);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), 16));
}

double norm_of(const std::vector<float>& v) {
  double sq = 0;
  for (float x : v) sq += static_cast<double>(x) * x;
  return std::sqrt(sq);
}

// Central privacy: the copies of the senders named are clipped to their
// chunk's share of the whole bound; the others are summed as they came.
TEST(RoundAccumulatorPrivacy, ClipsTheNamedSendersToTheirChunksShare) {
  const Codec& fp32 = codec_by_name("fp32");
  const tensor::ChunkPlan plan{16, 4};  // four chunks of 4
  aggregation::RoundAccumulator acc{plan, {1, 2}};
  acc.clip_copies_of(1, 2.0);  // whole update: 2; each chunk of 4 of 16: 1
  acc.open(0);
  std::vector<float> big(4, 3.0f);    // norm 6: clipped to 1
  std::vector<float> small(4, 0.1f);  // norm 0.2: as it is
  for (uint32_t chunk = 0; chunk < plan.count(); ++chunk) {
    const auto b = encode_fp32(chunk == 0 ? big : small);
    EXPECT_EQ(acc.add(0, 1, chunk, 4, 1.0, fp32, b.data(), b.size()).outcome,
              aggregation::AddOutcome::kAccepted);
    const auto other = encode_fp32(big);  // sender 2 is not clipped
    acc.add(0, 2, chunk, 4, 1.0, fp32, other.data(), other.size());
  }
  EXPECT_EQ(acc.privacy_clipped(), 1u);
  aggregation::ChunkSum s0 = acc.take(0);
  // (clipped(big) + big) / 2, coordinate by coordinate.
  for (float x : s0.mean) EXPECT_NEAR(x, (0.5f + 3.0f) / 2, 1e-5);
  aggregation::ChunkSum s1 = acc.take(1);
  for (float x : s1.mean) EXPECT_NEAR(x, (0.1f + 3.0f) / 2, 1e-6);
}

TEST(RoundAccumulatorPrivacy, AWholeUpdateStaysWithinTheBound) {
  const Codec& fp32 = codec_by_name("fp32");
  const tensor::ChunkPlan plan{10, 4};  // chunks of 4, 4 and 2
  aggregation::RoundAccumulator acc{plan, {5}};
  acc.clip_copies_of(5, 0.7);
  acc.open(0);
  std::vector<float> whole;
  for (uint32_t chunk = 0; chunk < plan.count(); ++chunk) {
    std::vector<float> v(plan.size(chunk));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(1.0 + i + chunk);
    const auto b = encode_fp32(v);
    acc.add(0, 5, chunk, plan.size(chunk), 1.0, fp32, b.data(), b.size());
    aggregation::ChunkSum s = acc.take(chunk);
    whole.insert(whole.end(), s.mean.begin(), s.mean.end());
  }
  EXPECT_LE(norm_of(whole), 0.7);
  EXPECT_GT(norm_of(whole), 0.7 * 0.99);
  EXPECT_EQ(acc.privacy_clipped(), 3u);
  EXPECT_THROW(acc.clip_copies_of(5, 0), ConfigError);
  EXPECT_THROW(acc.clip_copies_of(5, INFINITY), ConfigError);
}

// A NaN is still refused by the screen, never clipped into a number.
TEST(RoundAccumulatorPrivacy, TheScreenJudgesBeforeTheClip) {
  const Codec& fp32 = codec_by_name("fp32");
  const tensor::ChunkPlan plan{4, 4};
  aggregation::RoundAccumulator acc{plan, {1, 2}, nullptr, aggregation::ScreenConfig{}};
  acc.clip_copies_of(1, 1.0);
  acc.open(0);
  // fp32's payload is the values as they are: written by hand, as a
  // dishonest sender would (the encoder refuses a NaN).
  const std::vector<float> bad = {1, std::nanf(""), 1, 1};
  std::vector<uint8_t> b(bad.size() * sizeof(float));
  std::memcpy(b.data(), bad.data(), b.size());
  const auto r = acc.add(0, 1, 0, 4, 1.0, fp32, b.data(), b.size());
  EXPECT_EQ(r.outcome, aggregation::AddOutcome::kRefused);
  EXPECT_EQ(acc.privacy_clipped(), 0u);
}

// Adaptive clipping's count: a site counts itself (a valued copy, none
// clipped); a region's copies do not, its report of the sites below it
// does, the last report of the round standing; a new round starts over.
TEST(RoundAccumulatorPrivacy, CountsUnclippedSitesAndRegionsReports) {
  const Codec& fp32 = codec_by_name("fp32");
  const tensor::ChunkPlan plan{8, 4};  // two chunks of 4
  aggregation::RoundAccumulator acc{plan, {1, 2, 3, 9}};
  acc.clip_copies_of(1, 2.0);                           // a site, unclipped below
  acc.clip_copies_of(2, 2.0);                           // a site, clipped in its second chunk
  acc.clip_copies_of(3, 2.0);                           // a site that sends nothing
  acc.clip_copies_of(9, 2.0, /*counts_itself=*/false);  // a region
  acc.open(0);
  const auto small = encode_fp32(std::vector<float>(4, 0.1f));
  const auto big = encode_fp32(std::vector<float>(4, 5.0f));
  for (uint32_t chunk = 0; chunk < plan.count(); ++chunk) {
    acc.add(0, 1, chunk, 4, 1.0, fp32, small.data(), small.size());
    const auto& two = chunk == 1 ? big : small;
    acc.add(0, 2, chunk, 4, 1.0, fp32, two.data(), two.size());
    acc.add(0, 9, chunk, 4, 3.0, fp32, small.data(), small.size());
  }
  EXPECT_EQ(acc.privacy_unclipped_senders(), 1u);  // site 1; the region has not reported
  acc.report_unclipped(9, 5);
  acc.report_unclipped(9, 2);  // sent again: the last stands
  EXPECT_EQ(acc.privacy_unclipped_senders(), 3u);
  acc.take(0);
  acc.take(1);
  acc.open(1);
  EXPECT_EQ(acc.privacy_unclipped_senders(), 0u);
  // A region named a site again counts itself.
  acc.clip_copies_of(9, 2.0, true);
  acc.add(1, 9, 0, 4, 3.0, fp32, small.data(), small.size());
  EXPECT_EQ(acc.privacy_unclipped_senders(), 1u);
}

}  // namespace
}  // namespace fedwan
