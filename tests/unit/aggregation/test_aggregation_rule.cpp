// The aggregation-rule seam: the weighted mean through it is the arithmetic
// it always was (bit for bit), the registry refuses what it must, and a
// second rule (a buffered coordinate-wise median, harness/median_rule.hpp)
// runs under RoundAccumulator with the same bookkeeping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "aggregation/aggregation_rule.hpp"
#include "aggregation/round_accumulator.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "harness/median_rule.hpp"

namespace fedwan {
namespace {

using aggregation::make_rule;

std::vector<uint8_t> encode(const Codec& c, const std::vector<float>& v) {
  std::vector<uint8_t> out(c.encoded_size(v.size()));
  c.encode(v.data(), v.size(), nullptr, out.data());
  return out;
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  // Empty vectors may hold no storage: memcmp is not given their null pointers.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(AggregationRule, WeightedMeanIsTheAccumulationItReplaced) {
  for (const char* name : {"fp32", "fp16", "bf16", "int8"}) {
    const Codec& codec = codec_by_name(name);
    for (size_t children : {1u, 2u, 5u}) {
      const uint32_t n = 3000;
      std::vector<std::vector<uint8_t>> payloads;
      std::vector<double> weights;
      for (size_t k = 0; k < children; ++k) {
        payloads.push_back(encode(codec, random_values(n, 11 + static_cast<uint32_t>(k))));
        weights.push_back(1.0 + 0.37 * static_cast<double>(k));
      }
      // What the accumulator did before the seam existed.
      std::vector<float> expected(n, 0.0f);
      double total = 0;
      for (size_t k = 0; k < children; ++k) {
        codec.decode_accumulate(payloads[k].data(), n, static_cast<float>(weights[k]),
                                expected.data());
        total += weights[k];
      }
      aggregation::finalize_mean(expected.data(), n, total);

      auto rule = make_rule(aggregation::kWeightedMean);
      EXPECT_EQ(rule->memory(), aggregation::RuleMemory::kStreaming);
      auto combiner = rule->begin_chunk(n, children);
      std::vector<float> values(n);
      for (size_t k = 0; k < children; ++k) {
        codec.decode(payloads[k].data(), n, values.data());
        combiner->add(static_cast<uint32_t>(k), values.data(), weights[k]);
        // Streaming: one chunk's worth, however many children came in.
        EXPECT_EQ(combiner->bytes_held(), n * sizeof(float));
      }
      const aggregation::Combined c = combiner->finish();
      EXPECT_TRUE(bit_equal(c.values, expected)) << name << " x" << children;
      EXPECT_EQ(c.weight, total);
      EXPECT_TRUE(c.left_out.empty());
    }
  }
}

TEST(AggregationRule, AWeightedMeanInABufferUsedBeforeHasTheBitsOfOneBegunOnZeros) {
  // Signed zeros, subnormals, huge and tiny values: 0 + w * x must be kept
  // as the sum onto zeros makes it (-0 becomes +0), whatever the buffer held.
  const uint32_t n = 1037;
  std::vector<std::vector<float>> copies(3, std::vector<float>(n));
  for (uint32_t k = 0; k < n; ++k) {
    copies[0][k] = k % 5 == 0 ? -0.0f : (k % 7 == 0 ? 1e-41f : 0.013f * float(int(k % 31) - 15));
    copies[1][k] = k % 3 == 0 ? -0.0f : -3.0e37f * float(k % 2) + 1e-3f * float(k);
    copies[2][k] = k % 11 == 0 ? -1e-40f : 7.5f / float(k + 1);
  }
  const double weights[] = {0.3, 2.0, 1.7};
  auto rule = make_rule(aggregation::kWeightedMean);
  for (size_t count = 0; count <= copies.size(); ++count) {
    SCOPED_TRACE(count);
    auto fresh = rule->begin_chunk(n, copies.size());
    // A dirty buffer, longer than the chunk, of NaNs and the last chunk's values.
    std::vector<float> used(n + 100, std::numeric_limits<float>::quiet_NaN());
    for (uint32_t k = 0; k < n; k += 3) used[k] = -1.0f;
    auto reused = rule->begin_chunk_reusing(n, copies.size(), std::move(used));
    EXPECT_EQ(reused->bytes_held(), n * sizeof(float));
    for (size_t i = 0; i < count; ++i) {
      fresh->add(static_cast<uint32_t>(i), copies[i].data(), weights[i]);
      reused->add(static_cast<uint32_t>(i), copies[i].data(), weights[i]);
    }
    const aggregation::Combined a = fresh->finish();
    const aggregation::Combined b = reused->finish();
    EXPECT_TRUE(bit_equal(a.values, b.values));
    EXPECT_EQ(a.weight, b.weight);
  }
  // The kernel alone, at every length about a vector's.
  for (uint32_t len = 0; len < 40; ++len) {
    std::vector<float> want(len, 0.0f), got(len, std::numeric_limits<float>::quiet_NaN());
    accumulate_weighted(want.data(), copies[0].data(), len, 0.7f);
    aggregation::first_weighted(got.data(), copies[0].data(), len, 0.7f);
    EXPECT_TRUE(bit_equal(want, got)) << len;
  }
}

TEST(AggregationRule, RegistryNamesTheKnownRulesAndRefusesClashesAndBadNames) {
  testing::register_test_median_rule();
  const auto names = aggregation::rule_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "weighted_mean"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), testing::kTestMedian), names.end());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  try {
    make_rule("krum");
    FAIL() << "an unknown rule was made";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown aggregation rule 'krum'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("weighted_mean"), std::string::npos) << e.what();
  }
  auto factory = [](const aggregation::RuleParams&) {
    return make_rule(aggregation::kWeightedMean);
  };
  EXPECT_THROW(aggregation::register_rule("weighted_mean", factory), ConfigError);
  EXPECT_THROW(aggregation::register_rule("", factory), ConfigError);
  EXPECT_THROW(aggregation::register_rule("Mean", factory), ConfigError);
  EXPECT_THROW(aggregation::register_rule("mean\x1b[2J", factory), ConfigError);
  EXPECT_THROW(aggregation::register_rule("no_factory", nullptr), ConfigError);
  EXPECT_FALSE(aggregation::has_rule("no_factory"));
}

