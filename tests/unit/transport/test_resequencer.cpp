// Resequencer: frames of a link striped over several connections come back
// in an order the protocol can rely on (barriers after everything before
// them, chunks as they come once the barriers before them are in, pieces in
// their own order); gaps that never fill are given up after the wait, at the
// hold limit or past the replay window, late frames still go on, a new
// session starts over.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "transport/resequencer.hpp"

namespace fedwan::transport {
namespace {

using namespace std::chrono_literals;
using Clock = Resequencer::Clock;

Resequencer::Frame frame(uint64_t tag) {
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(tag >> (8 * i));
  Resequencer::Frame f;
  f.message = Message(bytes);
  f.frame_size = bytes.size();
  return f;
}

uint64_t tag_of(const Resequencer::Frame& f) {
  uint64_t t = 0;
  for (int i = 0; i < 8; ++i) t |= uint64_t(f.message.data()[i]) << (8 * i);
  return t;
}

std::vector<uint64_t> pop_all(Resequencer& r, Clock::time_point now) {
  std::vector<uint64_t> out;
  Resequencer::Frame f;
  while (r.pop(&f, now)) out.push_back(tag_of(f));
  return out;
}

void push(Resequencer& r, uint64_t seq, Clock::time_point now, uint64_t session = 1) {
  r.push({session, seq}, frame(seq), now);
}

using wire::OrderClass;

// A frame of class `c` sealed after `barriers` barriers and `pieces` pieces.
void push_as(Resequencer& r, uint64_t seq, OrderClass c, uint16_t barriers, uint16_t pieces,
             Clock::time_point now) {
  r.push({1, seq, c, wire::OrderTag{barriers, pieces}}, frame(seq), now);
}

TEST(Resequencer, InOrderFramesPassStraightThrough) {
  Resequencer r({64, 1000ms});
  const auto t = Clock::now();
  for (uint64_t s = 0; s < 5; ++s) push(r, s, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(r.stats().held, 0u);
  EXPECT_EQ(r.wake_at(), Clock::time_point::max());
}

TEST(Resequencer, OvertakenFramesWaitForTheOneBefore) {
  Resequencer r({64, 1000ms});
  const auto t = Clock::now();
  push(r, 0, t);
  push(r, 2, t);
  push(r, 3, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{0}));
  EXPECT_EQ(r.holding(), 2u);
  EXPECT_EQ(r.wake_at(), t + 1000ms);
  push(r, 1, t + 10ms);
  EXPECT_EQ(pop_all(r, t + 10ms), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(r.stats().held, 2u);
  EXPECT_EQ(r.stats().gaps_skipped, 0u);
}

TEST(Resequencer, ConsumedMessagesUseUpTheirNumber) {
  // A sealed handshake confirmation (seq 0) is consumed by the security layer.
  Resequencer r({64, 1000ms});
  const auto t = Clock::now();
  push(r, 2, t);
  r.push({1, 1}, std::nullopt, t);
  EXPECT_TRUE(pop_all(r, t).empty());
  r.push({1, 0}, std::nullopt, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{2}));
}

TEST(Resequencer, AGapThatNeverFillsIsGivenUpAfterTheWait) {
  Resequencer r({64, 500ms});
  const auto t = Clock::now();
  push(r, 0, t);
  push(r, 2, t + 1ms);
  push(r, 3, t + 2ms);
  EXPECT_EQ(pop_all(r, t + 400ms), (std::vector<uint64_t>{0}));
  EXPECT_EQ(pop_all(r, t + 501ms), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(r.stats().gaps_skipped, 1u);
  // The lost frame, should it come after all, still goes on.
  push(r, 1, t + 600ms);
  EXPECT_EQ(pop_all(r, t + 600ms), (std::vector<uint64_t>{1}));
  EXPECT_EQ(r.stats().late, 1u);
  push(r, 4, t + 601ms);
  EXPECT_EQ(pop_all(r, t + 601ms), (std::vector<uint64_t>{4}));
}

TEST(Resequencer, TheWaitRestartsWhenTheGapBeforeFills) {
  Resequencer r({64, 500ms});
  const auto t = Clock::now();
  push(r, 1, t);
  push(r, 3, t);
  push(r, 0, t + 400ms);  // fills the first gap; the second's wait starts now
  EXPECT_EQ(pop_all(r, t + 400ms), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(r.wake_at(), t + 900ms);
  EXPECT_TRUE(pop_all(r, t + 899ms).empty());
  EXPECT_EQ(pop_all(r, t + 900ms), (std::vector<uint64_t>{3}));
}

TEST(Resequencer, HoldingMoreThanTheLimitGivesTheGapUpAtOnce) {
  Resequencer r({4, 60s});
  const auto t = Clock::now();
  for (uint64_t s = 1; s <= 4; ++s) push(r, s, t);
  EXPECT_TRUE(pop_all(r, t).empty());
  push(r, 5, t);  // the fifth held frame
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(r.stats().gaps_skipped, 1u);
  EXPECT_EQ(r.holding(), 0u);
}

TEST(Resequencer, ANewSessionStartsOverAndDropsWhatWaited) {
  Resequencer r({64, 60s});
  const auto t = Clock::now();
  push(r, 0, t, 1);
  push(r, 2, t, 1);  // waits for 1, which the old session never sends
  push(r, 0, t, 2);
  push(r, 1, t, 2);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{0, 0, 1}));
  EXPECT_EQ(r.stats().dropped, 1u);
}

TEST(Resequencer, ClearDropsEverythingHeld) {
  Resequencer r({64, 60s});
  const auto t = Clock::now();
  push(r, 0, t);
  push(r, 2, t);
  r.clear();
  EXPECT_EQ(r.holding(), 0u);
  EXPECT_EQ(r.stats().dropped, 2u);
  EXPECT_TRUE(pop_all(r, t).empty());
}

TEST(Resequencer, ReadyFramesAreDueAtOnce) {
  Resequencer r({64, 1000ms});
  const auto t = Clock::now();
  push(r, 0, t);
  EXPECT_EQ(r.wake_at(), Clock::time_point::min());
}

TEST(Resequencer, ChunksOvertakeAMissingChunk) {
  Resequencer r({64, 1000ms});
  const auto t = Clock::now();
  push_as(r, 0, OrderClass::kBarrier, 0, 0, t);  // a welcome
  push_as(r, 2, OrderClass::kChunk, 1, 0, t);    // chunk 1 is on a slow connection
  push_as(r, 3, OrderClass::kChunk, 1, 0, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{0, 2, 3}));
  EXPECT_EQ(r.stats().overtook, 2u);
  EXPECT_EQ(r.stats().held, 0u);
  // A heartbeat waits for the chunk before it; the chunks after it do not.
  push_as(r, 4, OrderClass::kFollow, 1, 0, t);
  push_as(r, 5, OrderClass::kChunk, 1, 0, t);
  // A barrier waits for everything, and what follows it waits for it.
  push_as(r, 6, OrderClass::kBarrier, 1, 0, t);
  push_as(r, 7, OrderClass::kChunk, 2, 0, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{5}));
  EXPECT_EQ(r.holding(), 3u);
  push_as(r, 1, OrderClass::kChunk, 1, 0, t + 5ms);
  EXPECT_EQ(pop_all(r, t + 5ms), (std::vector<uint64_t>{1, 4, 6, 7}));
  EXPECT_EQ(r.stats().gaps_skipped, 0u);
  EXPECT_EQ(r.wake_at(), Clock::time_point::max());
}

