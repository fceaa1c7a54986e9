// Frames in pieces over striped links (fragments.hpp): big frames go in
// pieces over every connection of a long link and arrive whole both ways;
// a parent sends in pieces to a child whose connections it measured as
// long itself; pieces that do not fit, or come from a child that is not
// striped, are refused.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "striped_links_fixture.hpp"

namespace fedwan::transport {
namespace {

using namespace striped;  // NOLINT: the fixture

TEST_F(StripedLinks, BigFramesGoInPiecesOverEveryConnectionAndArriveWholeBothWays) {
  // Frames of 200 KB: seven pieces each, spread over a's three connections
  // (one of them slow both ways), put back together, opened, and delivered
  // as any frame: chunks as they come, pieces of a checkpoint in order.
  const auto slow = faults_->add(FaultRule::delay_by(20ms).on(endpoint(), "a~1"));
  const auto second_up = faults_->add(FaultRule::observe().on(endpoint(), "a~2").up());
  const auto second_down = faults_->add(FaultRule::observe().on(endpoint(), "a~2").down());
  start_parent();
  // Pieces only over a long link: the transport says this one is (50 ms).
  faults_->report_loss(true);
  SecurityOptions so = options_for("a");
  so.rekey_after_frames = 7;
  auto child = connect("a", 3, so);
  exchange(*child, "a", 40, /*pieces=*/true, 200'000);
  EXPECT_EQ(sorted(up_), iota(40));
  EXPECT_EQ(sorted(down_), iota(40));
  EXPECT_EQ(pieces_of(up_), pieces_of(iota(40))) << "pieces in the order they were sent";
  EXPECT_EQ(pieces_of(down_), pieces_of(iota(40)));
  // 40 frames each way, about 7 pieces each, over three connections.
  EXPECT_GT(faults_->hits(second_up), 40u) << "pieces, not frames, went over it";
  EXPECT_GT(faults_->hits(second_down), 40u);
  EXPECT_GT(faults_->hits(slow), 0u);
  EXPECT_FALSE(child->sending());
  EXPECT_FALSE(children_->sending());
  EXPECT_EQ(child->reordering().gaps_skipped, 0u);
  EXPECT_EQ(children_->counters().rejected, 0u);
  EXPECT_EQ(child->counters().rejected, 0u);
}

TEST_F(StripedLinks, AParentSendsInPiecesToAChildWhoseConnectionsItMeasuredAsLong) {
  // The child sees a short link (no round trip is long to it, however
  // slow a loaded machine makes loopback) and sends whole frames; the
  // parent counts every connection as long (a threshold of 0 us there and
  // back) and sends its own frames in pieces from the child's first frame
  // on.
  const auto second_up = faults_->add(FaultRule::observe().on(endpoint(), "a~2").up());
  const auto second_down = faults_->add(FaultRule::observe().on(endpoint(), "a~2").down());
  LinkOptions parent;
  parent.long_link_rtt_us = 0;
  start_parent(5000ms, parent);
  LinkOptions short_link;
  short_link.long_link_rtt_us = std::numeric_limits<uint32_t>::max();
  auto child = connect("a", 3, {}, 5000ms, false, short_link);
  exchange(*child, "a", 30, /*pieces=*/false, 200'000);
  EXPECT_EQ(sorted(up_), iota(30));
  EXPECT_EQ(sorted(down_), iota(30));
  EXPECT_LE(faults_->hits(second_up), 30u) << "the child's frames went whole";
  EXPECT_GT(faults_->hits(second_down), 30u) << "the parent's went in pieces";
  EXPECT_EQ(children_->counters().rejected, 0u);
  EXPECT_EQ(child->counters().rejected, 0u);
}

TEST_F(StripedLinks, PiecesThatDoNotFitOrComeFromAnUnstripedChildAreRefused) {
  start_parent();
  auto child = connect("a", 2);
  exchange(*child, "a", 4);
  // A piece that names an impossible frame, on a's further connection and
  // on its first: refused with the reason, nothing held for it.
  std::vector<uint8_t> bad(kFragmentHeaderBytes + 100, 0);
  std::memcpy(bad.data(), "FWFG", 4);
  bad[4] = 1;
  bad[16] = 0xff;  // a frame of 255 bytes in pieces of 0
  for (const char* id : {"a~1", "b"}) {
    auto intruder = transport_->connect(endpoint(), id, {});
    const auto end = Clock::now() + 2s;
    while (intruder->try_send("", bad.data(), bad.size()) != SendResult::kSent &&
           Clock::now() < end) {
      std::this_thread::sleep_for(5ms);
    }
    const size_t drops = drops_.size();
    ASSERT_TRUE(pump(*child, [&] { return drops_.size() > drops; })) << id;
    if (std::string(id) == "a~1") {
      EXPECT_NE(drops_.back().find("fragment refused"), std::string::npos) << drops_.back();
    } else {
      // b has no session and one connection: its pieces are no frames.
      EXPECT_NE(drops_.back().find("fragments come only from a child striped"), std::string::npos)
          << drops_.back();
    }
  }
  EXPECT_EQ(up_.size(), 4u);
}

}  // namespace
}  // namespace fedwan::transport
