#include <gtest/gtest.h>

#include <string>

#include "fedwan/error.hpp"
#include "fedwan/privacy.hpp"
#include "fedwan/topology.hpp"
#include "node/node_config.hpp"

namespace fedwan {
namespace {

// A flat federation (sites under the root) or one with a region, with
// `privacy` as the federation.privacy flow map (empty: none).
std::string topology_text(const std::string& privacy, bool region = false,
                          const std::string& codec = "fp16", const std::string& extra = "") {
  std::string t = "job: dp\nfederation:\n  rounds: 10\n  codec: " + codec + "\n";
  if (!privacy.empty()) t += "  privacy: " + privacy + "\n";
  t += extra;
  t += "nodes:\n  - {id: root, role: root, endpoint: \"tcp://127.0.0.1:7000\"}\n";
  const std::string parent = region ? "eu" : "root";
  if (region) {
    t += "  - {id: eu, role: region, parent: root, endpoint: \"tcp://127.0.0.1:7001\"}\n";
  }
  t += "  - {id: s1, role: site, parent: " + parent + ", weight: 2}\n";
  t += "  - {id: s2, role: site, parent: " + parent + "}\n";
  return t;
}

void expect_refused(const std::string& text, const std::string& words) {
  try {
    Topology::parse(text);
    ADD_FAILURE() << "accepted:\n" << text;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("federation.privacy"), std::string::npos) << e.what();
  }
}

TEST(TopologyPrivacy, OffByDefaultAndTheDigestIsUnchanged) {
  const Topology plain = Topology::parse(topology_text(""));
  EXPECT_EQ(plain.federation().privacy.mode, "off");
  EXPECT_EQ(plain.rounds_to_run(), 10u);
  const Topology off = Topology::parse(topology_text("{mode: off}"));
  EXPECT_EQ(plain.digest(), off.digest());
  const Topology on = Topology::parse(topology_text("{mode: local, clip: 1, noise_multiplier: 1}"));
  EXPECT_NE(plain.digest(), on.digest());
}

TEST(TopologyPrivacy, ReadsEveryKeyAndWritesThemBack) {
  const Topology t = Topology::parse(topology_text(
      "{mode: central, clip: 0.5, noise_multiplier: 1.2, delta: 1e-6, epsilon_budget: 40}", false,
      "int8"));
  const PrivacySpec& p = t.federation().privacy;
  EXPECT_EQ(p.mode, "central");
  EXPECT_DOUBLE_EQ(p.clip, 0.5);
  EXPECT_DOUBLE_EQ(p.noise_multiplier, 1.2);
  EXPECT_DOUBLE_EQ(p.delta, 1e-6);
  EXPECT_DOUBLE_EQ(p.epsilon_budget, 40);
  const Topology again = Topology::parse(t.to_yaml());
  EXPECT_EQ(again.digest(), t.digest());
}

TEST(TopologyPrivacy, ATargetEpsilonChoosesTheNoiseForTheRounds) {
  const Topology t =
      Topology::parse(topology_text("{mode: local, clip: 1, target_epsilon: 3}", true, "int8"));
  // rounds 10: the smallest multiplier whose ten rounds spend at most 3.
  const double z = noise_multiplier_for(3, 1e-5, 10);
  EXPECT_LE(gaussian_epsilon(z, 10, 1e-5), 3.0);
  EXPECT_EQ(t.rounds_to_run(), 10u);
}

TEST(TopologyPrivacy, TheBudgetEndsTheFederationAtTheLastRoundWithinIt) {
  // One round at z = 1 spends 4.73, ten 19.05: a budget of 12 allows four.
  const Topology t = Topology::parse(
      topology_text("{mode: central, clip: 1, noise_multiplier: 1, epsilon_budget: 12}"));
  const uint64_t n = t.rounds_to_run();
  EXPECT_LT(n, 10u);
  EXPECT_LE(gaussian_epsilon(1, n, 1e-5), 12.0);
  EXPECT_GT(gaussian_epsilon(1, n + 1, 1e-5), 12.0);
  // A budget above what the rounds spend changes nothing.
  const Topology wide = Topology::parse(
      topology_text("{mode: central, clip: 1, noise_multiplier: 1, epsilon_budget: 100}"));
  EXPECT_EQ(wide.rounds_to_run(), 10u);
}

TEST(TopologyPrivacy, RefusesSettingsThatCannotHold) {
  expect_refused(topology_text("{mode: global, clip: 1, noise_multiplier: 1}"), "mode 'global'");
  expect_refused(topology_text("{mode: local, noise_multiplier: 1}"), "clip");
  expect_refused(topology_text("{mode: local, clip: -1, noise_multiplier: 1}"), "clip");
  expect_refused(topology_text("{mode: local, clip: 1}"), "exactly one");
  expect_refused(topology_text("{mode: local, clip: 1, noise_multiplier: 1, target_epsilon: 2}"),
                 "exactly one");
  expect_refused(topology_text("{mode: local, clip: 1, noise_multiplier: -2}"), "noise_multiplier");
  expect_refused(topology_text("{mode: local, clip: 1, noise_multiplier: 1, delta: 1}"), "delta");
  expect_refused(topology_text("{mode: local, clip: 1, noise_multiplier: 1, epsilon_budget: 2}"),
                 "does not cover one round");
  expect_refused(topology_text("{mode: local, clip: 1, noise_multiplier: 1, epsilon_budget: -1}"),
                 "epsilon_budget");
  expect_refused(topology_text("{mode: local, clip: .inf, noise_multiplier: 1}"), "clip");
  try {
    Topology::parse(topology_text("{mode: local, clip: 1, noise_multiplier: 1, lr: 2}"));
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lr"), std::string::npos) << e.what();
  }
}

TEST(TopologyPrivacy, CentralModeNeedsTheMeanAndLosslessSumsOverRegions) {
  expect_refused(topology_text("{mode: central, clip: 1, noise_multiplier: 1}", false, "fp32",
                               "  aggregation: {rule: median}\n"),
                 "weighted_mean");
  expect_refused(topology_text("{mode: central, clip: 1, noise_multiplier: 1}", true, "fp16"),
                 "codec fp32");
  // Flat, any codec: the root clips what it decodes. Over regions, fp32.
  EXPECT_NO_THROW(Topology::parse(
      topology_text("{mode: central, clip: 1, noise_multiplier: 1}", false, "int8")));
  EXPECT_NO_THROW(Topology::parse(
      topology_text("{mode: central, clip: 1, noise_multiplier: 1}", true, "fp32")));
  // Local mode: any codec, any tree.
  EXPECT_NO_THROW(
      Topology::parse(topology_text("{mode: local, clip: 1, noise_multiplier: 1}", true, "int8")));
}

}  // namespace
}  // namespace fedwan