TEST(Resequencer, AChunkWaitsForTheBarriersSealedBeforeIt) {
  Resequencer r({64, 1000ms});
  const auto t = Clock::now();
  push_as(r, 0, OrderClass::kBarrier, 0, 0, t);
  push_as(r, 2, OrderClass::kChunk, 2, 0, t);  // sealed after barrier 1, still missing
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{0}));
  push_as(r, 1, OrderClass::kBarrier, 1, 0, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{1, 2}));
}

TEST(Resequencer, PiecesKeepTheirOwnOrderButPassChunks) {
  Resequencer r({64, 1000ms});
  const auto t = Clock::now();
  push_as(r, 1, OrderClass::kPiece, 0, 0, t);  // chunk 0 is missing
  push_as(r, 4, OrderClass::kPiece, 0, 2, t);  // piece 2 before piece 1 (seq 3)
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{1}));
  push_as(r, 3, OrderClass::kPiece, 0, 1, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{3, 4}));
  push_as(r, 2, OrderClass::kChunk, 0, 1, t);
  push_as(r, 0, OrderClass::kChunk, 0, 0, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{2, 0}));
  EXPECT_EQ(r.stats().gaps_skipped, 0u);
}

TEST(Resequencer, AMissingChunkIsStillGivenUpAfterTheWait) {
  // Nothing waits for it, but a frame that never comes means a connection
  // broke: the owner must hear of it.
  Resequencer r({64, 500ms});
  const auto t = Clock::now();
  push_as(r, 0, OrderClass::kChunk, 0, 0, t);
  push_as(r, 2, OrderClass::kChunk, 0, 0, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{0, 2}));
  EXPECT_EQ(r.wake_at(), t + 500ms);
  EXPECT_TRUE(pop_all(r, t + 499ms).empty());
  EXPECT_EQ(r.stats().gaps_skipped, 0u);
  EXPECT_TRUE(pop_all(r, t + 500ms).empty());
  EXPECT_EQ(r.stats().gaps_skipped, 1u);
  EXPECT_EQ(r.wake_at(), Clock::time_point::max());
}

