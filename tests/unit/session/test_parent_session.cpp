// session::ParentSession under a root with a standby, over in-process links
// to a parent that is not there (plaintext links count as up at once): the
// ends it alternates between, and when an up session that brings nothing is
// taken for the passive standby's.
#include "session/parent_session.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "harness/federation_fixture.hpp"
#include "harness/temp_dir.hpp"
#include "node/node_security.hpp"
#include "transport/transport.hpp"

namespace fedwan::session {
namespace {

using namespace std::chrono_literals;

class ParentSessionTest : public ::testing::Test {
 protected:
  // root -> site-0, the root with a standby when `standby`.
  std::unique_ptr<ParentSession> session(bool standby) {
    FederationSpec f;
    f.heartbeat_s = 0.1;
    f.heartbeat_timeout_s = 1;
    NodeSpec root;
    root.id = "root";
    root.role = Role::kRoot;
    root.endpoint = "mem://" + (dir_.path() / "root").string();
    if (standby) root.standby_endpoint = "mem://" + (dir_.path() / "standby").string();
    NodeSpec site;
    site.id = "site-0";
    site.role = Role::kSite;
    site.parent = "root";
    topo_ = Topology::build("parent-session", f, {root, site});
    SecurityOptions so;
    so.insecure_plaintext = true;
    security_ = std::make_unique<node::NodeSecurity>(so, topo_, topo_.node("site-0"));
    transport_ = transport::make_transport(topo_.root().endpoint);
    ParentSession::Options o;
    o.heartbeat = 100ms;
    o.heartbeat_timeout = 1000ms;
    o.log_name = "site:site-0";
    return std::make_unique<ParentSession>(topo_, topo_.node("site-0"), *transport_, *security_, o);
  }

  testing::TempDir dir_;
  Topology topo_;
  std::unique_ptr<node::NodeSecurity> security_;
  std::unique_ptr<transport::Transport> transport_;
};

TEST_F(ParentSessionTest, EveryOtherSessionGoesToTheStandby) {
  std::unique_ptr<ParentSession> s = session(/*standby=*/true);
  EXPECT_EQ(s->endpoint(), topo_.root().endpoint);
  s->reconnect("test", 0, /*grow_backoff=*/false);
  EXPECT_EQ(s->endpoint(), topo_.root().standby_endpoint);
  s->reconnect("test", 0, /*grow_backoff=*/false);
  EXPECT_EQ(s->endpoint(), topo_.root().endpoint);
}

TEST_F(ParentSessionTest, AnUpSessionThatBringsNothingForThreeHeartbeatTimeoutsIsMute) {
  std::unique_ptr<ParentSession> s = session(/*standby=*/true);
  ASSERT_TRUE(s->link().established());
  // Counted from the later of the link's opening and the last frame heard.
  const auto t = std::max(s->opened_at(), s->last_heard());
  EXPECT_FALSE(s->up_but_mute(t + 3000ms));
  EXPECT_TRUE(s->up_but_mute(t + 3001ms));
  s->heard(t + 2500ms);  // a heartbeat of a live parent
  EXPECT_FALSE(s->up_but_mute(t + 5500ms));
  EXPECT_TRUE(s->up_but_mute(t + 5501ms));
  // A new session starts the count again.
  s->reconnect("test", 0, /*grow_backoff=*/false);
  EXPECT_FALSE(s->up_but_mute(s->opened_at() + 3000ms));
}

TEST_F(ParentSessionTest, WithoutAStandbyAnUpSessionIsNeverMute) {
  // A parent with no standby is judged by the stall and silence rules alone:
  // reconnecting to it on silence before the first welcome would only add
  // handshakes.
  std::unique_ptr<ParentSession> s = session(/*standby=*/false);
  ASSERT_TRUE(s->link().established());
  EXPECT_FALSE(s->up_but_mute(s->opened_at() + 60s));
}

// While this node wrote a checkpoint it did not listen: the parent's
// silence over that time does not count against it.
TEST_F(ParentSessionTest, SilenceWhileThisNodeDidNotListenDoesNotCount) {
  std::unique_ptr<ParentSession> s = session(/*standby=*/false);
  const auto t = std::chrono::steady_clock::now();
  s->heard(t);
  EXPECT_TRUE(s->silent(t + 1001ms));
  s->not_listening(800ms);  // a checkpoint written meanwhile
  EXPECT_FALSE(s->silent(t + 1001ms));
  EXPECT_FALSE(s->silent(t + 1800ms));
  EXPECT_TRUE(s->silent(t + 1801ms));
  // A parent never heard from stays unheard.
  s->forget_heard();
  s->not_listening(800ms);
  EXPECT_EQ(s->last_heard(), std::chrono::steady_clock::time_point{});
}

}  // namespace
}  // namespace fedwan::session
