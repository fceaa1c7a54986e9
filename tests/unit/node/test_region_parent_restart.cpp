// A region whose parent restarted goes on sealing for the session the old
// process held. The new process says, in the clear, that it holds no
// session with the region (wire::kFlagNoSession), and the region takes its
// parent for silent after two heartbeat periods instead of its heartbeat
// timeout: it says hello to the new process within a second or two here,
// where the timeout is 20 s. A scripted root plays the parent (heartbeats
// every 100 ms), restarted as a new one on the same endpoint.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "fedwan/site_core.hpp"
#include "harness/fake_root.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
#include "harness/process.hpp"
#include "harness/temp_dir.hpp"
#include "harness/wait_for.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::wait_for;

constexpr uint64_t kElements = 1000;

TEST(RegionParentRestart, ARegionRejoinsARestartedParentWithoutWaitingOutItsTimeout) {
  testing::TempDir dir;
  testing::IpcTree t;
  t.job = "region-parent-restart";
  t.region = true;
  t.heartbeat_timeout_s = 20;
  const Topology topo = testing::ipc_tree(dir.path(), t);
  std::vector<float> init(kElements);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.004f * static_cast<float>(i % 71);
  const std::filesystem::path audit = dir.path() / "region-0.jsonl";
  auto root = testing::serving_root(topo, kElements);
  // The region holds the model already, as after an earlier round.
  testing::NodeSpawner nodes;
  testing::spawn_aggregator(nodes, topo, "region-0", init, nullptr, [&](AggregatorOptions& o) {
    o.initial_model = init;
    o.spill_from_bytes = AggregatorOptions{}.spill_from_bytes;
    o.security.audit_log = audit.string();
  });
  // Its site: the region says hello once its children joined.
  std::vector<float> params = init;
  SiteCore site(testing::site_options(topo, "site-0", 60s), params.data(), params.size());
  std::atomic<bool> done{false};
  std::thread runner([&] {
    try {
      site.join();
      while (!done) {
        (void)site.service();
        std::this_thread::sleep_for(20ms);
      }
    } catch (const std::exception&) {
      // stopped
    }
  });
  const bool joined = wait_for([&] { return root->hellos() >= 1; }, 20s);
  if (!joined) {
    done = true;
    site.stop();
    runner.join();
  }
  ASSERT_TRUE(joined) << nodes.errors();
  // The parent heartbeats; the region heard it a moment ago.
  std::this_thread::sleep_for(300ms);
  root.reset();  // the parent's process ends
  root = testing::serving_root(topo, kElements);
  const auto t0 = Clock::now();
  const bool back = wait_for([&] { return root->hellos() >= 1; }, 15s);
  const Clock::duration took = Clock::now() - t0;
  done = true;
  site.stop();
  runner.join();
  nodes.stop();
  nodes.join();
  ASSERT_TRUE(back) << "the region did not rejoin its restarted parent in 15 s; " << nodes.errors();
  // Two heartbeat periods after the last frame it heard, plus a period to
  // notice: not the 20 s of its timeout.
  EXPECT_LT(took, 5s);
  const std::string log = testing::read_text(audit);
  EXPECT_NE(log.find("\"parent_without_session\""), std::string::npos) << log;
  EXPECT_NE(log.find("holds no session with this node"), std::string::npos) << log;
}

}  // namespace
}  // namespace fedwan
