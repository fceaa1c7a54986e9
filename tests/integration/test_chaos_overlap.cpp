// The chaos checks with overlapped rounds (federation.overlap_steps) that
// have no blocking twin in test_chaos.cpp (where scenarios 1 and 2 run in
// both modes): a site's update goes up on a worker thread while it trains,
// and it merges the anchor tau steps late, checkpointing at the merge. Real
// `fedwan` processes, faults injected, then the audit checks of
// harness/chaos_federation.hpp: the final model equals a replay of exactly
// the accepted updates, and no (round, sender, chunk) is counted twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/node_checkpoint.hpp"
#include "common/sha256.hpp"
#include "harness/chaos_federation.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {
namespace {

constexpr uint64_t kTau = 2;  // of 3 inner steps

// The root SIGKILLed in the middle of round 2; its standby takes over and
// the overlapped sites fail over to it.
TEST(ChaosOverlap, RootDiesAndTheStandbyTakesOver) {
  ChaosFederation fed(1, 2, 6, kTau);
  fed.add_standby();
  fed.start_standby();
  fed.start_all({{"root", {{"FEDWAN_CRASH_POINT", "aggregator.update_accepted@13"}}}});
  const auto crashed = fed.wait_crash("root", std::chrono::seconds(90));
  fed.forget("root");
  fed.wait_all(std::chrono::seconds(180));
  ASSERT_TRUE(fed.first_after("standby", "takeover", crashed)) << fed.log("standby");
  fed.check_against_audit();
}

// SIGTERM while the update is in flight: the site merges within its grace
// (or keeps its last merge's checkpoint), exits 0 and the restarted site
// carries on.
TEST(ChaosOverlap, SigtermDuringAnOverlappedSyncExitsZeroAndResumes) {
  ChaosFederation fed(1, 2, 12, kTau);
  const std::string victim = fed.topo().nodes().back().id;
  fed.start_all();
  const auto t0 = SysClock::now();
  while (!fed.first_after("root", "round_closed", t0)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_LT(SysClock::now() - t0, std::chrono::seconds(60)) << fed.log("root");
  }
  const pid_t pid = fed.pid(victim);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  EXPECT_EQ(wait_processes({pid}, std::chrono::seconds(60))[0], 0) << fed.log(victim);
  EXPECT_TRUE(std::filesystem::exists(fed.checkpoint_dir(victim) / (victim + ".fwck")));
  fed.forget(victim);
  fed.start(victim);
  fed.wait_all(std::chrono::seconds(180));
  fed.check_against_audit();
  EXPECT_TRUE(fed.resumed_round(victim).has_value()) << fed.log(victim);
}

// A site loses its whole disk while it is down. Its region kept the replica
// image of its latest checkpoint (the parameters against the anchor of that
// round, the residual to bf16): the site fetches it, takes the region's
// model of the image's round in full and rebuilds its parameters bit for
// bit, losing nothing. Overlapped, so the parameters it checkpoints hold
// tau steps past the anchor; paced steps (300 ms), so the image is stored
// and acknowledged while the site trains, and the kill comes before its
// update of that round: the region is still in that round.
TEST(ChaosOverlap, SiteWithoutItsDiskRebuildsFromTheRegionsImage) {
  ChaosFederation fed(1, 2, 8, kTau);
  const std::string victim = fed.topo().nodes().back().id;
  const std::string region = fed.topo().node(fed.topo().node(victim).parent_index).id;
  for (const NodeSpec& n : fed.topo().nodes()) {
    const bool site = n.role == Role::kSite;
    fed.start(
        n.id, n.id == victim ? Env{{"FEDWAN_CRASH_POINT", "site.replica_stored@3"}} : Env{}, {}, {},
        site ? std::vector<std::string>{"--step-time-ms", "300"} : std::vector<std::string>{});
  }
  const auto crashed = fed.wait_crash(victim, std::chrono::seconds(90));
  fed.forget(victim);
  // Its own checkpoints, read before the disk goes: what it had.
  std::map<uint64_t, std::string> params_sha;  // round -> SHA-256 of its parameters
  uint64_t latest = 0;
  for (const char* name : {".fwck", ".prev.fwck"}) {
    const auto p = fed.checkpoint_dir(victim) / (victim + name);
    if (!std::filesystem::exists(p)) continue;
    const Checkpoint c = read_checkpoint(p);
    // Without "params" they were the anchor.
    const std::vector<float> params =
        checkpoint::floats_of(c, c.find("params") != nullptr ? "params" : "anchor", 0);
    params_sha[c.round] = to_hex(sha256(params.data(), params.size() * 4).data(), 32);
    latest = std::max(latest, c.round);
  }
  ASSERT_GT(latest, 0u) << fed.log(victim);
  std::filesystem::remove_all(fed.checkpoint_dir(victim));
  const uint64_t newest = fed.newest_replica(region, victim);
  ASSERT_EQ(newest, latest) << "the region acknowledged the image of round " << latest;
  // Under half the checkpoint it stands for (12 bytes a parameter), though
  // the parameters' progress past the anchor is kept bit for bit.
  const uintmax_t image_bytes =
      std::filesystem::file_size(fed.checkpoint_dir(region) / "replicas" / victim /
                                 ("round-" + std::to_string(newest) + ".fwck"));
  EXPECT_LT(image_bytes, kParams * 6);
  fed.start(victim, {}, {}, {}, {"--step-time-ms", "300"});
  fed.wait_all(std::chrono::seconds(180));
  fed.check_against_audit();
  EXPECT_EQ(fed.last_field(victim, "replica_restored", "round"), newest) << fed.log(victim);
  EXPECT_EQ(fed.resumed_round(victim), std::optional<uint64_t>(newest)) << fed.log(victim);
  EXPECT_EQ(fed.last_field(victim, "replica_rebuilt", "round"), newest) << fed.log(victim);
  std::string rebuilt_sha;
  for (const AuditEntry& e : read_audit(fed.audit(victim))) {
    if (e.event == "replica_rebuilt") rebuilt_sha = e.fields.value("params_sha256", std::string());
  }
  EXPECT_EQ(rebuilt_sha, params_sha[newest])
      << "rebuilt parameters differ from its checkpoint of round " << newest;
  report("4c site's disk lost, overlapped",
         "crash point site.replica_stored@3, then the site's checkpoint directory deleted",
         latest - newest,
         seconds_between(crashed, fed.first_after("root", "round_closed", crashed)),
         "rebuilt its parameters bit for bit from the region's image of round " +
             std::to_string(newest) + " (" + std::to_string(image_bytes) + " bytes for " +
             std::to_string(kParams) + " parameters)");
}

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
