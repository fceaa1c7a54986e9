#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "aggregation/round_accumulator.hpp"
#include "aggregation/update_screen.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "node/node_config.hpp"
#include "topology/aggregation_settings.hpp"

namespace fedwan {
namespace {

using aggregation::AddOutcome;
using aggregation::ScreenConfig;
using aggregation::UpdateScreen;
using aggregation::Verdict;

// A digest never seen before: these copies are no replays.
uint64_t fresh() {
  static uint64_t next = 1;
  return next++;
}

// fp32 bytes written by hand: the encoder refuses what a dishonest child sends.
std::vector<uint8_t> raw_fp32(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

ScreenConfig adaptive(double factor = 4, uint32_t window = 3, bool clip = false) {
  ScreenConfig c;
  c.replay_window = 0;
  c.norm = ScreenConfig::Norm::kAdaptive;
  c.factor = factor;
  c.window = window;
  c.clip = clip;
  return c;
}

TEST(AggregationSettings, ProblemsAreNamed) {
  AggregationSpec a;
  EXPECT_FALSE(topology::aggregation_problem(a));
  a.max_abs = -1;
  EXPECT_NE(topology::aggregation_problem(a)->find("max_abs"), std::string::npos);
  a = {};
  a.max_abs = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(topology::aggregation_problem(a));
  a = {};
  a.norm_bound.mode = "median";
  EXPECT_NE(topology::aggregation_problem(a)->find("adaptive, absolute or off"), std::string::npos);
  a = {};
  a.norm_bound.action = "drop";
  EXPECT_TRUE(topology::aggregation_problem(a));
  a = {};
  a.norm_bound.factor = 1;
  EXPECT_NE(topology::aggregation_problem(a)->find("> 1"), std::string::npos);
  a = {};
  a.norm_bound.window = 0;
  EXPECT_TRUE(topology::aggregation_problem(a));
  a.norm_bound.window = 65;
  EXPECT_TRUE(topology::aggregation_problem(a));
  a = {};
  a.replay_window = 1025;
  EXPECT_NE(topology::aggregation_problem(a)->find("replay_window"), std::string::npos);
  a = {};
  a.norm_bound.mode = "absolute";
  EXPECT_NE(topology::aggregation_problem(a)->find("bound"), std::string::npos);
  a.norm_bound.bound = 2.5;
  EXPECT_FALSE(topology::aggregation_problem(a));
  a = {};
  a.max_abs = -2;
  EXPECT_THROW(node::screen_config(a), ConfigError);
  // The defaults of the topology are the screen's.
  const ScreenConfig d = node::screen_config(AggregationSpec{});
  const ScreenConfig s;
  EXPECT_EQ(d.finite_check, s.finite_check);
  EXPECT_EQ(d.max_abs, s.max_abs);
  EXPECT_EQ(d.replay_window, s.replay_window);
  EXPECT_EQ(d.norm, s.norm);
  EXPECT_EQ(d.factor, s.factor);
  EXPECT_EQ(d.window, s.window);
  EXPECT_EQ(d.clip, s.clip);
}

TEST(UpdateScreen, NonFiniteAndHugeValuesAreRefusedWithTheElementNamed) {
  const tensor::ChunkPlan plan{8, 8};
  UpdateScreen screen(ScreenConfig{}, plan);
  std::vector<float> v(8, 0.5f);
  v[3] = std::numeric_limits<float>::quiet_NaN();
  auto r = screen.judge(0, 0, 0, fresh(), v.data(), 8);
  EXPECT_EQ(r.verdict, Verdict::kRefused);
  EXPECT_NE(r.reason.find("non-finite"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("element 3"), std::string::npos) << r.reason;
  v[3] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(screen.judge(0, 0, 0, fresh(), v.data(), 8).verdict, Verdict::kRefused);
  v[3] = 3e38f;  // finite, and a round later every site would diverge
  r = screen.judge(0, 0, 0, fresh(), v.data(), 8);
  EXPECT_EQ(r.verdict, Verdict::kRefused);
  EXPECT_NE(r.reason.find("max_abs"), std::string::npos) << r.reason;

  // Turned off, piece by piece.
  ScreenConfig no_bound = ScreenConfig::none();
  no_bound.finite_check = true;
  UpdateScreen finite_only(no_bound, plan);
  EXPECT_EQ(finite_only.judge(0, 0, 0, fresh(), v.data(), 8).verdict, Verdict::kAccepted);
  v[3] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(finite_only.judge(0, 0, 0, fresh(), v.data(), 8).verdict, Verdict::kRefused);
  UpdateScreen none(ScreenConfig::none(), plan);
  EXPECT_EQ(none.judge(0, 0, 0, fresh(), v.data(), 8).verdict, Verdict::kAccepted);
}

TEST(UpdateScreen, ACopyTheChildSentBeforeIsAReplay) {
  const tensor::ChunkPlan plan{4, 4};
  ScreenConfig c = ScreenConfig::none();
  c.replay_window = 2;
  UpdateScreen screen(c, plan);
  std::vector<float> v(4, 0.5f);
  EXPECT_EQ(screen.judge(0, 0, 1, 77, v.data(), 4).verdict, Verdict::kAccepted);
  EXPECT_EQ(screen.judge(0, 0, 2, 77, v.data(), 4).verdict, Verdict::kAccepted);  // another child
  auto r = screen.judge(2, 0, 1, 77, v.data(), 4);
  EXPECT_EQ(r.verdict, Verdict::kRefused);
  EXPECT_NE(r.reason.find("round 0 (a replay)"), std::string::npos) << r.reason;
  EXPECT_EQ(screen.judge(3, 0, 1, 78, v.data(), 4).verdict, Verdict::kAccepted);
  // Out of the window: round 0 is forgotten by round 3.
  EXPECT_EQ(screen.judge(3, 0, 2, 77, v.data(), 4).verdict, Verdict::kAccepted);
  // An all-zero copy (a frozen slice of the model) is the same every round.
  std::vector<float> zero(4, 0.0f);
  EXPECT_EQ(screen.judge(4, 0, 1, 5, zero.data(), 4).verdict, Verdict::kAccepted);
  EXPECT_EQ(screen.judge(5, 0, 1, 5, zero.data(), 4).verdict, Verdict::kAccepted);
  // The digest is the payload's.
  const std::vector<uint8_t> a = raw_fp32(v), b = raw_fp32(std::vector<float>(4, 0.25f));
  EXPECT_EQ(aggregation::payload_digest(a.data(), a.size()),
            aggregation::payload_digest(a.data(), a.size()));
  EXPECT_NE(aggregation::payload_digest(a.data(), a.size()),
            aggregation::payload_digest(b.data(), b.size()));
  // From the caller's SHA-256 of the payload (its audit log's): the same
  // for the same payload, different for another.
  EXPECT_EQ(aggregation::payload_digest(sha256(a.data(), a.size())),
            aggregation::payload_digest(sha256(a.data(), a.size())));
  EXPECT_NE(aggregation::payload_digest(sha256(a.data(), a.size())),
            aggregation::payload_digest(sha256(b.data(), b.size())));
}

TEST(UpdateScreen, TheNormIsTheSameBitsOnTheVectorAndScalarPaths) {
  std::vector<float> v(10000);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(std::sin(static_cast<double>(i) * 0.37) *
                              std::pow(10.0, static_cast<int>(i % 7) - 3));
  }
  for (const size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{999},
                         size_t{4095}, size_t{4096}, size_t{4097}, size_t{8207}, size_t{10000}}) {
    const double fast = aggregation::l2_norm(v.data(), n);
    const double plain = aggregation::l2_norm_scalar(v.data(), n);
    EXPECT_EQ(std::memcmp(&fast, &plain, sizeof fast), 0) << n << ": " << fast << " " << plain;
    double seq = 0;
    for (size_t i = 0; i < n; ++i) seq += static_cast<double>(v[i]) * v[i];
    EXPECT_NEAR(fast, std::sqrt(seq), 1e-12 * std::sqrt(seq) + 1e-300) << n;
  }
}

TEST(UpdateScreen, AValueProblemIsNamedWhereverItIsInTheChunk) {
  const tensor::ChunkPlan plan{64, 64};
  ScreenConfig c = ScreenConfig::none();
  c.finite_check = true;
  c.max_abs = 100;
  for (const size_t at : {size_t{0}, size_t{7}, size_t{33}, size_t{63}}) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity(), 100.5f, -1e30f}) {
      UpdateScreen screen(c, plan);
      std::vector<float> v(64, 99.0f);
      v[at] = bad;
      const auto r = screen.judge(0, 0, 0, 1, v.data(), 64);
      EXPECT_EQ(r.verdict, Verdict::kRefused) << at << " " << bad;
      EXPECT_NE(r.reason.find("at element " + std::to_string(at)), std::string::npos) << r.reason;
    }
  }
  UpdateScreen screen(c, plan);
  std::vector<float> fine(64, -100.0f);  // at the bound is within it
  EXPECT_EQ(screen.judge(0, 0, 0, 1, fine.data(), 64).verdict, Verdict::kAccepted);
  // A chunk of many stretches (the largest value is found with the norm,
  // a few thousand values at a time): anywhere in it, the last included.
  const uint32_t n = 9001;
  const tensor::ChunkPlan large{n, n};
  for (const size_t at : {size_t{4095}, size_t{4096}, size_t{8500}, size_t{9000}}) {
    UpdateScreen s(c, large);
    std::vector<float> v(n, 1.0f);
    v[at] = std::numeric_limits<float>::infinity();
    const auto r = s.judge(0, 0, 0, 1, v.data(), n);
    EXPECT_EQ(r.verdict, Verdict::kRefused) << at;
    EXPECT_NE(r.reason.find("at element " + std::to_string(at)), std::string::npos) << r.reason;
  }
  UpdateScreen s(c, large);
  const std::vector<float> ones(n, 1.0f);
  std::vector<float> copy = ones;
  const auto ok = s.judge(0, 0, 0, 1, copy.data(), n);
  EXPECT_EQ(ok.verdict, Verdict::kAccepted);
  EXPECT_EQ(ok.norm, aggregation::l2_norm_scalar(ones.data(), n));
}

