// A second aggregation rule through the whole federation: the test double
// of harness/median_rule.hpp, registered by this test and named by the
// topology, runs real aggregators and sites over the in-process transport.
// No role knows the rule; the result must equal the reference federation
// that combines with the same rule, bit for bit (a coordinate-wise median
// does not depend on arrival order, whatever the fan-in).
#include <gtest/gtest.h>

#include "fedwan/synthetic.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/median_rule.hpp"
#include "harness/model_compare.hpp"
#include "harness/reference_federation.hpp"

namespace fedwan::testing {
namespace {

constexpr uint64_t kSeed = 11;

FederationSpec median_federation(const std::string& codec, const std::string& rule) {
  FederationSpec f;
  f.rounds = 3;
  f.inner_steps = 3;
  f.codec = codec;
  f.chunk_bytes = 4096;
  f.outer.name = "diloco";
  f.round_timeout_s = 30;
  f.aggregation.rule = rule;
  return f;
}

LocalTraining synthetic_training(const Topology& topo) {
  return [&topo](uint32_t site, uint64_t, std::vector<float>& p) {
    synthetic::local_steps(p.data(), p.size(), site, topo.federation().inner_steps, kSeed);
  };
}

struct Shape {
  int regions;
  int sites_per_region;
  const char* codec;
};

class SecondRule : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override { register_test_median_rule(); }
};

TEST_P(SecondRule, AMedianFederationMatchesItsReferenceAndNotTheMean) {
  const Shape shape = GetParam();
  TempDir dir;
  const Topology topo = make_tree(dir.path(), shape.regions, shape.sites_per_region,
                                  median_federation(shape.codec, kTestMedian), true);
  const std::vector<float> init = synthetic::initial_model(3000, kSeed);  // 3 chunks
  FederationRun run = run_threads(topo, init, kSeed);
  ASSERT_TRUE(run.errors.empty()) << run.error_text();
  const ReferenceResult ref = run_reference(topo, init, synthetic_training(topo));
  EXPECT_TRUE(bit_equal(run.root.global_model, ref.global));
  for (const auto& site : run.site_models) EXPECT_TRUE(bit_equal(site, ref.held));
  ASSERT_EQ(run.root.reports.size(), 3u);

  // The same tree with the default rule ends elsewhere: the rule was used.
  TempDir mean_dir;
  const Topology mean_topo = make_tree(mean_dir.path(), shape.regions, shape.sites_per_region,
                                       median_federation(shape.codec, "weighted_mean"), true);
  const ReferenceResult mean = run_reference(mean_topo, init, synthetic_training(mean_topo));
  EXPECT_FALSE(bit_equal(mean.global, ref.global));
}

INSTANTIATE_TEST_SUITE_P(Trees, SecondRule,
                         ::testing::Values(Shape{0, 3, "fp32"}, Shape{2, 3, "fp16"}),
                         [](const auto& info) {
                           return std::to_string(info.param.regions) + "regions_" +
                                  std::to_string(info.param.sites_per_region) + "sites_" +
                                  info.param.codec;
                         });

}  // namespace
}  // namespace fedwan::testing
