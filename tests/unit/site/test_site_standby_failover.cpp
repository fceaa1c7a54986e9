// A site directly under a root with a standby, joining: its first session
// to the root does not come up in time, so the next goes to the standby,
// which completes TLS but answers nothing while the root lives. The site
// must come back to the root, not wait for a welcome there until its join
// timeout (and the root for it).
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/site_core.hpp"
#include "harness/fake_root.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/temp_dir.hpp"
#include "harness/wait_for.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;
using testing::wait_for;

TEST(SiteStandbyFailover, AJoiningSiteComesBackToTheRootPastItsMuteStandby) {
  testing::TempDir dir;
  const Topology topo = testing::root_with_standby(dir.path());
  testing::FakeRoot root(topo, topo.root().endpoint, /*mute=*/false);
  testing::FakeRoot standby(topo, topo.root().standby_endpoint, /*mute=*/true);
  standby.serving = true;
  std::vector<float> params(1000, 0.0f);
  // No checkpoint directory: no replica is fetched, the site says hello.
  SiteCore site(testing::site_options(topo, "site-0", 60s), params.data(), params.size());
  std::string ended;
  std::thread joiner([&] {
    try {
      site.join();
    } catch (const std::exception& e) {
      ended = e.what();
    }
  });
  // The root runs its link only once the site said hello to the standby:
  // the root's first handshake took longer than the site's limit (1 s),
  // whatever the machine's load.
  const bool at_standby = wait_for([&] { return standby.hellos() > 0; }, 20s);
  root.serving = true;
  const bool back = wait_for([&] { return root.hellos() > 0; }, 20s);
  // A root that heartbeats it keeps it (before its welcome too).
  const int standby_hellos = standby.hellos();
  std::this_thread::sleep_for(3500ms);
  const int standby_hellos_later = standby.hellos();
  site.stop();
  joiner.join();

  EXPECT_TRUE(at_standby);
  EXPECT_TRUE(back) << "the site stayed with the mute standby";
  EXPECT_EQ(standby_hellos_later, standby_hellos);
  EXPECT_NE(ended.find("stopped"), std::string::npos) << ended;
}

}  // namespace
}  // namespace fedwan
