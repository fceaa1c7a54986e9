// An authenticated but dishonest site and the membership messages (wire
// protocol 6): it may leave, and nothing more. A membership report is a
// region's to make, a heartbeat that both leaves and pauses is nonsense,
// and a pause is for outside the participation windows the topology
// declares (this site declares none): each is refused and audited, and
// changes nothing. Its real
// leave is taken at once: with quorum 1.0 and no deadline, the federation
// finishes with the other site, nobody waits for a heartbeat timeout, and
// the root's model is the replay of what it audited.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "harness/audit_replay.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_threads.hpp"
#include "harness/raw_site.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kSeed = 43;
constexpr size_t kParams = 3000;

std::vector<uint8_t> heartbeat(const Topology& topo, const RawSite& s, uint8_t flags,
                               const std::vector<uint8_t>& payload = {}) {
  wire::FrameHeader h = node::node_header(topo, s.node().index, wire::MsgType::kHeartbeat, 0);
  h.flags = flags;
  return node::make_frame(h, payload);
}

TEST(DishonestMembership, ASiteMayLeaveAndNothingMore) {
  TempDir dir;
  FederationSpec fed = small_fp32_federation(3);
  fed.heartbeat_timeout_s = 20;  // a wait for the leaver would show as a timeout
  const Topology topo = make_tree(dir.path(), 0, 2, fed);  // root - site-0, site-1
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const fs::path audit = dir.path() / "root.audit";
  const fs::path store = dir.path() / "updates";
  AggregatorSummary root;
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, &root, [&](AggregatorOptions& o) {
    o.security.audit_log = audit.string();
    o.record_updates_dir = store.string();
  });
  spawn_synthetic_site(nodes, topo, "site-0", init, kSeed, 2);

  RawSite rogue(topo, "site-1",
                test_client_security(topo, "site-1", security_for(topo, "site-1").credentials_dir));
  std::vector<uint8_t> buf;
  rogue.hello(init);
  wire::ParsedFrame f = rogue.recv(&buf);
  ASSERT_TRUE(f.ok()) << f.detail;
  ASSERT_EQ(f.header.type, wire::MsgType::kWelcome);
  // A site reporting a membership weight for a subtree it does not have.
  rogue.send(heartbeat(topo, rogue, wire::kFlagMembership, wire::encode_membership({1e12, 1000})));
  // Leaving and pausing at once.
  rogue.send(heartbeat(topo, rogue, wire::kFlagLeaving | wire::kFlagPausing));
  // Pausing although it takes part at all times.
  rogue.send(heartbeat(topo, rogue, wire::kFlagPausing));
  // And then a real leave.
  rogue.send(heartbeat(topo, rogue, wire::kFlagLeaving));
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");

  EXPECT_EQ(root.rounds, 3u);
  EXPECT_EQ(root.children_lost, 0u) << "the root waited for the site that left";
  EXPECT_EQ(count_audit(audit, "refusal", "a site has no membership to report"), 1u);
  EXPECT_EQ(count_audit(audit, "refusal", "cannot both leave and pause"), 1u);
  EXPECT_EQ(count_audit(audit, "pause_refused", "declares no participation windows"), 1u);
  EXPECT_EQ(count_audit(audit, "member_paused", ""), 0u);
  EXPECT_EQ(count_audit(audit, "member_left", "site-1"), 1u);
  EXPECT_EQ(count_audit(audit, "deadline", ""), 0u);
  const ReplayResult replay = replay_root_audit(topo, init, audit, store);
  std::string problems;
  for (const std::string& p : replay.problems) problems += p + "\n";
  EXPECT_TRUE(replay.problems.empty()) << problems;
  ASSERT_EQ(replay.global.size(), root.global_model.size());
  EXPECT_EQ(0, std::memcmp(replay.global.data(), root.global_model.data(),
                           replay.global.size() * sizeof(float)));
  for (uint64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(replay.accepted_by_round_sender.count({r, "site-1"}), 0u) << r;
    EXPECT_GT(replay.accepted_by_round_sender.count({r, "site-0"}), 0u) << r;
  }
}

}  // namespace
}  // namespace fedwan::testing
