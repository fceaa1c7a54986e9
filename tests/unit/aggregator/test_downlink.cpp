// The outboxes an aggregator's frames wait in (aggregator/downlink.hpp):
// the head frame's wait, what counts as a peer that does not read (and
// one that said it is busy), and the
// slots of the children's side. Sending over a link is exercised by every
// federation test.
#include "aggregator/downlink.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

namespace fedwan::aggregator {
namespace {

using Clock = Outbox::Clock;
using std::chrono::milliseconds;

Outgoing frame_of(size_t bytes) {
  return {std::make_shared<const std::vector<uint8_t>>(bytes, 0), wire::FrameHeader{}};
}

TEST(Outbox, TheHeadsWaitStartsWhenItReachesTheHead) {
  Outbox box;
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(box.stuck(t0 + std::chrono::hours(1), milliseconds(1)));  // empty: never
  box.push(frame_of(10), t0);
  box.push(frame_of(20), t0 + milliseconds(500));  // behind the head: its wait has not begun
  EXPECT_FALSE(box.stuck(t0 + milliseconds(900), milliseconds(1000)));
  EXPECT_TRUE(box.stuck(t0 + milliseconds(1001), milliseconds(1000)));
  box.pop(t0 + milliseconds(1001));  // the head went: the next waits from now
  EXPECT_EQ(box.size(), 1u);
  EXPECT_EQ(box.front().frame.size(), 20u);
  EXPECT_FALSE(box.stuck(t0 + milliseconds(2000), milliseconds(1000)));
  EXPECT_TRUE(box.stuck(t0 + milliseconds(2002), milliseconds(1000)));
  EXPECT_EQ(box.sent(), 1u);
  box.clear();
  EXPECT_TRUE(box.empty());
  EXPECT_EQ(box.sent(), 1u);  // what went stays counted
}

TEST(Outbox, APeerThatSaysItIsBusyIsNotJudgedForNotReadingMeanwhile) {
  Outbox box;
  const Clock::time_point t0 = Clock::now();
  box.push(frame_of(10), t0);
  // It writes its checkpoint: a busy heartbeat at 0.9 s, another at 1.8 s.
  box.peer_busy(t0 + milliseconds(900));
  EXPECT_FALSE(box.stuck(t0 + milliseconds(1800), milliseconds(1000)));
  box.peer_busy(t0 + milliseconds(1800));
  EXPECT_FALSE(box.stuck(t0 + milliseconds(2700), milliseconds(1000)));
  // Then silent and still not reading: stuck a timeout after its last word.
  EXPECT_TRUE(box.stuck(t0 + milliseconds(2801), milliseconds(1000)));
  Outbox empty;
  empty.peer_busy(t0);
  EXPECT_FALSE(empty.stuck(t0 + std::chrono::hours(1), milliseconds(1)));
  EXPECT_FALSE(empty.held(t0 + std::chrono::hours(1), milliseconds(1)));
}

TEST(Outbox, APeerIsBusyForAWhileNotForEver) {
  Outbox box;
  const Clock::time_point t0 = Clock::now();
  box.push(frame_of(10), t0);
  box.push(frame_of(20), t0 + milliseconds(100));
  // A busy heartbeat every 0.5 s, never a frame read: never stuck for
  // silence, held once the head has waited past the limit.
  for (int i = 1; i <= 20; ++i) box.peer_busy(t0 + milliseconds(500) * i);
  EXPECT_FALSE(box.stuck(t0 + milliseconds(10'400), milliseconds(1000)));
  EXPECT_FALSE(box.held(t0 + milliseconds(10'000), milliseconds(10'000)));
  EXPECT_TRUE(box.held(t0 + milliseconds(10'001), milliseconds(10'000)));
  // The head went: the next frame's wait starts from then.
  box.pop(t0 + milliseconds(10'001));
  EXPECT_FALSE(box.held(t0 + milliseconds(20'001), milliseconds(10'000)));
  EXPECT_TRUE(box.held(t0 + milliseconds(20'002), milliseconds(10'000)));
}

TEST(Downlink, SlotsFollowTheOrderChildrenAreAdded) {
  Downlink down;
  EXPECT_EQ(down.add("site-0"), 0u);
  EXPECT_EQ(down.add("region-1"), 1u);
  EXPECT_EQ(down.slot("region-1"), 1u);
  EXPECT_EQ(down.find("site-0"), std::optional<size_t>(0));
  EXPECT_EQ(down.find("site-9"), std::nullopt);
  EXPECT_THROW((void)down.slot("site-9"), std::out_of_range);
}

TEST(Downlink, AQueuedFrameCarriesItsPayloadLength) {
  Downlink down;
  down.add("site-0");
  down.add("site-1");
  EXPECT_TRUE(down.empty());
  wire::FrameHeader h;
  h.type = wire::MsgType::kAnchor;
  down.queue(1, std::make_shared<const std::vector<uint8_t>>(wire::kHeaderSize + 12, 0), h);
  EXPECT_FALSE(down.empty());
  EXPECT_EQ(down.waiting(), 1u);
  EXPECT_TRUE(down.outbox(0).empty());
  // make_frame() sets the length in the bytes only; the ledger reads it here.
  EXPECT_EQ(down.outbox(1).front().header.payload_length, 12u);
  EXPECT_EQ(down.outbox(1).front().header.type, wire::MsgType::kAnchor);
  down.outbox(1).clear();
  EXPECT_TRUE(down.empty());
}

}  // namespace
}  // namespace fedwan::aggregator
