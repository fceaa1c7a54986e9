#include <gtest/gtest.h>

#include "node/traffic.hpp"

namespace fedwan {
namespace {

wire::FrameHeader header(wire::MsgType t, uint64_t round, uint32_t n, uint32_t payload) {
  wire::FrameHeader h;
  h.type = t;
  h.round = round;
  h.element_count = n;
  h.payload_length = payload;
  return h;
}

TEST(Traffic, ChargesAnchorsToTheRoundWhoseResultTheyCarry) {
  EXPECT_EQ(node::charged_round(header(wire::MsgType::kDelta, 4, 1, 2), 9), 4u);
  EXPECT_EQ(node::charged_round(header(wire::MsgType::kAnchor, 5, 1, 2), 9), 4u);
  EXPECT_EQ(node::charged_round(header(wire::MsgType::kAnchor, 0, 1, 2), 9), 0u);
  wire::FrameHeader full = header(wire::MsgType::kAnchor, 3, 1, 4);
  full.flags = wire::kFlagFullAnchor;
  EXPECT_EQ(node::charged_round(full, 9), 3u);  // a join's full model opens its round
  EXPECT_EQ(node::charged_round(header(wire::MsgType::kHello, 0, 0, 70), 2), 2u);
}

TEST(Traffic, Fp32EquivalentReplacesOnlyThePayload) {
  // 1000 fp16 values + 4-byte scale, 64-byte header, 10 bytes of overhead.
  const auto h = header(wire::MsgType::kDelta, 0, 1000, 2004);
  EXPECT_EQ(node::fp32_equivalent(h, 64 + 2004 + 10), 64u + 4000u + 10u);
  EXPECT_EQ(node::fp32_equivalent(header(wire::MsgType::kHello, 0, 0, 70), 134), 134u);
}

TEST(Traffic, LedgerTakesEachRoundOnce) {
  node::TrafficLedger l;
  l.charge(1, 100, 200);
  l.charge(1, 10, 10);
  l.add(2, node::Traffic{5, 6, 1});
  const node::Traffic t = l.take(1);
  EXPECT_EQ(t.wan_bytes, 110u);
  EXPECT_EQ(t.fp32_bytes, 210u);
  EXPECT_EQ(t.frames, 2u);
  EXPECT_EQ(l.take(1).frames, 0u);
  EXPECT_EQ(l.take(2).wan_bytes, 5u);
}

}  // namespace
}  // namespace fedwan
