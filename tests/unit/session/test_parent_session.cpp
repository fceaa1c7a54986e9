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
  s->not_listening(800ms, t + 900ms);  // a checkpoint written meanwhile
  EXPECT_FALSE(s->silent(t + 1001ms));
  EXPECT_FALSE(s->silent(t + 1800ms));
  EXPECT_TRUE(s->silent(t + 1801ms));
  // Never credited past the time it is told (nothing heard in the future).
  s->heard(t);
  s->not_listening(5s, t + 300ms);
  EXPECT_EQ(s->last_heard(), t + 300ms);
  // A parent never heard from stays unheard.
  s->forget_heard();
  s->not_listening(800ms, t + 900ms);
  EXPECT_EQ(s->last_heard(), std::chrono::steady_clock::time_point{});
}

// The owner's loop turns at least every heartbeat period while it looks at
// its link; a turn much later means it did not look (a caller that trained
// without servicing its site): the parent's silence then is not counted,
// unless the owner was away so long that its parent has judged it lost.
TEST_F(ParentSessionTest, ALateTurnCreditsTheParentWithTheTimeAway) {
  using std::chrono::steady_clock;
  std::unique_ptr<ParentSession> s = session(/*standby=*/false);
  const auto t = steady_clock::now() + 1h;  // after the link opened
  s->heard(t);
  EXPECT_EQ(s->turn(t), steady_clock::duration::zero());  // the first
  EXPECT_EQ(s->turn(t + 100ms), steady_clock::duration::zero());
  // 700 ms without a turn: heard is moved on by all but the period owed.
  EXPECT_EQ(s->turn(t + 800ms), 600ms);
  EXPECT_EQ(s->last_heard(), t + 600ms);
  // Turning on time again, a parent that stays silent is lost a heartbeat
  // timeout after what was credited, not later.
  for (auto at = t + 900ms; at <= t + 1600ms; at += 100ms) {
    EXPECT_EQ(s->turn(at), steady_clock::duration::zero());
  }
  EXPECT_FALSE(s->silent(t + 1600ms));
  EXPECT_TRUE(s->silent(t + 1601ms));
  // Away so long that nothing went to the parent for a heartbeat timeout
  // (the period plus the time away): the parent has judged this node lost,
  // and nothing is credited.
  EXPECT_FALSE(s->judged_lost_after(899ms, t + 1600ms));
  EXPECT_TRUE(s->judged_lost_after(900ms, t + 1600ms));
  // Unless it said it was busy meanwhile: the parent heard it then, and
  // judges the silence since.
  s->spoke(t + 1000ms);
  EXPECT_FALSE(s->judged_lost_after(900ms, t + 1600ms)) << "heard 600 ms ago";
  EXPECT_TRUE(s->judged_lost_after(900ms, t + 2000ms)) << "heard 1000 ms ago";
  s->heard(t + 1600ms);
  EXPECT_EQ(s->turn(t + 3600ms), 1900ms);
  EXPECT_EQ(s->last_heard(), t + 1600ms);
  EXPECT_TRUE(s->silent(t + 3600ms));
  // A checkpoint credited by its writer is not credited again by the turn
  // after it.
  s->heard(t + 4s);
  s->not_listening(500ms, t + 4500ms);
  EXPECT_EQ(s->last_heard(), t + 4500ms);
  EXPECT_EQ(s->turn(t + 4600ms), steady_clock::duration::zero());
  EXPECT_EQ(s->last_heard(), t + 4500ms);
}

}  // namespace
}  // namespace fedwan::session
