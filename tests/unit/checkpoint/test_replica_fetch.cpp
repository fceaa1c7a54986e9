// fetch_replica over real links (mutual TLS over ipc://) to a root that has
// a standby: a child whose first session is not answered in time tries the
// standby next (session::ParentSession alternates them), and a passive
// standby completes TLS but answers nothing while the root lives. The fetch
// must come back to the root and get its answer, not wait out its timeout
// on the standby's mute session (and the root, waiting for the child, its
// join timeout: the stress run's Chaos/RootDies.StandbyTakesOver/Regions).
#include "checkpoint/replica_fetch.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/error.hpp"
#include "harness/fake_root.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/temp_dir.hpp"
#include "node/node_config.hpp"
#include "node/node_security.hpp"
#include "session/parent_session.hpp"
#include "transport/links.hpp"
#include "transport/transport.hpp"

namespace fedwan::checkpoint {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(ReplicaFetch, ARootSlowToAnswerOnceIsReachedAgainPastItsMuteStandby) {
  testing::TempDir dir;
  const Topology topo = testing::root_with_standby(dir.path());
  const NodeSpec& self = topo.node("site-0");
  testing::FakeRoot root(topo, topo.root().endpoint, /*mute=*/false);
  testing::FakeRoot standby(topo, topo.root().standby_endpoint, /*mute=*/true);
  standby.serving = true;

  node::NodeConfig config(topo, self, node::NodeOverrides{});
  ASSERT_EQ(config.heartbeat_timeout, 1000ms);
  node::NodeSecurity security(testing::security_for(topo, self.id), topo, self);
  std::unique_ptr<transport::Transport> transport = transport::make_transport(topo.root().endpoint);
  session::ParentSession::Options so;
  so.link = config.link;
  so.heartbeat = config.heartbeat;
  so.heartbeat_timeout = config.heartbeat_timeout;
  so.reconnect_linger_ms = 0;
  so.log_name = "site:site-0";
  session::ParentSession session(topo, self, *transport, security, so);
  std::vector<std::string> endpoints = {session.endpoint()};

  // The root runs its link only once the child gave its first session up
  // and asked the standby: its first handshake took longer than the child's
  // limit (1 s), whatever the machine's load.
  std::thread gate([&] {
    const auto until = Clock::now() + 30s;
    while (standby.replica_requests() == 0 && !root.serving && Clock::now() < until) {
      std::this_thread::sleep_for(10ms);
    }
    root.serving = true;
  });
  const auto start = Clock::now();
  bool restored = true;
  std::string error;
  try {
    restored = fetch_replica(
        session.link(),
        [&](const std::string& why) -> transport::ParentLink& {
          session.reconnect(why, 0, /*grow_backoff=*/false);
          endpoints.push_back(session.endpoint());
          return session.link();
        },
        topo, self, config, dir.path() / "checkpoints", 0, 20s, security);
  } catch (const Error& e) {
    error = e.what();
  }
  const auto took = Clock::now() - start;
  root.serving = true;
  gate.join();

  EXPECT_EQ(error, "");
  EXPECT_FALSE(restored);                    // the root's answer: it keeps none
  EXPECT_GE(standby.replica_requests(), 1);  // the sequence was forced: the standby was asked ...
  EXPECT_GE(root.replica_requests(), 1);     // ... and the root answered afterwards
  ASSERT_GE(endpoints.size(), 3u);
  EXPECT_EQ(endpoints[0], topo.root().endpoint);
  EXPECT_EQ(endpoints[1], topo.root().standby_endpoint);
  EXPECT_EQ(endpoints.back(), topo.root().endpoint);
  // 1 s for the first session, 2 s of silence on the standby's, then the
  // root's answer: far inside the fetch's own timeout.
  EXPECT_LT(took, 15s);
}

}  // namespace
}  // namespace fedwan::checkpoint