TEST(UpdateScreen, AnAbsoluteBoundIsSharedOutOverTheChunksBySize) {
  const tensor::ChunkPlan plan{16, 12};  // chunks of 12 and 4
  ScreenConfig c = ScreenConfig::none();
  c.norm = ScreenConfig::Norm::kAbsolute;
  c.bound = 2.0;
  UpdateScreen refuse(c, plan);
  EXPECT_DOUBLE_EQ(*refuse.bound(0, 0), 2.0 * std::sqrt(12.0 / 16.0));
  EXPECT_DOUBLE_EQ(*refuse.bound(0, 1), 2.0 * std::sqrt(4.0 / 16.0));
  std::vector<float> small(4, 0.25f);  // norm 0.5: at the bound
  EXPECT_EQ(refuse.judge(0, 1, 0, fresh(), small.data(), 4).verdict, Verdict::kAccepted);
  std::vector<float> big(4, 1.0f);  // norm 2
  auto r = refuse.judge(0, 1, 0, fresh(), big.data(), 4);
  EXPECT_EQ(r.verdict, Verdict::kRefused);
  EXPECT_DOUBLE_EQ(r.norm, 2.0);
  EXPECT_DOUBLE_EQ(r.bound, 1.0);

  c.clip = true;
  UpdateScreen clip(c, plan);
  r = clip.judge(0, 1, 0, fresh(), big.data(), 4);
  EXPECT_EQ(r.verdict, Verdict::kClipped);
  EXPECT_DOUBLE_EQ(r.scale, 0.5);
  EXPECT_NEAR(aggregation::l2_norm(big.data(), 4), 1.0, 1e-6);  // scaled in place
}