TEST(Resequencer, AFrameFarPastAMissingOneGivesItUp) {
  // The replay window refuses a frame that far behind: it can never come.
  Resequencer r({64, 60s});
  const auto t = Clock::now();
  push_as(r, 0, OrderClass::kChunk, 0, 0, t);
  push_as(r, 2, OrderClass::kChunk, 0, 0, t);
  push_as(r, Resequencer::kSpan, OrderClass::kChunk, 0, 0, t);
  EXPECT_EQ(r.stats().gaps_skipped, 0u);
  push_as(r, 1 + Resequencer::kSpan, OrderClass::kChunk, 0, 0, t);
  EXPECT_GE(r.stats().gaps_skipped, 1u);
  EXPECT_EQ(pop_all(r, t).size(), 4u);
}

TEST(Resequencer, TagsThatCanNeverBeMetEndTheLinkAtTheHoldLimit) {
  // A dishonest sender's chunks claim barriers it never sent.
  Resequencer r({4, 60s});
  const auto t = Clock::now();
  for (uint64_t s = 0; s < 4; ++s) push_as(r, s, OrderClass::kChunk, 9, 0, t);
  EXPECT_TRUE(pop_all(r, t).empty());
  EXPECT_EQ(r.stats().gaps_skipped, 0u);
  push_as(r, 4, OrderClass::kChunk, 9, 0, t);
  EXPECT_EQ(r.stats().gaps_skipped, 1u);
  EXPECT_EQ(r.holding(), 5u);  // ready: the owner fails the link
}

TEST(Resequencer, CountsWrapAround) {
  Resequencer r({64, 1000ms});
  const auto t = Clock::now();
  // 65536 barriers, then a chunk tagged 0 again (modulo 2^16) and one
  // tagged 1 that must wait for the next barrier.
  uint64_t seq = 0;
  for (uint32_t b = 0; b < 65536; ++b, ++seq) {
    push_as(r, seq, OrderClass::kBarrier, static_cast<uint16_t>(b), 0, t);
  }
  EXPECT_EQ(pop_all(r, t).size(), 65536u);
  push_as(r, seq + 1, OrderClass::kChunk, 1, 0, t);
  push_as(r, seq + 2, OrderClass::kChunk, 0, 0, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{seq + 2}));
  push_as(r, seq, OrderClass::kBarrier, 0, 0, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{seq, seq + 1}));
}

TEST(Resequencer, OneConnectionPassesOverALostFrameAndStaysInStepForASecond) {
  // streams: auto before its second connection: a frame dropped or refused
  // on the way is simply missing, as on any one connection.
  Resequencer r({64, 500ms});
  r.set_striped(false);
  const auto t = Clock::now();
  push_as(r, 0, OrderClass::kBarrier, 0, 0, t);
  push_as(r, 1, OrderClass::kChunk, 1, 0, t);
  push_as(r, 3, OrderClass::kChunk, 2, 0, t);  // barrier 2 was lost
  push_as(r, 4, OrderClass::kPiece, 2, 0, t);
  EXPECT_EQ(pop_all(r, t + 1s), (std::vector<uint64_t>{0, 1, 3, 4}));
  EXPECT_EQ(r.stats().gaps_skipped, 0u);
  EXPECT_EQ(r.wake_at(), Clock::time_point::max());
  // A second connection opens: 6 overtakes 5, and the counts carried over.
  r.set_striped(true);
  push_as(r, 6, OrderClass::kChunk, 2, 1, t);
  push_as(r, 7, OrderClass::kBarrier, 2, 1, t);
  push_as(r, 8, OrderClass::kPiece, 3, 1, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{6}));
  push_as(r, 5, OrderClass::kChunk, 2, 1, t);
  EXPECT_EQ(pop_all(r, t), (std::vector<uint64_t>{5, 7, 8}));
  EXPECT_EQ(r.stats().gaps_skipped, 0u);
}

}  // namespace
}  // namespace fedwan::transport
