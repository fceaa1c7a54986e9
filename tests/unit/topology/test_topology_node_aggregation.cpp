// An aggregator's own aggregation settings (a node's `aggregation:` key):
// read over the federation's, checked, written back, digested, fixed across
// topology versions, and what NodeConfig hands the aggregator.
#include <gtest/gtest.h>

#include <string>

#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "harness/error_message.hpp"
#include "node/node_config.hpp"
#include "topology/topology_version.hpp"

namespace fedwan {
namespace {

// A root, two regions of one site each; `fed` ends the federation map,
// `root`, `r0` and `s0` end those nodes' maps.
std::string tree(const std::string& fed, const std::string& root = "", const std::string& r0 = "",
                 const std::string& s0 = "") {
  return "job: j\nfederation: {rounds: 2, codec: fp32" + fed +
         "}\nnodes:\n"
         "  - {id: root, role: root, endpoint: 'ipc:///tmp/r'" +
         root +
         "}\n"
         "  - {id: r0, role: region, parent: root, endpoint: 'ipc:///tmp/r0'" +
         r0 +
         "}\n"
         "  - {id: r1, role: region, parent: root, endpoint: 'ipc:///tmp/r1'}\n"
         "  - {id: s0, role: site, parent: r0, weight: 1" +
         s0 +
         "}\n"
         "  - {id: s1, role: site, parent: r1, weight: 1}\n";
}

std::string message(const std::string& text) {
  return testing::config_error([&] { Topology::parse(text); });
}

TEST(NodeAggregation, AnAggregatorsKeysApplyOverTheFederations) {
  const Topology t =
      Topology::parse(tree(", aggregation: {max_abs: 1000, norm_bound: {factor: 3}}", "",
                           ", aggregation: {rule: median, norm_bound: {action: clip}}"));
  const NodeSpec& r0 = t.node("r0");
  ASSERT_TRUE(r0.aggregation.has_value());
  EXPECT_EQ(r0.aggregation->rule, "median");
  EXPECT_EQ(r0.aggregation->max_abs, 1000);              // the federation's
  EXPECT_EQ(r0.aggregation->norm_bound.factor, 3);       // the federation's
  EXPECT_EQ(r0.aggregation->norm_bound.action, "clip");  // its own
  EXPECT_EQ(t.aggregation(r0).rule, "median");
  // The others apply the federation's.
  EXPECT_FALSE(t.node("r1").aggregation.has_value());
  EXPECT_EQ(t.aggregation(t.node("r1")).rule, "weighted_mean");
  EXPECT_EQ(t.aggregation(t.node("root")).norm_bound.action, "refuse");
}

TEST(NodeAggregation, ANewRuleStartsWithoutTheFederationsParams) {
  const Topology t = Topology::parse(tree(", aggregation: {rule: trimmed_mean, params: {trim: 1}}",
                                          ", aggregation: {rule: median}"));
  EXPECT_TRUE(t.node("root").aggregation->params.empty());
  // The same rule keeps them unless the node gives its own.
  const Topology same =
      Topology::parse(tree(", aggregation: {rule: trimmed_mean, params: {trim: 1}}",
                           ", aggregation: {norm_bound: {mode: 'off'}}"));
  EXPECT_EQ(same.node("root").aggregation->params.at("trim"), 1);
}

TEST(NodeAggregation, ItIsWrittenBackAndDigested) {
  const std::string fed = ", aggregation: {finite_check: false}";
  const Topology plain = Topology::parse(tree(fed));
  const Topology own = Topology::parse(
      tree(fed, ", aggregation: {rule: multi_krum, params: {byzantine: 1}, finite_check: true}"));
  EXPECT_NE(own.digest_hex(), plain.digest_hex());
  const Topology again = Topology::parse(own.to_yaml());
  EXPECT_EQ(again.digest_hex(), own.digest_hex());
  ASSERT_TRUE(again.node("root").aggregation.has_value());
  EXPECT_TRUE(again.node("root").aggregation->finite_check);  // differs from the federation's
  EXPECT_EQ(again.node("root").aggregation->params.at("byzantine"), 1);
  // Settings equal to the federation's are none of its own: one digest.
  const Topology same = Topology::parse(tree(fed, ", aggregation: {finite_check: false}"));
  EXPECT_FALSE(same.node("root").aggregation.has_value());
  EXPECT_EQ(same.digest_hex(), plain.digest_hex());
  // A topology without the key keeps its digest.
  EXPECT_EQ(Topology::parse(plain.to_yaml()).digest_hex(), plain.digest_hex());
}

TEST(NodeAggregation, BadSettingsAreNamedWithTheNode) {
  EXPECT_NE(message(tree("", "", ", aggregation: {rule: krum}")).find("node 'r0'"),
            std::string::npos);
  EXPECT_NE(message(tree("", "", ", aggregation: {rule: krum}")).find("unknown aggregation rule"),
            std::string::npos);
  EXPECT_NE(message(tree("", "", ", aggregation: {norm_bound: {factor: 0.5}}")).find("factor"),
            std::string::npos);
  EXPECT_NE(message(tree("", "", ", aggregation: {rule: median, params: {trim: 1}}")).find("r0"),
            std::string::npos);
  EXPECT_NE(message(tree("", "", ", aggregation: {colour: red}")).find("colour"),
            std::string::npos);
  EXPECT_NE(message(tree("", "", "", ", aggregation: {rule: median}"))
                .find("applies to aggregators only"),
            std::string::npos);
  // Built in code, the same checks.
  Topology t = Topology::parse(tree(""));
  std::vector<NodeSpec> nodes = t.nodes();
  for (NodeSpec& n : nodes) n.children.clear();
  nodes[3].aggregation = AggregationSpec{};
  nodes[3].aggregation->rule = "median";
  EXPECT_THROW(Topology::build("j", t.federation(), nodes), ConfigError);
  nodes[3].aggregation.reset();
  nodes[1].aggregation = AggregationSpec{};
  nodes[1].aggregation->max_abs = -1;
  EXPECT_THROW(Topology::build("j", t.federation(), nodes), ConfigError);
  nodes[1].aggregation->max_abs = 10;
  EXPECT_EQ(Topology::build("j", t.federation(), nodes).node("r0").aggregation->max_abs, 10);
}

TEST(NodeAggregation, CentralPrivacyNeedsTheMeanAtEveryAggregator) {
  const std::string privacy = ", privacy: {mode: central, clip: 1, noise_multiplier: 1}";
  EXPECT_NE(message(tree(privacy, "", ", aggregation: {rule: median}")).find("weighted_mean"),
            std::string::npos);
  // Checks of its own are fine.
  EXPECT_EQ(message(tree(privacy, "", ", aggregation: {norm_bound: {factor: 8}}")), "");
}

TEST(NodeAggregation, NodeConfigHandsEachAggregatorItsOwn) {
  const Topology t = Topology::parse(
      tree(", aggregation: {max_abs: 50}", "", ", aggregation: {rule: median, max_abs: 7}"));
  const node::NodeConfig r0(t, t.node("r0"), {});
  const node::NodeConfig r1(t, t.node("r1"), {});
  const node::NodeConfig root(t, t.node("root"), {});
  EXPECT_EQ(r0.rule->name(), "median");
  EXPECT_EQ(r0.screen.max_abs, 7);
  EXPECT_EQ(r1.rule->name(), "weighted_mean");
  EXPECT_EQ(r1.screen.max_abs, 50);
  EXPECT_EQ(root.screen.max_abs, 50);
}

TEST(NodeAggregation, ALaterVersionCannotChangeIt) {
  const Topology v1 = Topology::parse(tree(""));
  std::string text = tree("", "", ", aggregation: {rule: median}");
  text += "  - {id: s2, role: site, parent: r1, weight: 1}\n";
  try {
    topology::version_change(v1, Topology::parse(text).as_successor_of(v1));
    FAIL() << "a version that changes an aggregator's rule was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("changes node 'r0'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fedwan
