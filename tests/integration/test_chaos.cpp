// The chaos suite: real `fedwan` processes on loopback, faults injected, and
// after each run two checks against the root's audit log (see
// harness/chaos_federation.hpp). Each scenario adds a row (rounds lost =
// RPO, seconds to resume = RTO) to the chaos report (FEDWAN_CHAOS_REPORT,
// see harness/chaos_report.hpp). Scenario 7 and the standby's other tests
// are in test_standby.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "harness/chaos_federation.hpp"
#include "harness/fault_proxy.hpp"
#include "harness/netns.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {
namespace {

// Scenarios 1 and 2 run with blocking rounds (tau 0), with overlapped ones
// (federation.overlap_steps = 2 of 3 inner steps: the update goes up on the
// site's worker thread while it trains, and it checkpoints at merges), and
// over links striped across 3 TCP connections (federation.streams).
struct RoundsMode {
  uint64_t tau = 0;
  uint64_t streams = 1;
};
void PrintTo(const RoundsMode& m, std::ostream* os) {
  *os << "overlap_steps " << m.tau << ", streams " << m.streams;
}
class ChaosRounds : public ::testing::TestWithParam<RoundsMode> {};

std::string rounds_label(const RoundsMode& m) {
  std::string s;
  if (m.tau != 0) s += ", overlapped rounds (tau " + std::to_string(m.tau) + ")";
  if (m.streams != 1) s += ", " + std::to_string(m.streams) + " connections per link";
  return s;
}

// 1. A site is SIGKILLed after its first delta chunk of round 2; it restarts
// from its checkpoint (overlapped: its last merge's), rejoins and the
// federation completes with its update of that round counted once.
TEST_P(ChaosRounds, SiteKilledMidUploadRestartsAndRejoins) {
  ChaosFederation fed(1, 2, 6, GetParam().tau, GetParam().streams);
  const std::string victim = fed.topo().nodes().back().id;
  fed.start_all({{victim, {{"FEDWAN_CRASH_POINT", "site.mid_upload@3"}}}});
  const auto crashed = fed.wait_crash(victim, std::chrono::seconds(60));
  fed.forget(victim);
  fed.start(victim);
  fed.wait_all(std::chrono::seconds(120));
  fed.check_against_audit();
  const std::optional<uint64_t> resumed = fed.resumed_round(victim);
  ASSERT_TRUE(resumed.has_value()) << fed.log(victim);
  EXPECT_EQ(*resumed, 2u);
  report("1 site SIGKILL mid-upload" + rounds_label(GetParam()),
         "crash point site.mid_upload (SIGKILL)", 2 - *resumed,
         seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "restarted site resumed at round " + std::to_string(*resumed));
}

// 2. A region is SIGKILLed after it accepted 7 of the 10 chunk updates of
// round 1 (its two sites, 5 chunks each); it restarts from its checkpoint,
// its sites send their updates again and nothing is counted twice.
TEST_P(ChaosRounds, RegionKilledAfterSomeChildrenDelivered) {
  ChaosFederation fed(2, 2, 6, GetParam().tau, GetParam().streams);
  const std::string region = fed.topo().node(fed.topo().root().children.front()).id;
  fed.start_all({{region, {{"FEDWAN_CRASH_POINT", "aggregator.update_accepted@17"}}}});
  const auto crashed = fed.wait_crash(region, std::chrono::seconds(60));
  fed.forget(region);
  fed.start(region);
  fed.wait_all(std::chrono::seconds(150));
  fed.check_against_audit();
  const std::optional<uint64_t> resumed = fed.resumed_round(region);
  ASSERT_TRUE(resumed.has_value()) << fed.log(region);
  report("2 region SIGKILL after k of n delivered" + rounds_label(GetParam()),
         "crash point aggregator.update_accepted@17", 1 - std::min<uint64_t>(1, *resumed),
         seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "region resumed at round " + std::to_string(*resumed));
}

INSTANTIATE_TEST_SUITE_P(Chaos, ChaosRounds,
                         ::testing::Values(RoundsMode{0, 1}, RoundsMode{2, 1}, RoundsMode{0, 3}),
                         [](const auto& info) {
                           const RoundsMode& m = info.param;
                           if (m.streams != 1) return "Striped" + std::to_string(m.streams);
                           return m.tau == 0 ? std::string("Blocking")
                                             : "OverlapTau" + std::to_string(m.tau);
                         });

// 3. The root is SIGKILLed inside its checkpoint write of round 3 (the
// third), after the write, after the fsync, after the rename.
class RootCheckpointCrash : public ::testing::TestWithParam<std::string> {};

TEST_P(RootCheckpointCrash, RestartsAtItsLastCommittedRound) {
  ChaosFederation fed(1, 2);
  const std::string step = GetParam();
  fed.start_all({{"root", {{"FEDWAN_CRASH_POINT", "checkpoint." + step + "@3"}}}});
  const auto crashed = fed.wait_crash("root", std::chrono::seconds(60));
  fed.forget("root");
  fed.start("root");
  fed.wait_all(std::chrono::seconds(150));
  const ReplayResult r = fed.check_against_audit();
  const std::optional<uint64_t> resumed = fed.resumed_round("root");
  ASSERT_TRUE(resumed.has_value()) << fed.log("root");
  // Before the rename the old checkpoint (round 2) is the durable one; after
  // it, the new one (round 3).
  EXPECT_EQ(*resumed, step == "renamed" ? 3u : 2u);
  report("3 root SIGKILL at checkpoint " + step, "crash point checkpoint." + step, 3 - *resumed,
         seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "root resumed at round " + std::to_string(*resumed) + "; " + std::to_string(r.discarded) +
             " uncommitted acceptances discarded");
}

INSTANTIATE_TEST_SUITE_P(Steps, RootCheckpointCrash,
                         ::testing::Values("written", "synced", "renamed"));

// Central privacy with a clip far below the updates' norms, moved toward
// their median after every round: it grows every round.
void growing_adaptive_clip(FederationSpec& f) {
  f.privacy.mode = "central";
  f.privacy.clip = 1e-6;
  f.privacy.noise_multiplier = 0.05;
  f.privacy.target_quantile = 0.5;
  f.privacy.clip_learning_rate = 1.0;
  f.privacy.clip_count_budget = 0.5;
  f.codec = "fp32";
}

// 3b. Adaptive clipping (central privacy): the root is SIGKILLed after its
// round-3 checkpoint is durable; restarted, the clip its next round uses is
// the one it had moved to before the crash, not the topology's again.
TEST(Chaos, RootResumesItsAdaptiveClip) {
  ChaosFederation fed(0, 4, 6, 0, 1, growing_adaptive_clip);
  fed.start_all({{"root", {{"FEDWAN_CRASH_POINT", "checkpoint.renamed@3"}}}});
  fed.wait_crash("root", std::chrono::seconds(60));
  fed.forget("root");
  fed.start("root");
  fed.wait_all(std::chrono::seconds(150));
  ASSERT_EQ(fed.resumed_round("root"), std::optional<uint64_t>(3)) << fed.log("root");
  std::map<uint64_t, std::pair<double, double>> moves;  // round -> (clip, next_clip)
  for (const AuditEntry& e : read_audit(fed.audit("root"))) {
    if (e.event != "privacy_clip") continue;
    moves[e.fields.value("round", uint64_t{0})] = {e.fields.value("clip", 0.0),
                                                   e.fields.value("next_clip", 0.0)};
  }
  ASSERT_EQ(moves.size(), 6u) << fed.log("root");
  EXPECT_EQ(moves[0].first, 1e-6);
  for (uint64_t r = 1; r < 6; ++r) {
    EXPECT_DOUBLE_EQ(moves[r].first, moves[r - 1].second) << "round " << r;
    EXPECT_GT(moves[r].first, moves[r - 1].first) << "round " << r;
  }
}

// 3c. Adaptive clipping over regions: a region is SIGKILLed after its
// round-3 checkpoint is durable. Restarted, it clips the round it resumes
// with the clip of that round (kept in its checkpoint) before its parent's
// welcome says it again, and every later round with the root's next clip.
TEST(Chaos, RegionResumesTheClipOfItsRound) {
  ChaosFederation fed(2, 2, 6, 0, 1, growing_adaptive_clip);
  fed.start_all({{"region-0", {{"FEDWAN_CRASH_POINT", "checkpoint.renamed@3"}}}});
  fed.wait_crash("region-0", std::chrono::seconds(60));
  fed.forget("region-0");
  fed.start("region-0");
  fed.wait_all(std::chrono::seconds(150));
  ASSERT_EQ(fed.resumed_round("region-0"), std::optional<uint64_t>(3)) << fed.log("region-0");
  std::map<uint64_t, double> root_clip;  // round -> the clip the root chose for it
  for (const AuditEntry& e : read_audit(fed.audit("root"))) {
    if (e.event != "privacy_clip") continue;
    const uint64_t round = e.fields.value("round", uint64_t{0});
    if (round == 0) root_clip[0] = e.fields.value("clip", 0.0);
    root_clip[round + 1] = e.fields.value("next_clip", 0.0);
  }
  ASSERT_EQ(root_clip.size(), 7u) << fed.log("root");
  for (uint64_t r = 1; r < 6; ++r) EXPECT_GT(root_clip[r], root_clip[r - 1]) << "round " << r;
  // The region's record: rounds 1..5 as they opened, and round 3 again as
  // it resumed, each the root's.
  std::map<uint64_t, int> taken;
  for (const AuditEntry& e : read_audit(fed.audit("region-0"))) {
    if (e.event != "privacy_clip") continue;
    const uint64_t round = e.fields.value("round", uint64_t{0});
    taken[round] += 1;
    EXPECT_EQ(e.fields.value("clip", 0.0), root_clip[round]) << "round " << round;
  }
  for (uint64_t r = 1; r < 6; ++r) EXPECT_EQ(taken[r], r == 3 ? 2 : 1) << "round " << r;
  EXPECT_EQ(fed.log("region-0").find("it resumed with"), std::string::npos) << fed.log("region-0");
}

// 4. While a site is down, one byte of its latest checkpoint is flipped and
// its previous checkpoint and replica image are lost too: the reader detects the flip (the file
// is kept aside as *.corrupt), finds nothing intact locally, and restores the
// replica its region keeps (sent in the background after each checkpoint).
TEST(Chaos, FlippedCheckpointByteRestoresTheParentsReplica) {
  ChaosFederation fed(1, 2);
  const std::string victim = fed.topo().nodes().back().id;
  const std::string region = fed.topo().node(fed.topo().node(victim).parent_index).id;
  fed.start_all({{victim, {{"FEDWAN_CRASH_POINT", "site.mid_upload@4"}}}});
  const auto crashed = fed.wait_crash(victim, std::chrono::seconds(60));
  fed.forget(victim);
  const auto latest = fed.checkpoint_dir(victim) / (victim + ".fwck");
  {
    std::fstream f(latest, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    char b = 0;
    f.seekg(200);
    f.read(&b, 1);
    b ^= 0x10;
    f.seekp(200);
    f.write(&b, 1);
  }
  std::filesystem::remove(fed.checkpoint_dir(victim) / (victim + ".prev.fwck"));
  // and its replica image (a recovery point of its own, when newer).
  std::filesystem::remove(fed.checkpoint_dir(victim) / (victim + ".replica.fwck"));
  // What the region holds for the site now (the newest is what comes back).
  const uint64_t newest = fed.newest_replica(region, victim);
  ASSERT_GT(newest, 0u) << "the region kept no replica of " << victim;
  // The region keeps the image: parameters on the anchor, residual to bf16,
  // under the 2 bytes a parameter of an fp16 update.
  EXPECT_LT(std::filesystem::file_size(fed.checkpoint_dir(region) / "replicas" / victim /
                                       ("round-" + std::to_string(newest) + ".fwck")),
            2 * kParams);
  fed.start(victim);
  fed.wait_all(std::chrono::seconds(120));
  fed.check_against_audit();
  EXPECT_TRUE(std::filesystem::exists(latest.string() + ".corrupt"));
  EXPECT_EQ(fed.last_field(victim, "replica_restored", "round"), newest) << fed.log(victim);
  EXPECT_EQ(fed.last_field(region, "replica_served", "round"), newest) << fed.log(region);
  const std::optional<uint64_t> resumed = fed.resumed_round(victim);
  ASSERT_TRUE(resumed.has_value()) << fed.log(victim);
  EXPECT_EQ(*resumed, newest);
  EXPECT_TRUE(fed.last_field(victim, "replica_rebuilt", "round") == newest ||
              fed.last_field(victim, "replica_behind", "round") == newest)
      << fed.log(victim);
  report("4 flipped checkpoint byte, previous one lost",
         "byte flip at offset 200 of the latest checkpoint; previous checkpoint deleted",
         3 - *resumed, seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "detected (kept as .corrupt); restored the region's replica of round " +
             std::to_string(newest));
}

// 4b. A region loses its whole checkpoint directory while it is down: it
// restores the replica the root keeps of it, resumes from it and the
// federation completes with nothing counted twice.
TEST(Chaos, RegionWithoutItsDiskRestoresTheRootsReplica) {
  ChaosFederation fed(2, 2);
  const std::string region = fed.topo().node(fed.topo().root().children.front()).id;
  // Its 27th acceptance: round 2 (10 a round), after two checkpoints.
  fed.start_all({{region, {{"FEDWAN_CRASH_POINT", "aggregator.update_accepted@27"}}}});
  const auto crashed = fed.wait_crash(region, std::chrono::seconds(60));
  fed.forget(region);
  std::filesystem::remove_all(fed.checkpoint_dir(region));
  const uint64_t newest = fed.newest_replica("root", region);
  ASSERT_GT(newest, 0u) << "the root kept no replica of " << region;
  // Its replica image: the residual to bf16, without the anchor the root
  // holds (its whole checkpoint is 8 bytes a parameter).
  EXPECT_LT(std::filesystem::file_size(fed.checkpoint_dir("root") / "replicas" / region /
                                       ("round-" + std::to_string(newest) + ".fwck")),
            2 * kParams);
  fed.start(region);
  fed.wait_all(std::chrono::seconds(150));
  fed.check_against_audit();
  EXPECT_EQ(fed.last_field(region, "replica_restored", "round"), newest) << fed.log(region);
  EXPECT_EQ(fed.last_field("root", "replica_served", "round"), newest) << fed.log("root");
  const std::optional<uint64_t> resumed = fed.resumed_round(region);
  ASSERT_TRUE(resumed.has_value()) << fed.log(region);
  EXPECT_EQ(*resumed, newest);
  report("4b region's checkpoint directory lost",
         "crash point aggregator.update_accepted@27, "
         "then the region's checkpoint directory deleted",
         2 - std::min<uint64_t>(*resumed, 2),
         seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "restored the root's replica of round " + std::to_string(newest));
}

// 5. A region is cut off from its parent and its sites for 3x the
// heartbeat timeout, then the link heals. With network namespaces (root on
// Linux) the region runs in its own namespace behind a veth pair that is
// taken down; elsewhere a fault-injecting proxy in front of the root and of
// the region blackholes their connections. The test says which it used.
TEST(Chaos, RegionPartitionedThenHealed) {
  ChaosFederation fed(1, 2, 8);
  const std::string region = fed.topo().node(fed.topo().root().children.front()).id;
  std::optional<VethPartition> veth;
  std::unique_ptr<FaultProxy> to_root, to_region;
  std::string mechanism;
  std::map<std::string, std::vector<std::string>> prefixes;
  // FEDWAN_CHAOS_NO_NETNS=1 takes the proxy path on a machine with netns.
  if (netns_available() && std::getenv("FEDWAN_CHAOS_NO_NETNS") == nullptr) {
    veth.emplace();
    fed.place("root", "0.0.0.0", veth->host_address());
    fed.place(region, "0.0.0.0", veth->namespace_address());
    prefixes[region] = veth->exec_prefix();
    mechanism = "netns+veth (namespace " + veth->name() + ")";
  } else {
    to_root = std::make_unique<FaultProxy>("127.0.0.1", fed.port("root"));
    to_region = std::make_unique<FaultProxy>("127.0.0.1", fed.port(region));
    fed.route_through("root", to_root->port());
    fed.route_through(region, to_region->port());
    mechanism = "fault-injecting proxy (" +
                (netns_available() ? std::string("FEDWAN_CHAOS_NO_NETNS set")
                                   : netns_unavailable_reason()) +
                ")";
  }
  std::cout << "[ partition mechanism: " << mechanism << " ]" << std::endl;
  fed.start_all({}, prefixes);
  // Let it train a little, then cut.
  const auto t_start = SysClock::now();
  while (!fed.first_after("root", "round_closed", t_start)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_LT(SysClock::now() - t_start, std::chrono::seconds(60)) << fed.log("root");
  }
  if (veth) {
    veth->cut();
  } else {
    to_root->partition(region);
    to_region->partition();
  }
  const double timeout_s = fed.topo().federation().heartbeat_timeout_s;
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(3000 * timeout_s)));
  const auto healed = SysClock::now();
  if (veth) {
    veth->heal();
  } else {
    to_root->heal(region);
    to_region->heal();
  }
  fed.wait_all(std::chrono::seconds(180));
  fed.check_against_audit();
  bool lost = false;
  for (const AuditEntry& e : read_audit(fed.audit("root"))) {
    lost = lost || (e.event == "child_lost" && e.fields.value("peer", "") == region);
  }
  EXPECT_TRUE(lost) << "the root should have declared the region lost during the partition";
  report("5 region partitioned then healed", mechanism, 0,
         seconds_between(healed, fed.first_after("root", "round_closed", healed)),
         "cut for " + std::to_string(3 * timeout_s) + " s (3x heartbeat timeout); RTO from heal");
}