class MedianUnderTheAccumulator : public ::testing::Test {
 protected:
  void SetUp() override { testing::register_test_median_rule(); }
  const Codec& fp32 = codec_by_name("fp32");
  tensor::ChunkPlan plan{10, 4};  // chunks of 4, 4, 2

  aggregation::RoundAccumulator::Result add(aggregation::RoundAccumulator& acc, uint32_t sender,
                                            uint32_t chunk, float value, double weight) {
    const auto bytes = encode(fp32, std::vector<float>(plan.size(chunk), value));
    return acc.add(acc.round(), sender, chunk, plan.size(chunk), weight, fp32, bytes.data(),
                   bytes.size());
  }
};

TEST_F(MedianUnderTheAccumulator, AnOutlierDoesNotMoveTheMedianButMovesTheMean) {
  aggregation::RoundAccumulator median(plan, {1, 2, 3}, make_rule(testing::kTestMedian));
  aggregation::RoundAccumulator mean(plan, {1, 2, 3});
  for (aggregation::RoundAccumulator* acc : {&median, &mean}) {
    acc->open(0);
    add(*acc, 1, 0, 1.0f, 1.0);
    add(*acc, 3, 0, 1e6f, 1.0);  // arrival order does not matter to the median
    EXPECT_TRUE(add(*acc, 2, 0, 2.0f, 2.0).chunk_complete);
  }
  const aggregation::ChunkSum m = median.take(0);
  EXPECT_EQ(m.weight, 4.0);  // the weight behind it is the bookkeeping's, whatever the rule
  for (float x : m.mean) EXPECT_EQ(x, 2.0f);
  for (float x : mean.take(0).mean) EXPECT_GT(x, 1e5f);
}