TEST(UpdateScreen, TheAdaptiveBoundFollowsTheMedianOfRecentAcceptedNorms) {
  const tensor::ChunkPlan plan{4, 4};
  UpdateScreen screen(adaptive(4, 2), plan);
  std::vector<float> v(4, 0.5f);  // norm 1
  // No history: the copy is held, to be judged with its round's others.
  EXPECT_TRUE(screen.holds(0, 0));
  EXPECT_EQ(screen.judge(0, 0, 0, fresh(), v.data(), 4).verdict, Verdict::kDeferred);
  for (double n : {1.0, 2.0, 3.0}) screen.remember(0, 0, n);
  EXPECT_FALSE(screen.holds(1, 0));
  EXPECT_DOUBLE_EQ(*screen.bound(1, 0), 8.0);  // 4 x median {1, 2, 3}
  std::vector<float> at(4, 4.0f);              // norm 8
  EXPECT_EQ(screen.judge(1, 0, 0, fresh(), at.data(), 4).verdict, Verdict::kAccepted);
  std::vector<float> over(4, 4.01f);  // a suspect: judged with the round's others
  const auto suspect = screen.judge(1, 0, 0, fresh(), over.data(), 4);
  EXPECT_EQ(suspect.verdict, Verdict::kDeferred);
  EXPECT_DOUBLE_EQ(suspect.bound, 8.0);
  // A round's own norms never judge that round.
  screen.remember(1, 0, 100.0);
  EXPECT_DOUBLE_EQ(*screen.bound(1, 0), 8.0);
  EXPECT_DOUBLE_EQ(*screen.bound(2, 0), 4 * 2.5);  // median {1, 2, 3, 100}
  // The window: round 0 no longer counts for round 3, round 1 does.
  EXPECT_DOUBLE_EQ(*screen.bound(3, 0), 400.0);
  // Nothing remembered within the window: held again.
  EXPECT_TRUE(screen.holds(4, 0));
}

