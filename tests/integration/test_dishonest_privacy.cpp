// Adaptive clipping's count from a dishonest but authenticated child
// (docs/protocol.md, "Adaptive clipping"): a region may claim no more
// unclipped sites than it has (capped and audited), and a site has no
// count to give (refused).
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fedwan/synthetic.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_threads.hpp"
#include "harness/raw_site.hpp"
#include "node/node_frames.hpp"
#include "wire/frame.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kSeed = 43;
constexpr size_t kParams = 3000;  // 3 chunks of 1024, 1024, 952

uint32_t chunk_n(uint32_t c) { return c < 2 ? 1024 : 952; }

FederationSpec adaptive_federation(uint64_t rounds) {
  FederationSpec f = small_fp32_federation(rounds);
  f.privacy.mode = "central";
  f.privacy.clip = 1;
  f.privacy.noise_multiplier = 0.05;
  f.privacy.target_quantile = 0.5;
  f.privacy.clip_learning_rate = 1.0;
  f.privacy.clip_count_budget = 0.5;  // the count's noise: a tenth of a site
  return f;
}

// A zero fp32 delta chunk from `s`, with `unclipped` as its count when given.
std::vector<uint8_t> zero_delta(const RawSite& s, const Topology& topo, uint64_t round,
                                uint32_t chunk, double weight, std::optional<uint64_t> unclipped) {
  const Codec& fp32 = codec_by_name("fp32");
  const std::vector<float> zeros(chunk_n(chunk), 0.0f);
  std::vector<uint8_t> payload(fp32.encoded_size(chunk_n(chunk)));
  fp32.encode(zeros.data(), chunk_n(chunk), nullptr, payload.data());
  wire::FrameHeader h = node::node_header(topo, s.node().index, wire::MsgType::kDelta, round);
  h.codec = static_cast<uint8_t>(CodecId::kFp32);
  h.chunk_index = chunk;
  h.chunk_count = 3;
  h.element_count = chunk_n(chunk);
  h.total_elements = kParams;
  h.weight = weight;
  return wire::encode_delta_frame(h, payload.data(), payload.size(), 0, unclipped);
}

// The noised unclipped share the root's audit records for each round.
std::vector<double> shares(const fs::path& audit) {
  std::vector<double> out;
  for (const nlohmann::json& e : audit_entries(audit)) {
    if (e.value("event", "") != "privacy_clip") continue;
    const nlohmann::json& f = e.contains("fields") ? e["fields"] : e;
    out.push_back(f.value("noised_unclipped_share", -1.0));
  }
  return out;
}

TEST(DishonestPrivacyCount, ARegionClaimsAtMostItsSites) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 1, 2, adaptive_federation(2));
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const fs::path root_audit = dir.path() / "root.audit";
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, nullptr,
                   [&](AggregatorOptions& o) { o.security.audit_log = root_audit.string(); });
  RawSite rogue(
      topo, "region-0",
      test_client_security(topo, "region-0", security_for(topo, "region-0").credentials_dir));
  const double subtree = topo.weight_under(topo.node("region-0").index);
  std::vector<uint8_t> buf;
  rogue.hello(init);
  const wire::ParsedFrame welcome = await_type(rogue, &buf, wire::MsgType::kWelcome);
  ASSERT_TRUE(welcome.ok()) << welcome.detail;
  EXPECT_EQ(welcome.clip, 1.0);  // round 0's clip, the topology's
  // Round 0: a million unclipped sites of its two; round 1: none.
  const uint64_t claims[] = {1000000, 0};
  for (uint64_t round = 0; round < 2; ++round) {
    for (uint32_t c = 0; c < 3; ++c) {
      rogue.send(zero_delta(rogue, topo, round, c, subtree,
                            c == 2 ? std::optional<uint64_t>(claims[round]) : std::nullopt));
    }
    for (int got = 0; got < 3; ++got) {
      const wire::ParsedFrame f = await_type(rogue, &buf, wire::MsgType::kAnchor);
      ASSERT_TRUE(f.ok()) << "round " << round << ": " << f.detail;
      EXPECT_GT(f.clip, 0.0) << "round " << round << ": every anchor chunk carries the clip";
    }
    // Its traffic report: the root reports the round without waiting.
    const wire::TelemetryPayload t{1000, 1000, 4};
    rogue.send(node::make_frame(
        node::node_header(topo, rogue.node().index, wire::MsgType::kTelemetry, round),
        wire::encode_telemetry(t)));
  }
  ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kDone).ok());
  rogue.send(
      node::make_frame(node::node_header(topo, rogue.node().index, wire::MsgType::kDone, 2), {}));
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");
  EXPECT_EQ(count_audit(root_audit, "privacy_count_capped", "\"claimed\":1000000"), 1u);
  const std::vector<double> s = shares(root_audit);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_NEAR(s[0], 1.0, 0.3);  // its two sites, not a million
  EXPECT_NEAR(s[1], 0.0, 0.3);
}

TEST(DishonestPrivacyCount, ASiteHasNoCountToGive) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 0, 1, adaptive_federation(1));
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const fs::path root_audit = dir.path() / "root.audit";
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, nullptr,
                   [&](AggregatorOptions& o) { o.security.audit_log = root_audit.string(); });
  RawSite rogue(topo, "site-0",
                test_client_security(topo, "site-0", security_for(topo, "site-0").credentials_dir));
  const double weight = topo.node("site-0").weight;
  std::vector<uint8_t> buf;
  rogue.hello(init);
  ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kWelcome).ok());
  rogue.send(zero_delta(rogue, topo, 0, 0, weight, 1));  // refused: nothing below it
  for (uint32_t c = 0; c < 3; ++c) rogue.send(zero_delta(rogue, topo, 0, c, weight, std::nullopt));
  for (int got = 0; got < 3; ++got) {
    ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kAnchor).ok());
  }
  ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kDone).ok());
  rogue.send(
      node::make_frame(node::node_header(topo, rogue.node().index, wire::MsgType::kDone, 1), {}));
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");
  EXPECT_EQ(count_audit(root_audit, "update", "\"bad_weight\""), 1u);
  EXPECT_EQ(count_audit(root_audit, "refusal", "no sites below it"), 1u);
  const std::vector<double> s = shares(root_audit);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_NEAR(s[0], 1.0, 0.3);  // its own update, not clipped, counted once
}

}  // namespace
}  // namespace fedwan::testing