// SIGTERM, as an orchestrator sends it: a site and then the root are
// terminated mid-federation; each checkpoints (or keeps its last round
// boundary) and exits 0, and the restarted node carries on.
TEST(Chaos, SigtermCheckpointsAndExitsZero) {
  ChaosFederation fed(1, 2, 12);
  const std::string victim = fed.topo().nodes().back().id;
  fed.start_all();
  const auto wait_round = [&](SysClock::time_point after) {
    while (!fed.first_after("root", "round_closed", after)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ASSERT_LT(SysClock::now() - after, std::chrono::seconds(60)) << fed.log("root");
    }
  };
  wait_round(SysClock::now());
  for (const std::string& node : {victim, std::string("root")}) {
    const pid_t pid = fed.pid(node);
    ASSERT_EQ(::kill(pid, SIGTERM), 0);
    const std::vector<int> codes = wait_processes({pid}, std::chrono::seconds(60));
    EXPECT_EQ(codes[0], 0) << node << " did not exit 0 on SIGTERM; log:\n" << fed.log(node);
    EXPECT_TRUE(std::filesystem::exists(fed.checkpoint_dir(node) / (node + ".fwck"))) << node;
    fed.forget(node);
    const auto restarted = SysClock::now();
    fed.start(node);
    wait_round(restarted);
  }
  fed.wait_all(std::chrono::seconds(180));
  fed.check_against_audit();
  EXPECT_TRUE(fed.resumed_round(victim).has_value()) << fed.log(victim);
  EXPECT_TRUE(fed.resumed_round("root").has_value()) << fed.log("root");
}

