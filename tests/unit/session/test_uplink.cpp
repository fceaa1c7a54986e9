// session::Uplink: the child's end of the parent protocol that a site and a
// region share. Its bookkeeping, over a link to a parent that is not there
// (nothing needs to cross it): the welcome's progress clock, the heartbeats
// that show the parent ahead, what a welcome and a resume mean.
#include "session/uplink.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>

#include "harness/federation_fixture.hpp"
#include "harness/temp_dir.hpp"
#include "node/node_security.hpp"
#include "transport/transport.hpp"

namespace fedwan::session {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class UplinkTest : public ::testing::Test {
 protected:
  UplinkTest() {
    FederationSpec f;
    f.rounds = 2;
    topo_ = testing::make_tree(dir_.path(), 0, 1, f, /*in_process=*/true);
    SecurityOptions so;
    so.insecure_plaintext = true;
    security_ = std::make_unique<node::NodeSecurity>(so, topo_, topo_.node("site-0"));
    transport_ = transport::make_transport(topo_.node("root").endpoint);
    ParentSession::Options o;
    o.heartbeat = 100ms;
    o.heartbeat_timeout = 1000ms;
    o.log_name = "site:site-0";
    uplink_ = std::make_unique<Uplink>(topo_, topo_.node("site-0"), *transport_, *security_, o);
  }

  testing::TempDir dir_;
  Topology topo_;
  std::unique_ptr<node::NodeSecurity> security_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<Uplink> uplink_;
};

TEST_F(UplinkTest, NamesItsParent) { EXPECT_EQ(uplink_->parent_id(), "root"); }

TEST_F(UplinkTest, AHelloIsOverdueAHeartbeatTimeoutAfterTheLastProgress) {
  const auto t = Clock::now();
  uplink_->progressed(t);
  EXPECT_FALSE(uplink_->hello_overdue(t + 500ms));
  EXPECT_FALSE(uplink_->hello_overdue(t + 1000ms));
  EXPECT_TRUE(uplink_->hello_overdue(t + 1001ms));
  uplink_->progressed(t + 900ms);  // a piece of the model came
  EXPECT_FALSE(uplink_->hello_overdue(t + 1500ms));
}

TEST_F(UplinkTest, TheThirdHeartbeatInARowShowingTheParentAheadRejoins) {
  EXPECT_FALSE(uplink_->behind(true));
  EXPECT_FALSE(uplink_->behind(true));
  EXPECT_TRUE(uplink_->behind(true));
  // The count starts over after a rejoin ...
  EXPECT_FALSE(uplink_->behind(true));
  EXPECT_FALSE(uplink_->behind(true));
  // ... and after any heartbeat that does not show it behind.
  EXPECT_FALSE(uplink_->behind(false));
  EXPECT_FALSE(uplink_->behind(true));
  EXPECT_FALSE(uplink_->behind(true));
  EXPECT_TRUE(uplink_->behind(true));
}

TEST_F(UplinkTest, AWelcomePutsItInTheFederationAndSaysWhetherReplicasAreKept) {
  EXPECT_FALSE(uplink_->welcomed_once());
  EXPECT_FALSE(uplink_->in_federation());
  uplink_->welcomed(wire::kFlagKeepsReplicas | wire::kFlagNoChange);
  EXPECT_TRUE(uplink_->welcomed_once());
  EXPECT_TRUE(uplink_->in_federation());
  EXPECT_TRUE(uplink_->parent_keeps_replicas());
  // Each welcome says it again: a parent restarted without replicas.
  uplink_->welcomed(0);
  EXPECT_FALSE(uplink_->parent_keeps_replicas());
  EXPECT_TRUE(uplink_->welcomed_once());
}

TEST_F(UplinkTest, AResumedNodeIsInTheFederationBeforeAnyWelcome) {
  uplink_->resumed();
  EXPECT_TRUE(uplink_->in_federation());
  EXPECT_FALSE(uplink_->welcomed_once());
}

TEST_F(UplinkTest, ResendsWaitTheHeartbeatTimeoutWithoutProgress) {
  const auto t = Clock::now();
  UpdateResend& r = uplink_->resend();
  r.begin(0, t);
  r.handed_over(t);
  wire::NeedUpdatePayload need;
  need.delivered = 1;
  need.missing = {1};
  need.progress_known = true;
  EXPECT_TRUE(r.on_need(0, need, t + 500ms).empty());   // chunk 0 arrived: still arriving
  EXPECT_TRUE(r.on_need(0, need, t + 1400ms).empty());  // stalled, not for long enough
  EXPECT_EQ(r.on_need(0, need, t + 1600ms), std::vector<uint32_t>{1});
}

TEST_F(UplinkTest, NoCheckpointGoesUpUntilOneIsStarted) {
  EXPECT_FALSE(uplink_->upload().active());
  EXPECT_ANY_THROW(uplink_->upload().start(dir_.path() / "missing.ckpt", 0, 4096));
  EXPECT_FALSE(uplink_->upload().active());
}

TEST_F(UplinkTest, ACheckpointOfferedMeanwhileWaitsForTheOneOnItsWay) {
  const auto a = dir_.path() / "a.fwck";
  const auto b = dir_.path() / "b.fwck";
  for (const auto& p : {a, b}) std::ofstream(p) << std::string(10000, 'x');
  checkpoint::CheckpointUpload& up = uplink_->upload();
  up.offer(a, 1, 4096);  // nothing on its way: begins at once
  EXPECT_TRUE(up.active());
  EXPECT_EQ(up.round(), 1u);
  up.offer(b, 2, 4096);  // queued behind round 1, not replacing it
  EXPECT_EQ(up.round(), 1u);
  up.restart();  // a new session: the newest offer goes instead
  EXPECT_EQ(up.round(), 2u);
  up.restart();  // and again from its first piece
  EXPECT_EQ(up.round(), 2u);
  EXPECT_TRUE(up.active());
  up.start(a, 3, 4096);  // start replaces whatever was on its way
  EXPECT_EQ(up.round(), 3u);
  up.cancel();
  EXPECT_FALSE(up.active());
  EXPECT_ANY_THROW(up.offer(dir_.path() / "missing.fwck", 4, 4096));
  EXPECT_FALSE(up.active());
}

}  // namespace
}  // namespace fedwan::session
