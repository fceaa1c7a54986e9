// A node busy at a round boundary for longer than the heartbeat timeout
// (its checkpoint written to a slow disk: FEDWAN_STALL_POINT sleeps at
// each MiB written, as a billion parameters on one disk take tens of
// seconds) keeps its peers: it sends heartbeats marked busy while it
// writes, so its parent does not drop it, its children do not reconnect
// (nor fail over to the root's standby), and nothing is sent again. Real
// `fedwan` processes, a root, a region and two sites, 1M parameters (the
// root's checkpoint about 10 MiB), heartbeats every 0.3 s, a 2 s timeout.
// And a node whose every fsync outlasts the timeout (a disk slow to
// flush, its checkpoints' or its audit log's): the one blocking call runs
// beside its beats.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "harness/chaos_federation.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {
namespace {

constexpr size_t kBigParams = 1'000'000;
constexpr const char* kSlowDisk = "checkpoint.block@500";  // 0.5 s a MiB
// Each fsync of a file written whole takes 2.5 s: one blocking call longer
// than the timeout, with no pieces to beat between.
constexpr const char* kSlowSync = "file.sync@2500";
// Each fsync of the audit log takes 2.5 s.
constexpr const char* kSlowAuditSync = "audit.sync@2500";

void megabyte_chunks(FederationSpec& f) { f.chunk_bytes = 1 << 20; }
// One chunk a model: one update recorded (and synced) a child a round.
void whole_chunks(FederationSpec& f) { f.chunk_bytes = 4 << 20; }

size_t count_events(const ChaosFederation& fed, const std::string& node, const std::string& event) {
  if (!std::filesystem::exists(fed.audit(node))) return 0;
  const std::vector<AuditEntry> entries = read_audit(fed.audit(node));
  return static_cast<size_t>(std::count_if(entries.begin(), entries.end(),
                                           [&](const AuditEntry& e) { return e.event == event; }));
}

// The longest checkpoint `node` wrote, in ms, by its audit log.
double longest_checkpoint_ms(const ChaosFederation& fed, const std::string& node) {
  double longest = 0;
  for (const AuditEntry& e : read_audit(fed.audit(node))) {
    if (e.event == "checkpoint") longest = std::max(longest, e.fields.value("ms", 0.0));
  }
  return longest;
}

// The longest time between two of `node`'s audit entries, in ms: the
// audit log's fsync held back what came next.
double longest_audit_gap_ms(const ChaosFederation& fed, const std::string& node) {
  std::chrono::milliseconds longest{0};
  std::optional<SysClock::time_point> last;
  for (const AuditEntry& e : read_audit(fed.audit(node))) {
    const SysClock::time_point t = audit_time(e.time);
    if (last) {
      longest = std::max(longest, std::chrono::duration_cast<std::chrono::milliseconds>(t - *last));
    }
    last = t;
  }
  return static_cast<double>(longest.count());
}

// Nobody lost anybody: no child dropped, no link to a parent opened again,
// no child that took its parent's wait for lost anchor chunks and rejoined
// to be resynced.
void expect_nobody_lost(const ChaosFederation& fed, const std::vector<std::string>& nodes) {
  for (const std::string& n : nodes) {
    EXPECT_EQ(count_events(fed, n, "child_lost"), 0u) << n << " lost a child:\n" << fed.log(n);
    EXPECT_EQ(count_events(fed, n, "reconnect"), 0u) << n << " reconnected:\n" << fed.log(n);
    EXPECT_EQ(fed.log(n).find("rejoining"), std::string::npos) << n << " rejoined:\n" << fed.log(n);
  }
}

std::vector<std::string> every_node(const ChaosFederation& fed) {
  std::vector<std::string> ids;
  for (const NodeSpec& n : fed.topo().nodes()) ids.push_back(n.id);
  return ids;
}

// How long the slow node was held at most, in ms, by what it recorded.
using HeldFor = double (*)(const ChaosFederation&, const std::string&);

// A federation whose node of role `slow_role` (the last of its kind) runs
// with `stall`: it completes, every update counted once, the slow node was
// held longer than the heartbeat timeout by `held_for` (the scenario took
// place), and nobody lost anybody.
void run_with_a_slow_node(Role slow_role, const char* stall, void (*chunks)(FederationSpec&),
                          HeldFor held_for = longest_checkpoint_ms) {
  ChaosFederation fed(1, 2, /*rounds=*/3, /*overlap_steps=*/0, /*streams=*/1, chunks);
  fed.set_params(kBigParams);
  std::string slow;
  for (const NodeSpec& n : fed.topo().nodes()) {
    if (n.role == slow_role) slow = n.id;
  }
  fed.start_all({{slow, {{"FEDWAN_STALL_POINT", stall}}}});
  fed.wait_all(std::chrono::seconds(240));
  fed.check_against_audit();
  EXPECT_GT(held_for(fed, slow), fed.topo().federation().heartbeat_timeout_s * 1e3)
      << fed.log(slow);
  expect_nobody_lost(fed, every_node(fed));
}

std::string role_name(const ::testing::TestParamInfo<Role>& info) {
  switch (info.param) {
    case Role::kRoot: return "Root";
    case Role::kRegion: return "Region";
    default: return "Site";
  }
}

// The node whose disk is slow: the root, the region, or a site.
class SlowCheckpoint : public ::testing::TestWithParam<Role> {};

TEST_P(SlowCheckpoint, KeepsItsPeersAndCountsEveryUpdateOnce) {
  run_with_a_slow_node(GetParam(), kSlowDisk, megabyte_chunks);
}

INSTANTIATE_TEST_SUITE_P(Nodes, SlowCheckpoint,
                         ::testing::Values(Role::kRoot, Role::kRegion, Role::kSite), role_name);

// One fsync that outlasts the timeout (a disk flushing slowly): the node
// runs it beside its beats and keeps its peers all the same.
class SlowSync : public ::testing::TestWithParam<Role> {};

TEST_P(SlowSync, KeepsItsPeersAndCountsEveryUpdateOnce) {
  run_with_a_slow_node(GetParam(), kSlowSync, whole_chunks);
}

INSTANTIATE_TEST_SUITE_P(Nodes, SlowSync,
                         ::testing::Values(Role::kRoot, Role::kRegion, Role::kSite), role_name);

// The audit log's fsync at each round's close outlasting the timeout: it
// too runs beside the beats, and what the beats audit meanwhile waits for
// no lock the fsync holds.
class SlowAuditSync : public ::testing::TestWithParam<Role> {};

TEST_P(SlowAuditSync, KeepsItsPeersAndCountsEveryUpdateOnce) {
  run_with_a_slow_node(GetParam(), kSlowAuditSync, megabyte_chunks, longest_audit_gap_ms);
}

INSTANTIATE_TEST_SUITE_P(Nodes, SlowAuditSync,
                         ::testing::Values(Role::kRoot, Role::kRegion, Role::kSite), role_name);

// The root writing slowly is not taken for dead: its standby, which takes
// over when the root is silent and a child comes to it, never does.
TEST(SlowCheckpoint, TheRootsStandbyDoesNotTakeOver) {
  ChaosFederation fed(1, 2, /*rounds=*/3, /*overlap_steps=*/0, /*streams=*/1, megabyte_chunks);
  fed.set_params(kBigParams);
  fed.add_standby();
  fed.start_standby();
  fed.start_all({{"root", {{"FEDWAN_STALL_POINT", kSlowDisk}}}});
  fed.wait_all(std::chrono::seconds(240));
  fed.check_against_audit();
  EXPECT_GT(longest_checkpoint_ms(fed, "root"), fed.topo().federation().heartbeat_timeout_s * 1e3);
  EXPECT_EQ(count_events(fed, "standby", "takeover"), 0u) << fed.log("standby");
  EXPECT_EQ(count_events(fed, "root", "fenced"), 0u) << fed.log("root");
  std::vector<std::string> nodes = every_node(fed);
  nodes.push_back("standby");
  expect_nobody_lost(fed, nodes);
}

// A root whose work hangs (its audit log's fsync blocked for ten minutes:
// a dead disk) says it is busy for half a round timeout, then nothing: its
// region takes it for lost before its own wait for the anchor gives up,
// goes to the standby, and the standby takes over; every update counts
// once. Were the root busy for ever, the region would give up the round
// instead and the federation would stop.
TEST(HungWork, TheRootsStandbyTakesOverFromARootThatHangs) {
  ChaosFederation fed(1, 2, /*rounds=*/4, /*overlap_steps=*/0, /*streams=*/1,
                      [](FederationSpec& f) { f.round_timeout_s = 20; });
  fed.add_standby();
  fed.start_standby();
  const SysClock::time_point t0 = SysClock::now();
  fed.start_all({{"root", {{"FEDWAN_STALL_POINT", "audit.sync@600000"}}}});
  const SysClock::time_point until = SysClock::now() + std::chrono::seconds(120);
  while (!fed.first_after("standby", "takeover", t0) && SysClock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string root_log = fed.log("root");
  ::kill(fed.pid("root"), SIGKILL);
  (void)wait_processes({fed.pid("root")}, std::chrono::seconds(30));
  fed.forget("root");
  ASSERT_TRUE(fed.first_after("standby", "takeover", t0)) << fed.log("standby") << "\nregion-0:\n"
                                                          << fed.log("region-0") << "\nroot:\n"
                                                          << root_log;
  fed.wait_all(std::chrono::seconds(180));
  EXPECT_NE(root_log.find("busy for over 10000 ms"), std::string::npos) << root_log;
  fed.check_against_audit();
}

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