namespace fedwan {
namespace {

TEST(TopologyPrivacyAdaptive, ReadsTheKeysWritesThemBackAndSharesTheMultiplier) {
  const std::string keys = "{mode: central, clip: 1, noise_multiplier: 2, target_quantile: 0.6, "
                           "clip_learning_rate: 0.5, clip_count_budget: 0.2}";
  const Topology t = Topology::parse(topology_text(keys, false, "fp32"));
  const PrivacySpec& p = t.federation().privacy;
  EXPECT_EQ(p.target_quantile, 0.6);
  EXPECT_EQ(p.clip_learning_rate, 0.5);
  EXPECT_EQ(p.clip_count_budget, 0.2);
  const Topology again = Topology::parse(t.to_yaml());
  EXPECT_EQ(again.digest_hex(), t.digest_hex());
  EXPECT_EQ(again.federation().privacy.clip_count_budget, 0.2);
  EXPECT_NE(
      t.digest_hex(),
      Topology::parse(topology_text("{mode: central, clip: 1, noise_multiplier: 2}", false, "fp32"))
          .digest_hex());
  // The round's privacy is shared: 1/z^2 = 1/z_update^2 + 1/z_count^2.
  const node::NodeConfig cfg(t, t.node("root"), {});
  EXPECT_EQ(cfg.privacy.noise_multiplier, 2);
  const double zu = cfg.privacy.update_noise_multiplier;
  const double zc = cfg.privacy.count_noise_multiplier;
  EXPECT_NEAR(1 / (zu * zu) + 1 / (zc * zc), 1.0 / 4, 1e-12);
  EXPECT_NEAR(1 / (zc * zc), 0.2 / 4, 1e-12);
  // A fixed clip keeps all of it for the update.
  const Topology fixed = Topology::parse(
      topology_text("{mode: central, clip: 1, noise_multiplier: 2}", false, "fp32"));
  const node::NodeConfig fixed_cfg(fixed, fixed.node("root"), {});
  EXPECT_EQ(fixed_cfg.privacy.update_noise_multiplier, 2);
  EXPECT_EQ(fixed_cfg.privacy.count_noise_multiplier, 0);
}

TEST(TopologyPrivacyAdaptive, RefusesWhatCannotWork) {
  const std::string z = "mode: central, clip: 1, noise_multiplier: 2, ";
  expect_refused(topology_text("{" + z + "target_quantile: 1}", false, "fp32"), "target_quantile");
  expect_refused(topology_text("{" + z + "target_quantile: -0.1}", false, "fp32"), "(0, 1)");
  expect_refused(
      topology_text("{" + z + "target_quantile: 0.5, clip_count_budget: 1}", false, "fp32"),
      "clip_count_budget");
  expect_refused(
      topology_text("{" + z + "target_quantile: 0.5, clip_learning_rate: 0}", false, "fp32"),
      "clip_learning_rate");
  // Over regions: they clip with the clip the root sends down.
  const Topology regions =
      Topology::parse(topology_text("{" + z + "target_quantile: 0.5}", true, "fp32"));
  EXPECT_EQ(regions.federation().privacy.target_quantile, 0.5);
  // Still central mode's fp32 over regions.
  expect_refused(topology_text("{" + z + "target_quantile: 0.5}", true, "fp16"), "codec fp32");
  expect_refused(
      topology_text("{mode: local, clip: 1, noise_multiplier: 2, target_quantile: 0.5}", false),
      "needs central mode");
}

}  // namespace
}  // namespace fedwan
