// A site whose caller does not look at the link for a while (a long
// training step without service(), a slow encode) does not take its parent
// for silent when it looks again: what the parent sent meanwhile waits
// unread. Away for a heartbeat timeout or more it sent nothing for as long,
// so its parent has judged it lost: it rejoins at once. A parent that is
// silent while the site looks is lost after the timeout as ever. A scripted
// root plays the parent and heartbeats every 100 ms; the site's heartbeat
// period is 100 ms and its timeout 3 s.
#include <gtest/gtest.h>

#include <chrono>
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

constexpr uint64_t kElements = 1024;

// Calls service() every 20 ms for `d`.
void service_for(SiteCore& site, std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
    (void)site.service();
    std::this_thread::sleep_for(20ms);
  }
}

class SiteAway : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::IpcTree t;
    t.job = "site-away";
    t.heartbeat_timeout_s = 3;
    topo_ = testing::ipc_tree(dir_.path(), t);
    root_ = std::make_unique<testing::FakeRoot>(topo_, topo_.root().endpoint, /*mute=*/false);
    root_->on_hello = [](testing::FakeRoot& r, const std::string& child,
                         const wire::ParsedFrame& f) {
      testing::welcome_unchanged(r, child, f, kElements);
    };
    root_->serving = true;
    site_ = std::make_unique<SiteCore>(testing::site_options(topo_, "site-0", 30s), params_.data(),
                                       params_.size());
    site_->join();
    service_for(*site_, 300ms);
    ASSERT_EQ(root_->hellos(), 1);
  }

  testing::TempDir dir_;
  Topology topo_;
  std::unique_ptr<testing::FakeRoot> root_;
  std::vector<float> params_ = std::vector<float>(kElements, 0.5f);
  std::unique_ptr<SiteCore> site_;
};

TEST_F(SiteAway, ASiteThatDidNotLookAtItsLinkDoesNotDropAParentThatKeptTalking) {
  // The parent quiet for 1.5 s while the site looks (half the timeout: not
  // lost), then talking again while the site does not look for 2.1 s: the
  // site heard nothing for 3.6 s, but 2 s of that was its own absence.
  root_->silent = true;
  service_for(*site_, 1500ms);
  root_->silent = false;
  std::this_thread::sleep_for(2100ms);
  service_for(*site_, 1000ms);
  EXPECT_EQ(root_->hellos(), 1) << "the site reconnected to a parent that heartbeated meanwhile";
}

// Calls service() every 20 ms until the root has had `hellos` or `limit`
// passed; how long that took.
std::chrono::milliseconds service_until_hellos(SiteCore& site, const testing::FakeRoot& root,
                                               int hellos, std::chrono::milliseconds limit) {
  const auto t0 = std::chrono::steady_clock::now();
  while (root.hellos() < hellos && std::chrono::steady_clock::now() - t0 < limit) {
    (void)site.service();
    std::this_thread::sleep_for(20ms);
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0);
}

TEST_F(SiteAway, ASiteAwayForLongerThanTheTimeoutRejoinsAtOnce) {
  std::this_thread::sleep_for(3500ms);  // nothing sent for longer than the timeout
  // At once: not after another timeout of the parent's silence (3 s).
  const auto took = service_until_hellos(*site_, *root_, 2, 10s);
  EXPECT_EQ(root_->hellos(), 2) << "the site did not rejoin a parent that had judged it lost";
  EXPECT_LT(took, 2000ms) << "the site waited to find its parent silent";
}

TEST_F(SiteAway, AParentSilentWhileTheSiteLooksIsStillLost) {
  root_->silent = true;  // from now on, nothing from the parent
  (void)service_until_hellos(*site_, *root_, 2, 10s);
  EXPECT_GE(root_->hellos(), 2) << "a silent parent was never given up";
}

}  // namespace
}  // namespace fedwan
