#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "aggregation/robust_rules.hpp"
#include "aggregation/round_accumulator.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"

namespace fedwan {
namespace {

using aggregation::make_rule;

struct Given {
  uint32_t slot;
  double weight;
  std::vector<float> values;
};

aggregation::Combined combine(const std::string& rule, const aggregation::RuleParams& params,
                              const std::vector<Given>& copies) {
  auto r = make_rule(rule, params);
  EXPECT_EQ(r->memory(), aggregation::RuleMemory::kBuffered) << rule;
  auto c = r->begin_chunk(static_cast<uint32_t>(copies.front().values.size()), copies.size());
  for (const Given& g : copies) c->add(g.slot, g.values.data(), g.weight);
  EXPECT_EQ(c->bytes_held(), copies.size() * copies.front().values.size() * sizeof(float));
  return c->finish();
}

TEST(RobustRules, TheMedianIgnoresAnOutlierCoordinateByCoordinate) {
  const auto out = combine(
      "median", {},
      {{0, 1, {1, 10}}, {1, 1, {2, 30}}, {2, 1, {1e9f, 20}}, {3, 5, {3, -1e9f}}, {4, 1, {2, 25}}});
  EXPECT_EQ(out.values, (std::vector<float>{2, 20}));
  EXPECT_EQ(out.weight, 9.0);  // every copy stands behind a median
  EXPECT_TRUE(out.left_out.empty());
  // An even count: the mean of the two middle values.
  EXPECT_EQ(combine("median", {}, {{0, 1, {1}}, {1, 1, {3}}}).values, std::vector<float>{2});
}

TEST(RobustRules, TheTrimmedMeanDropsEachEndThenWeighsTheRest) {
  const std::vector<Given> copies = {
      {0, 1, {1}}, {1, 3, {2}}, {2, 1, {-1e6f}}, {3, 1, {4}}, {4, 1, {1e6f}}};
  auto out = combine("trimmed_mean", {}, copies);  // trim 1: drops -1e6 and 1e6
  EXPECT_FLOAT_EQ(out.values[0], (1 * 1 + 3 * 2 + 1 * 4) / 5.0f);
  out = combine("trimmed_mean", {{"trim", 2}}, copies);  // leaves the middle one
  EXPECT_FLOAT_EQ(out.values[0], 2.0f);
  // More trimmed than there are copies to spare: as many as leave one.
  out = combine("trimmed_mean", {{"trim", 9}}, {{0, 1, {1}}, {1, 1, {5}}, {2, 1, {100}}});
  EXPECT_FLOAT_EQ(out.values[0], 5.0f);
}

TEST(RobustRules, MultiKrumLeavesOutTheCopyFarFromTheOthers) {
  const std::vector<Given> copies = {{0, 1, {1.0f, 1.0f}},
                                     {1, 2, {1.1f, 0.9f}},
                                     {2, 1, {-5.0f, -5.0f}},  // sign flipped, scaled
                                     {3, 1, {0.9f, 1.1f}}};
  const auto out = combine("multi_krum", {{"byzantine", 1}}, copies);
  ASSERT_EQ(out.left_out.size(), 1u);
  EXPECT_EQ(out.left_out[0].slot, 2u);
  EXPECT_EQ(out.weight, 4.0);
  EXPECT_NEAR(out.values[0], (1.0f + 2 * 1.1f + 0.9f) / 4.0f, 1e-6f);
  // select: how many are kept.
  EXPECT_EQ(combine("multi_krum", {{"byzantine", 1}, {"select", 1}}, copies).left_out.size(), 3u);
  // A lone copy is kept.
  EXPECT_TRUE(combine("multi_krum", {}, {{0, 1, {3}}}).left_out.empty());
}

TEST(RobustRules, ParametersAreCheckedByTheRule) {
  EXPECT_THROW(make_rule("median", {{"trim", 1}}), ConfigError);
  EXPECT_THROW(make_rule("weighted_mean", {{"trim", 1}}), ConfigError);
  EXPECT_THROW(make_rule("trimmed_mean", {{"trim", 0}}), ConfigError);
  EXPECT_THROW(make_rule("trimmed_mean", {{"trim", 1.5}}), ConfigError);
  EXPECT_THROW(make_rule("multi_krum", {{"byzantine", -1}}), ConfigError);
  try {
    make_rule("multi_krum", {{"f", 1}});
    FAIL() << "an unknown parameter was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("byzantine, select"), std::string::npos) << e.what();
  }
}

TEST(RobustRules, UnderTheAccumulatorALeftOutCopyIsExcusedWeight) {
  const Codec& fp32 = codec_by_name("fp32");
  const tensor::ChunkPlan plan{2, 2};
  aggregation::RoundAccumulator acc(plan, {1, 2, 3, 4}, make_rule("multi_krum"));
  acc.open(0, 4 * (1 - 1e-9));
  const std::vector<std::vector<float>> v = {{1, 1}, {1.1f, 0.9f}, {0.9f, 1.1f}, {-5, -5}};
  for (uint32_t s = 0; s < 4; ++s) {
    std::vector<uint8_t> bytes(8);
    std::memcpy(bytes.data(), v[s].data(), 8);
    acc.add(0, s + 1, 0, 2, 1.0, fp32, bytes.data(), bytes.size());
  }
  EXPECT_EQ(acc.bytes_in_flight(), 4 * 2 * sizeof(float));
  const aggregation::ChunkSum sum = acc.take(0);
  EXPECT_EQ(sum.weight, 3.0);
  EXPECT_EQ(sum.excused, 1.0);
  EXPECT_EQ(sum.behind, (std::vector<uint32_t>{1, 2, 3}));
  ASSERT_EQ(sum.late.size(), 1u);
  EXPECT_EQ(sum.late[0].sender, 4u);
  EXPECT_NE(sum.late[0].verdict.reason.find("multi_krum"), std::string::npos);
}

}  // namespace
}  // namespace fedwan
