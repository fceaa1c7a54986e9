// The chaos checks with overlapped rounds (federation.overlap_steps) that
// have no blocking twin in test_chaos.cpp (where scenarios 1 and 2 run in
// both modes): a site's update goes up on a worker thread while it trains,
// and it merges the anchor tau steps late, checkpointing at the merge. Real
// `fedwan` processes, faults injected, then the audit checks of
// harness/chaos_federation.hpp: the final model equals a replay of exactly
// the accepted updates, and no (round, sender, chunk) is counted twice.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