TEST_F(MedianUnderTheAccumulator, ABufferedRuleHoldsEveryCopyUntilTheChunkCloses) {
  aggregation::RoundAccumulator median(plan, {1, 2, 3}, make_rule(testing::kTestMedian));
  aggregation::RoundAccumulator mean(plan, {1, 2, 3});
  EXPECT_EQ(median.rule().memory(), aggregation::RuleMemory::kBuffered);
  for (aggregation::RoundAccumulator* acc : {&median, &mean}) {
    acc->open(5);
    for (uint32_t child : {1u, 2u, 3u}) add(*acc, child, 1, 1.0f, 1.0);
  }
  EXPECT_EQ(median.bytes_in_flight(), 3 * plan.size(1) * sizeof(float));
  EXPECT_EQ(mean.bytes_in_flight(), plan.size(1) * sizeof(float));
  median.take(1);
  EXPECT_EQ(median.bytes_in_flight(), 0u);
}

TEST_F(MedianUnderTheAccumulator, DuplicatesStaleCopiesAndMalformedPayloadsNeverReachTheRule) {
  aggregation::RoundAccumulator median(plan, {1, 2, 3}, make_rule(testing::kTestMedian));
  median.open(2);
  add(median, 1, 0, 1.0f, 1.0);
  EXPECT_EQ(add(median, 1, 0, 1e9f, 1.0).outcome, aggregation::AddOutcome::kDuplicate);
  // Written by hand: the encoder refuses what a dishonest child might send.
  std::vector<uint8_t> nan(fp32.encoded_size(plan.size(0)));
  const float not_a_number = std::nanf("");
  for (size_t i = 0; i < plan.size(0); ++i) {
    std::memcpy(nan.data() + i * sizeof(float), &not_a_number, sizeof(float));
  }
  // Refused, and delivered: the chunk does not wait for child 2 again.
  const auto refused = median.add(2, 2, 0, plan.size(0), 1.0, fp32, nan.data(), nan.size());
  EXPECT_EQ(refused.outcome, aggregation::AddOutcome::kRefused);
  EXPECT_NE(refused.verdict.reason.find("malformed"), std::string::npos) << refused.verdict.reason;
  EXPECT_EQ(median.bytes_in_flight(), plan.size(0) * sizeof(float));
  EXPECT_TRUE(add(median, 3, 0, 3.0f, 1.0).chunk_complete);
  const aggregation::ChunkSum sum = median.take(0);
  for (float x : sum.mean) EXPECT_EQ(x, 2.0f);  // median of {1, 3}
  EXPECT_EQ(sum.weight, 2.0);
  EXPECT_EQ(sum.excused, 1.0);
  // Its refused copy was its delivery of chunk 0: another is a duplicate.
  EXPECT_EQ(add(median, 2, 0, 1e9f, 1.0).outcome, aggregation::AddOutcome::kDuplicate);
}

// A rule whose combiner makes the wrong number of values is a bug in the
// rule: the accumulator says so instead of forwarding a short chunk.
class ShortRule final : public aggregation::AggregationRule {
 public:
  std::string name() const override { return "short"; }
  aggregation::RuleMemory memory() const override { return aggregation::RuleMemory::kStreaming; }
  std::unique_ptr<aggregation::ChunkCombiner> begin_chunk(uint32_t, size_t) const override {
    class Short final : public aggregation::ChunkCombiner {
      void add(uint32_t, const float*, double) override {}
      aggregation::Combined finish() override { return {{1.0f}, 1.0, {}}; }
      size_t bytes_held() const override { return 0; }
    };
    return std::make_unique<Short>();
  }
};

TEST_F(MedianUnderTheAccumulator, ACombinerThatMakesTheWrongSizeIsRefused) {
  aggregation::RoundAccumulator acc(plan, {1}, std::make_shared<const ShortRule>());
  acc.open(0);
  add(acc, 1, 0, 1.0f, 1.0);
  EXPECT_THROW(acc.take(0), Error);
}

// A one-site topology whose federation map ends with `extra`.
std::string with(const std::string& extra) {
  std::string text = "job: j\nfederation: {rounds: 2, codec: fp32%s}\nnodes:\n"
                     "  - {id: root, role: root, endpoint: 'ipc:///tmp/r'}\n"
                     "  - {id: s0, role: site, parent: root, weight: 1}\n";
  text.replace(text.find("%s"), 2, extra);
  return text;
}

