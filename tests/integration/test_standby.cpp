// The root's standby (chaos scenario 7 and its fault-free behaviour): it
// keeps the root's checkpoint of every round, takes over when the root dies
// (regions, or sites directly under the root, fail over to it), fences a
// root that comes back, and stops with the root otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "harness/chaos_federation.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {
namespace {

// 7. The root is SIGKILLed in the middle of round 2. Its standby, which
// holds the root's checkpoint of every round it acknowledged, takes over
// when a region comes to it; training continues and completes. Then
// fencing: the standby, restarted, starts as the active root (it finds its
// own checkpoint), and the old root, started again, is refused by it and
// exits with an error.
struct StandbyCase {
  int regions, sites;
  const char* crash;  // the root's acceptance in the middle of round 2
};
class RootDies : public ::testing::TestWithParam<StandbyCase> {};

TEST_P(RootDies, StandbyTakesOver) {
  const StandbyCase& p = GetParam();
  ChaosFederation fed(p.regions, p.sites);
  fed.add_standby();
  fed.start_standby();
  fed.start_all({{"root", {{"FEDWAN_CRASH_POINT", p.crash}}}});
  const auto crashed = fed.wait_crash("root", std::chrono::seconds(90));
  fed.forget("root");
  fed.wait_all(std::chrono::seconds(180));
  ASSERT_TRUE(fed.first_after("standby", "takeover", crashed)) << fed.log("standby");
  fed.check_against_audit();
  uint64_t last_closed = 0;
  for (const AuditEntry& e : read_audit(fed.audit("root"))) {
    if (e.event == "round_closed") last_closed = e.fields.value("round", uint64_t{0});
  }
  const std::optional<uint64_t> resumed = fed.resumed_round("standby");
  ASSERT_TRUE(resumed.has_value()) << fed.log("standby");
  // Every round the root committed was held by the standby: none is redone.
  EXPECT_EQ(*resumed, last_closed + 1) << fed.log("standby");
  report(std::string("7 root dies, standby takes over (") + (p.regions > 0 ? "regions" : "sites") +
             " under the root fail over)",
         std::string("crash point ") + p.crash + " on the root", last_closed + 1 - *resumed,
         seconds_between(crashed, fed.first_after("standby", "round_closed", crashed)),
         "standby resumed at round " + std::to_string(*resumed) +
             " from the root's replicated checkpoint; a returning old root is fenced");

  // Fencing. The standby comes back as the root it became...
  const auto restarted = SysClock::now();
  const pid_t standby = fed.start_standby();
  const auto until = SysClock::now() + std::chrono::seconds(30);
  while (!fed.first_after("standby", "resumed", restarted) && SysClock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(fed.first_after("standby", "resumed", restarted)) << fed.log("standby");
  // ... and refuses the old root, which stops with an error.
  const pid_t old_root = fed.start("root", {}, {}, "old-root");
  const std::vector<int> codes = wait_processes({old_root}, std::chrono::seconds(60));
  EXPECT_NE(codes[0], 0) << fed.log("old-root");
  EXPECT_NE(fed.log("old-root").find("took over as root"), std::string::npos)
      << fed.log("old-root") << "\nstandby:\n"
      << fed.log("standby");
  EXPECT_TRUE(fed.first_after("old-root", "fenced", restarted)) << fed.log("old-root");
  fed.forget("old-root");
  ::kill(standby, SIGTERM);
  EXPECT_EQ(wait_processes({standby}, std::chrono::seconds(30))[0], 0) << fed.log("standby");
  fed.forget("standby");
}

// 5 chunks a child and round: 2 regions make 10 acceptances a round at the
// root, 3 sites under it 15.
INSTANTIATE_TEST_SUITE_P(Chaos, RootDies,
                         ::testing::Values(StandbyCase{2, 2, "aggregator.update_accepted@25"},
                                           StandbyCase{0, 3, "aggregator.update_accepted@37"}),
                         [](const ::testing::TestParamInfo<StandbyCase>& info) {
                           return info.param.regions > 0 ? std::string("Regions")
                                                         : std::string("Sites");
                         });

// Both of the root's checkpoints are lost while it is down (the latest
// corrupt, the previous deleted): restarted, it asks its standby for its
// copy and resumes from it instead of refusing to start.
void restore_root_from_standby(ChaosFederation& fed, uint64_t expected_round) {
  const auto dir = fed.checkpoint_dir("root");
  {
    std::fstream f(dir / "root.fwck", std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    char b = 0;
    f.seekg(300);
    f.read(&b, 1);
    b ^= 0x01;
    f.seekp(300);
    f.write(&b, 1);
  }
  std::filesystem::remove(dir / "root.prev.fwck");
  const auto t0 = SysClock::now();
  const pid_t standby = fed.start_standby();
  const pid_t root = fed.start("root");
  const auto until = SysClock::now() + std::chrono::seconds(60);
  while (!fed.first_after("root", "resumed", t0) && SysClock::now() < until &&
         ::kill(root, 0) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(fed.last_field("root", "replica_restored", "round"), expected_round) << fed.log("root");
  EXPECT_EQ(fed.resumed_round("root"), expected_round) << fed.log("root");
  EXPECT_TRUE(std::filesystem::exists(dir / "root.fwck.corrupt"));
  for (const pid_t pid : {root, standby}) ::kill(pid, SIGTERM);
  const std::vector<int> codes = wait_processes({root, standby}, std::chrono::seconds(30));
  EXPECT_EQ(codes[0], 0) << fed.log("root");
  EXPECT_EQ(codes[1], 0) << fed.log("standby");
  fed.forget("root");
  fed.forget("standby");
}

// Without a fault the standby holds every round's checkpoint of the root
// (acknowledged before the round's last anchor chunk left) and stops, exit
// 0, when the root finishes; a root whose checkpoints are then lost restores
// the standby's copy; a root whose standby is not running goes on
// without it and says so.
TEST(Chaos, StandbyKeepsEveryRoundAndStopsWithTheRoot) {
  ChaosFederation fed(1, 2, 4);
  fed.add_standby();
  fed.start_standby();
  fed.start_all();
  fed.wait_all(std::chrono::seconds(120));
  fed.check_against_audit();
  std::set<uint64_t> stored;
  bool done = false;
  for (const AuditEntry& e : read_audit(fed.audit("standby"))) {
    if (e.event == "replica_stored") stored.insert(e.fields.value("round", uint64_t{0}));
    done = done || e.event == "standby_done";
    EXPECT_NE(e.event, "takeover");
  }
  EXPECT_EQ(stored, (std::set<uint64_t>{1, 2, 3, 4})) << fed.log("standby");
  EXPECT_TRUE(done) << fed.log("standby");
  EXPECT_FALSE(fed.first_after("root", "standby_lost", SysClock::time_point{})) << fed.log("root");
  // What the standby costs a round: from the root's checkpoint to the
  // standby holding it (the last anchor chunk waits that long).
  std::map<uint64_t, SysClock::time_point> written;
  for (const AuditEntry& e : read_audit(fed.audit("root"))) {
    if (e.event == "checkpoint") written[e.fields.value("round", uint64_t{0})] = audit_time(e.time);
  }
  std::vector<double> waits;
  uint64_t bytes = 0;
  for (const AuditEntry& e : read_audit(fed.audit("standby"))) {
    if (e.event != "replica_stored") continue;
    auto it = written.find(e.fields.value("round", uint64_t{0}));
    if (it != written.end()) waits.push_back(seconds_between(it->second, audit_time(e.time)));
    bytes = e.fields.value("bytes", uint64_t{0});
  }
  ASSERT_FALSE(waits.empty());
  restore_root_from_standby(fed, 4);
  std::sort(waits.begin(), waits.end());
  report("standby replication, no fault", "root checkpoint streamed to the standby every round", 0,
         -1,
         "root checkpoint " + std::to_string(bytes / 1024) +
             " KiB; checkpoint to standby holding "
             "it: median " +
             std::to_string(static_cast<int>(waits[waits.size() / 2] * 1000)) + " ms, max " +
             std::to_string(static_cast<int>(waits.back() * 1000)) + " ms");
}

TEST(Chaos, RootGoesOnWithoutItsStandby) {
  ChaosFederation fed(1, 2, 3);
  fed.add_standby();  // named in the topology, never started
  fed.start_all();
  fed.wait_all(std::chrono::seconds(120));
  fed.check_against_audit();
  EXPECT_TRUE(fed.first_after("root", "standby_lost", SysClock::time_point{})) << fed.log("root");
}

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