TEST(UpdateScreen, HeldCopiesAreJudgedAgainstTheirOwnMedian) {
  const tensor::ChunkPlan plan{2, 2};
  UpdateScreen screen(adaptive(4), plan);
  std::vector<aggregation::HeldCopy> held = {
      {0, 1, 1.0, {1, 0}}, {1, 1, 1.2, {1.2f, 0}}, {2, 1, 0.9, {0.9f, 0}}, {3, 1, 1000, {1000, 0}}};
  const auto verdicts = screen.judge_held(held);
  ASSERT_EQ(verdicts.size(), 4u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(verdicts[i].verdict, Verdict::kAccepted) << i;
  EXPECT_EQ(verdicts[3].verdict, Verdict::kRefused);
  EXPECT_DOUBLE_EQ(verdicts[3].bound, 4 * 1.0);  // the lower median of {0.9, 1, 1.2, 1000}
  // Of two copies, the larger is the suspect.
  std::vector<aggregation::HeldCopy> two = {{0, 1, 1.0, {1, 0}}, {1, 1, 1e3, {1e3, 0}}};
  const auto pair = screen.judge_held(two);
  EXPECT_EQ(pair[0].verdict, Verdict::kAccepted);
  EXPECT_EQ(pair[1].verdict, Verdict::kRefused);
  std::vector<aggregation::HeldCopy> close = {{0, 1, 1.0, {1, 0}}, {1, 1, 3.9, {3.9f, 0}}};
  for (const auto& v : screen.judge_held(close)) EXPECT_EQ(v.verdict, Verdict::kAccepted);
}

class ScreenedAccumulator : public ::testing::Test {
 protected:
  const Codec& fp32 = codec_by_name("fp32");
  tensor::ChunkPlan plan{8, 4};  // two chunks of 4

  AddOutcome add(aggregation::RoundAccumulator& acc, uint32_t sender, uint32_t chunk, float value,
                 double weight = 1.0) {
    const auto bytes = raw_fp32(std::vector<float>(plan.size(chunk), value));
    return acc
        .add(acc.round(), sender, chunk, plan.size(chunk), weight, fp32, bytes.data(), bytes.size())
        .outcome;
  }
};

TEST_F(ScreenedAccumulator, AScaledUpdateIsRefusedInTheFirstRoundAndStreamedAfter) {
  aggregation::RoundAccumulator acc(plan, {1, 2, 3, 4}, nullptr, adaptive());
  acc.open(0, 4 * (1 - 1e-9));  // every child's weight, as a quorum of 1.0 asks
  EXPECT_EQ(add(acc, 4, 0, 1e3f), AddOutcome::kAccepted);  // held: judged at the close
  for (uint32_t s : {1u, 2u, 3u}) EXPECT_EQ(add(acc, s, 0, 1.0f + 0.1f * s), AddOutcome::kAccepted);
  EXPECT_EQ(acc.ready_chunks(), std::vector<uint32_t>{0});
  EXPECT_EQ(acc.bytes_in_flight(), 4 * 4 * sizeof(float));  // four copies held
  aggregation::ChunkSum sum = acc.take(0);
  EXPECT_EQ(sum.weight, 3.0);
  EXPECT_EQ(sum.excused, 1.0);
  EXPECT_EQ(sum.behind, (std::vector<uint32_t>{1, 2, 3}));
  ASSERT_EQ(sum.late.size(), 4u);
  EXPECT_EQ(sum.late[3].sender, 4u);
  EXPECT_EQ(sum.late[3].verdict.verdict, Verdict::kRefused);
  for (float x : sum.mean) EXPECT_NEAR(x, 1.2f, 1e-6f);

  // Round 1: the bound is known; the honest copies stream, the one over it
  // is held as a suspect and refused when the chunk closes (one of four).
  acc.open(1, 4 * (1 - 1e-9));
  for (uint32_t s : {1u, 2u, 3u}) EXPECT_EQ(add(acc, s, 0, 1.0f), AddOutcome::kAccepted);
  EXPECT_EQ(acc.bytes_in_flight(), 4 * sizeof(float));         // streamed: one sum
  const auto bytes = raw_fp32(std::vector<float>(4, -10.0f));  // sign flipped, x10
  const auto r = acc.add(1, 4, 0, 4, 1.0, fp32, bytes.data(), bytes.size());
  EXPECT_EQ(r.outcome, AddOutcome::kAccepted);
  EXPECT_EQ(r.verdict.verdict, Verdict::kDeferred);
  EXPECT_TRUE(r.chunk_complete);
  EXPECT_EQ(acc.bytes_in_flight(), 2 * 4 * sizeof(float));  // the sum and the suspect
  sum = acc.take(0);
  EXPECT_EQ(sum.weight, 3.0);
  EXPECT_EQ(sum.excused, 1.0);
  ASSERT_EQ(sum.late.size(), 1u);
  EXPECT_EQ(sum.late[0].verdict.verdict, Verdict::kRefused);
  EXPECT_NE(sum.late[0].verdict.reason.find("over the bound"), std::string::npos);
  for (float x : sum.mean) EXPECT_EQ(x, 1.0f);
}

TEST_F(ScreenedAccumulator, WhenMostCopiesAreOverTheBoundTheBoundIsStale) {
  // One child alone (a root over one region) is never judged by its past.
  aggregation::RoundAccumulator one(plan, {1}, nullptr, adaptive());
  one.open(0);
  add(one, 1, 0, 1.0f);
  one.take(0);
  one.open(1);
  add(one, 1, 0, 50.0f);  // 50 x its norm of round 0: the model moved, a site joined
  aggregation::ChunkSum sum = one.take(0);
  EXPECT_EQ(sum.weight, 1.0);
  ASSERT_EQ(sum.late.size(), 1u);
  EXPECT_EQ(sum.late[0].verdict.verdict, Verdict::kAccepted);
  EXPECT_NE(sum.late[0].verdict.reason.find("stale"), std::string::npos);
  for (float x : sum.mean) EXPECT_EQ(x, 50.0f);
  // and the bound follows: 50 is the history now.
  one.open(2);
  add(one, 1, 0, 60.0f);
  EXPECT_TRUE(one.take(0).late.empty());

  // Two of three over it: stale too; one of two: refused.
  aggregation::RoundAccumulator three(plan, {1, 2, 3}, nullptr, adaptive());
  three.open(0);
  for (uint32_t s : {1u, 2u, 3u}) add(three, s, 0, 1.0f);
  three.take(0);
  three.open(1);
  add(three, 1, 0, 1.0f);
  add(three, 2, 0, 20.0f);
  add(three, 3, 0, 20.0f);
  sum = three.take(0);
  EXPECT_EQ(sum.weight, 3.0);
  EXPECT_EQ(sum.excused, 0.0);
  aggregation::RoundAccumulator two(plan, {1, 2}, nullptr, adaptive());
  two.open(0);
  for (uint32_t s : {1u, 2u}) add(two, s, 0, 1.0f);
  two.take(0);
  two.open(1);
  add(two, 1, 0, 1.0f);
  add(two, 2, 0, 20.0f);
  sum = two.take(0);
  EXPECT_EQ(sum.weight, 1.0);
  EXPECT_EQ(sum.excused, 1.0);
}

TEST_F(ScreenedAccumulator, HeldCopiesCombineInSlotOrderWhateverTheArrivalOrder) {
  aggregation::RoundAccumulator a(plan, {1, 2, 3}, nullptr, adaptive());
  aggregation::RoundAccumulator b(plan, {1, 2, 3}, nullptr, adaptive());
  a.open(0);
  b.open(0);
  const float v[] = {0.1f, 0.7f, 0.3f};
  for (uint32_t s : {1u, 2u, 3u}) add(a, s, 1, v[s - 1], 0.3 * s);
  for (uint32_t s : {3u, 1u, 2u}) add(b, s, 1, v[s - 1], 0.3 * s);
  const auto ma = a.take(1).mean;
  const auto mb = b.take(1).mean;
  EXPECT_EQ(std::memcmp(ma.data(), mb.data(), ma.size() * sizeof(float)), 0);
}

TEST_F(ScreenedAccumulator, ClippingScalesTheCopyToTheBound) {
  aggregation::RoundAccumulator acc(plan, {1, 2, 3}, nullptr, adaptive(2, 3, true));
  acc.open(0);
  for (uint32_t s : {1u, 2u, 3u}) add(acc, s, 0, 1.0f);  // norms 2: history
  acc.take(0);
  acc.open(1);
  add(acc, 1, 0, 1.0f);
  add(acc, 2, 0, 1.0f);
  const auto bytes = raw_fp32(std::vector<float>(4, 100.0f));  // norm 200, bound 4
  const auto r = acc.add(1, 3, 0, 4, 1.0, fp32, bytes.data(), bytes.size());
  EXPECT_EQ(r.outcome, AddOutcome::kAccepted);
  EXPECT_EQ(r.verdict.verdict, Verdict::kDeferred);  // a suspect, clipped at the close
  const aggregation::ChunkSum sum = acc.take(0);
  ASSERT_EQ(sum.late.size(), 1u);
  EXPECT_EQ(sum.late[0].verdict.verdict, Verdict::kClipped);
  EXPECT_DOUBLE_EQ(sum.late[0].verdict.scale, 0.02);
  EXPECT_EQ(sum.weight, 3.0);
  EXPECT_EQ(sum.excused, 0.0);
  for (float x : sum.mean) EXPECT_NEAR(x, (1.0f + 1.0f + 2.0f) / 3.0f, 1e-6f);
}

TEST_F(ScreenedAccumulator, ARegionsExcusedWeightCountsAsDeliveredAndStandsBehindNothing) {
  aggregation::RoundAccumulator acc(plan, {1, 2}, nullptr, ScreenConfig{});
  acc.open(0, 5 * (1 - 1e-9));
  // Region 1: two of its sites' copies stood behind its values, one was refused there.
  const auto bytes = raw_fp32(std::vector<float>(4, 1.0f));
  auto r = acc.add(0, 1, 0, 4, 2.0, fp32, bytes.data(), bytes.size(), 1.0);
  EXPECT_EQ(r.outcome, AddOutcome::kAccepted);
  // Region 2: every copy refused there.
  r = acc.add(0, 2, 0, 4, 0.0, fp32, nullptr, 0, 2.0);
  EXPECT_EQ(r.outcome, AddOutcome::kRefused);
  EXPECT_TRUE(r.chunk_complete);  // 2 + 1 + 2 delivered: the quorum is met
  EXPECT_EQ(acc.chunk_weight(0), 5.0);
  const aggregation::ChunkSum sum = acc.take(0);
  EXPECT_EQ(sum.weight, 2.0);
  EXPECT_EQ(sum.excused, 3.0);
  // No values without excused weight, and no excused weight that is not a number.
  EXPECT_EQ(acc.add(0, 1, 1, 4, 0.0, fp32, nullptr, 0, 0.0).outcome, AddOutcome::kBadPayload);
  EXPECT_EQ(acc.add(0, 1, 1, 4, 1.0, fp32, bytes.data(), bytes.size(), std::nan("")).outcome,
            AddOutcome::kBadPayload);
  EXPECT_EQ(acc.add(0, 1, 1, 4, 1.0, fp32, nullptr, 0, 1.0).outcome, AddOutcome::kBadPayload);
}

TEST_F(ScreenedAccumulator, AChunkWhoseEveryCopyWasRefusedClosesEmpty) {
  aggregation::RoundAccumulator acc(plan, {1, 2}, nullptr, ScreenConfig{});
  acc.open(0, 2 * (1 - 1e-9));
  std::vector<float> v(4, 1.0f);
  v[0] = std::numeric_limits<float>::infinity();
  for (uint32_t s : {1u, 2u}) {
    const auto bytes = raw_fp32(v);
    EXPECT_EQ(acc.add(0, s, 0, 4, 1.0, fp32, bytes.data(), bytes.size()).outcome,
              AddOutcome::kRefused);
  }
  EXPECT_EQ(acc.ready_chunks(), std::vector<uint32_t>{0});
  EXPECT_TRUE(acc.owing_children().size() == 2);  // chunk 1 is still owed
  const aggregation::ChunkSum sum = acc.take(0);
  EXPECT_TRUE(sum.mean.empty());
  EXPECT_EQ(sum.weight, 0.0);
  EXPECT_EQ(sum.excused, 2.0);
  EXPECT_TRUE(sum.behind.empty());
}

}  // namespace
}  // namespace fedwan