TEST(AggregationRuleTopology, TheRuleIsReadCheckedWrittenAndDigested) {
  testing::register_test_median_rule();
  const Topology plain = Topology::parse(with(""));
  const Topology named = Topology::parse(with(", aggregation: {rule: weighted_mean}"));
  const Topology median = Topology::parse(with(", aggregation: {rule: test_median}"));
  EXPECT_EQ(plain.federation().aggregation.rule, "weighted_mean");
  // The default keeps the digest every existing topology has.
  EXPECT_EQ(plain.digest_hex(), named.digest_hex());
  EXPECT_EQ(median.federation().aggregation.rule, "test_median");
  EXPECT_NE(median.digest_hex(), plain.digest_hex());
  const Topology again = Topology::parse(median.to_yaml());
  EXPECT_EQ(again.federation().aggregation.rule, "test_median");
  EXPECT_EQ(again.digest_hex(), median.digest_hex());
  try {
    Topology::parse(with(", aggregation: {rule: krum}"));
    FAIL() << "an unknown rule was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown aggregation rule 'krum'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Topology::parse(with(", aggregation: {rule: weighted_mean, trim: 1}")), ConfigError);
  EXPECT_THROW(Topology::parse(with(", aggregation: weighted_mean")), ConfigError);
}

TEST(AggregationRuleTopology, TheRulesParametersAreReadCheckedWrittenAndDigested) {
  const Topology krum =
      Topology::parse(with(", aggregation: {rule: multi_krum, params: {byzantine: 2}}"));
  EXPECT_EQ(krum.federation().aggregation.params.at("byzantine"), 2.0);
  const Topology krum1 =
      Topology::parse(with(", aggregation: {rule: multi_krum, params: {byzantine: 1}}"));
  EXPECT_NE(krum.digest_hex(), krum1.digest_hex());
  EXPECT_EQ(Topology::parse(krum.to_yaml()).digest_hex(), krum.digest_hex());
  EXPECT_THROW(Topology::parse(with(", aggregation: {rule: median, params: {trim: 1}}")),
               ConfigError);
  EXPECT_THROW(Topology::parse(with(", aggregation: {rule: trimmed_mean, params: {trim: -1}}")),
               ConfigError);
  // The checks: every key read, in the digest and the YAML when not the default.
  const Topology checks = Topology::parse(
      with(", aggregation: {finite_check: false, max_abs: 5, replay_window: 2, norm_bound: "
           "{mode: absolute, bound: 3.5, action: clip}}"));
  const AggregationSpec& a = checks.federation().aggregation;
  EXPECT_FALSE(a.finite_check);
  EXPECT_EQ(a.max_abs, 5.0);
  EXPECT_EQ(a.replay_window, 2u);
  EXPECT_EQ(a.norm_bound.mode, "absolute");
  EXPECT_EQ(a.norm_bound.bound, 3.5);
  EXPECT_EQ(a.norm_bound.action, "clip");
  EXPECT_NE(checks.digest_hex(), Topology::parse(with("")).digest_hex());
  EXPECT_EQ(Topology::parse(checks.to_yaml()).digest_hex(), checks.digest_hex());
  EXPECT_EQ(Topology::parse(with(", aggregation: {norm_bound: {mode: adaptive, factor: 4}}"))
                .digest_hex(),
            Topology::parse(with("")).digest_hex());
  EXPECT_THROW(Topology::parse(with(", aggregation: {norm_bound: {mode: absolute}}")), ConfigError);
  EXPECT_THROW(Topology::parse(with(", aggregation: {norm_bound: {factor: 0.5}}")), ConfigError);
  EXPECT_THROW(Topology::parse(with(", aggregation: {norm_bound: {speed: 1}}")), ConfigError);
  EXPECT_THROW(Topology::parse(with(", aggregation: {max_abs: -1}")), ConfigError);
  // A topology that names no parameter keeps the digest it had.
  EXPECT_EQ(Topology::parse(with(", aggregation: {rule: weighted_mean}")).digest_hex(),
            Topology::parse(with("")).digest_hex());
}

}  // namespace
}  // namespace fedwan
