// A site whose parent restarted goes on sealing for the session the old
// process held, and the new one cannot open those frames. The new process
// says so in the clear (wire::kFlagNoSession), and the site takes its
// parent for silent after two heartbeat periods instead of its heartbeat
// timeout: it rejoins within a second here, where the timeout is 20 s. A
// scripted root plays the parent (heartbeats every 100 ms), restarted as a
// new one on the same endpoint. Anyone on the path could say it: a word
// the parent spoke after does not count.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/site_core.hpp"
#include "harness/fake_root.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/process.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kElements = 1024;

// Calls service() every 20 ms while `more()` holds, at most `limit`; how
// long that took.
template <typename More>
Clock::duration service_while(SiteCore& site, More more, Clock::duration limit) {
  const auto t0 = Clock::now();
  while (more() && Clock::now() - t0 < limit) {
    (void)site.service();
    std::this_thread::sleep_for(20ms);
  }
  return Clock::now() - t0;
}

// Until `root` has had `hellos` hellos or `limit` passed.
Clock::duration service_until_hello(SiteCore& site, const testing::FakeRoot& root,
                                    Clock::duration limit, int hellos = 1) {
  return service_while(
      site, [&] { return root.hellos() < hellos; }, limit);
}

void service_for(SiteCore& site, Clock::duration d) {
  (void)service_while(
      site, [] { return true; }, d);
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
  auto root = testing::serving_root(topo, kElements);
  site.join();
  ASSERT_EQ(root->hellos(), 1);
  // The parent heartbeats; the site heard it a moment ago.
  service_for(site, 300ms);
  root.reset();  // the parent's process ends
  root = testing::serving_root(topo, kElements);
  const Clock::duration took = service_until_hello(site, *root, 15s);
  ASSERT_EQ(root->hellos(), 1) << "the site did not rejoin its restarted parent in 15 s";
  // Two heartbeat periods after the last frame it heard, plus a period to
  // notice: not the 20 s of its timeout.
  EXPECT_LT(took, 5s);
  const std::string audit = testing::read_text(dir.path() / "site-0.jsonl");
  EXPECT_NE(audit.find("\"parent_without_session\""), std::string::npos) << audit;
  EXPECT_NE(audit.find("holds no session with this node"), std::string::npos) << audit;
  EXPECT_EQ(audit.find("\"frame_rejected\""), std::string::npos) << audit;
}

// A "no session here" forged while the parent lives: the parent's next
// heartbeat outdates it, and a pause of the parent's (longer than the two
// heartbeat periods the word would allow, within its timeout) ends
// nothing. Said while the parent is quiet, the same word still brings the
// site back at once.
TEST(SiteParentRestart, AForgedNoSessionWordOutdatedByTheParentsNextFrameEndsNothing) {
  testing::TempDir dir;
  testing::IpcTree t;
  t.job = "forged-no-session";
  t.heartbeat_timeout_s = 20;
  const Topology topo = testing::ipc_tree(dir.path(), t);
  std::vector<float> params(kElements, 0.25f);
  SiteOptions o = testing::site_options(topo, "site-0", 30s);
  const std::filesystem::path audit = dir.path() / "site-0.jsonl";
  o.security.audit_log = audit.string();
  SiteCore site(std::move(o), params.data(), params.size());
  auto root = testing::serving_root(topo, kElements);
  site.join();
  ASSERT_EQ(root->hellos(), 1);
  service_for(site, 300ms);

  // The word, in answer to the site's next heartbeat; the site notes it.
  root->forge_no_session = true;
  (void)service_while(
      site,
      [&] {
        return testing::read_text(audit).find("\"parent_without_session\"") == std::string::npos;
      },
      5s);
  ASSERT_NE(testing::read_text(audit).find("\"parent_without_session\""), std::string::npos)
      << "the forged word never reached the site";
  // The parent heartbeats on (every 100 ms), then pauses for 1.5 s: seven
  // times the 200 ms the word would have allowed.
  service_for(site, 300ms);
  root->silent = true;
  service_for(site, 1500ms);
  EXPECT_EQ(root->hellos(), 1) << "the site left a parent that spoke after the word";
  EXPECT_EQ(testing::read_text(audit).find("\"reconnect\""), std::string::npos)
      << testing::read_text(audit);

  // The parent still quiet, the word again: now nothing came after it.
  root->forge_no_session = true;
  const Clock::duration took = service_until_hello(site, *root, 10s, /*hellos=*/2);
  ASSERT_EQ(root->hellos(), 2) << "the site did not rejoin a quiet parent that said the word";
  EXPECT_LT(took, 5s);
  const std::string log = testing::read_text(audit);
  EXPECT_NE(log.find("holds no session with this node"), std::string::npos) << log;
}

}  // namespace
}  // namespace fedwan