// 6. Every link to the region passes a fault-injecting proxy that drops,
// duplicates and reorders ZeroMQ messages and adds delay. tc netem is not
// used: the test machine's kernel has no netem qdisc.
TEST(Chaos, LossyDuplicatingReorderingLink) {
  ChaosFederation fed(1, 2, 5);
  const std::string region = fed.topo().node(fed.topo().root().children.front()).id;
  FaultProxyOptions po;
  po.target_port = fed.port(region);
  FaultProxy proxy(po);
  fed.route_through(region, proxy.port());
  fed.expect_rejected_frames();  // each duplicate is refused as a replay
  FaultSpec spec;
  spec.drop = 0.05;
  spec.duplicate = 0.05;
  spec.reorder = 0.05;
  spec.max_delay_ms = 5;
  spec.seed = 11;
  proxy.set_faults(spec);
  const auto t0 = SysClock::now();
  fed.start_all();
  fed.wait_all(std::chrono::seconds(180));
  fed.check_against_audit();
  const FaultProxyStats st = proxy.stats();
  EXPECT_GT(st.messages_dropped + st.messages_duplicated + st.messages_reordered, 0u);
  report("6 lossy, duplicating, reordering link", "fault-injecting proxy (no netem here)", 0, -1,
         "dropped " + std::to_string(st.messages_dropped) + ", duplicated " +
             std::to_string(st.messages_duplicated) + ", reordered " +
             std::to_string(st.messages_reordered) + " of " +
             std::to_string(st.messages_forwarded) + " messages; " +
             std::to_string(std::chrono::duration<double>(SysClock::now() - t0).count()) + " s");
}

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
