// A site whose parent restarted goes on sealing for the session the old
// process held, and the new one cannot open those frames. The new process
// says so in the clear (wire::kFlagNoSession), and the site takes its
// parent for silent after two heartbeat periods instead of its heartbeat
// timeout: it rejoins within a second here, where the timeout is 20 s. A
// scripted root plays the parent (heartbeats every 100 ms), restarted as a
// new one on the same endpoint.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/site_core.hpp"
#include "harness/fake_root.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kElements = 1024;

std::unique_ptr<testing::FakeRoot> serving_root(const Topology& topo) {
  auto root = std::make_unique<testing::FakeRoot>(topo, topo.root().endpoint, /*mute=*/false);
  root->on_hello = [](testing::FakeRoot& r, const std::string& child, const wire::ParsedFrame& f) {
    testing::welcome_unchanged(r, child, f, kElements);
  };
  root->serving = true;
  return root;
}

// Calls service() every 20 ms until `root` has had a hello or `limit`
// passed; how long that took.
Clock::duration service_until_hello(SiteCore& site, const testing::FakeRoot& root,
                                    Clock::duration limit) {
  const auto t0 = Clock::now();
  while (root.hellos() < 1 && Clock::now() - t0 < limit) {
    (void)site.service();
    std::this_thread::sleep_for(20ms);
  }
  return Clock::now() - t0;
}

TEST(SiteParentRestart, ASiteRejoinsARestartedParentWithoutWaitingOutItsTimeout) {
  testing::TempDir dir;
  testing::IpcTree t;
  t.job = "parent-restart";
  t.heartbeat_timeout_s = 20;
  const Topology topo = testing::ipc_tree(dir.path(), t);
  std::vector<float> params(kElements, 0.25f);
  SiteOptions o = testing::site_options(topo, "site-0", 30s);
  o.security.audit_log = (dir.path() / "site-0.jsonl").string();
  SiteCore site(std::move(o), params.data(), params.size());
  auto root = serving_root(topo);
  site.join();
  ASSERT_EQ(root->hellos(), 1);
  // The parent heartbeats; the site heard it a moment ago.
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < 300ms) {
    (void)site.service();
    std::this_thread::sleep_for(20ms);
  }
  root.reset();  // the parent's process ends
  root = serving_root(topo);
  const Clock::duration took = service_until_hello(site, *root, 15s);
  ASSERT_EQ(root->hellos(), 1) << "the site did not rejoin its restarted parent in 15 s";
  // Two heartbeat periods after the last frame it heard, plus a period to
  // notice: not the 20 s of its timeout.
  EXPECT_LT(took, 5s);
  std::ifstream in(dir.path() / "site-0.jsonl");
  const std::string audit((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(audit.find("\"parent_without_session\""), std::string::npos) << audit;
  EXPECT_NE(audit.find("holds no session with this node"), std::string::npos) << audit;
  EXPECT_EQ(audit.find("\"frame_rejected\""), std::string::npos) << audit;
}

}  // namespace
}  // namespace fedwan
