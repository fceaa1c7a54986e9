// Frames that carry messages other than tensors (wire/frame.hpp): hello and
// telemetry payloads, type names, handshakes, checkpoint pieces and signals,
// and the replica flags.
#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "frame_test_util.hpp"
#include "wire/frame.hpp"

namespace fedwan::wire {
namespace {

TEST(Frame, HelloRoundTrip) {
  HelloPayload p;
  p.node_id = "site-a.eu_1";
  for (int i = 0; i < 32; ++i) {
    p.topology_digest[i] = static_cast<uint8_t>(i);
    p.model_digest[i] = static_cast<uint8_t>(255 - i);
  }
  Bytes b = encode_hello(p);
  HelloPayload q;
  ASSERT_TRUE(decode_hello(b.data(), b.size(), &q));
  EXPECT_EQ(q.node_id, p.node_id);
  EXPECT_EQ(q.topology_digest, p.topology_digest);
  EXPECT_EQ(q.model_digest, p.model_digest);

  p.node_id = std::string(64, 'z');
  b = encode_hello(p);
  ASSERT_TRUE(decode_hello(b.data(), b.size(), &q));
  EXPECT_EQ(q.node_id, p.node_id);
}

TEST(Frame, HelloRejectsMalformed) {
  HelloPayload p;
  p.node_id = "site-a";
  Bytes good = encode_hello(p);
  HelloPayload q;
  for (size_t len = 0; len < good.size(); ++len) {
    EXPECT_FALSE(decode_hello(good.data(), len, &q)) << len;
  }
  Bytes longer = good;
  longer.push_back(0);
  EXPECT_FALSE(decode_hello(longer.data(), longer.size(), &q));
  EXPECT_FALSE(decode_hello(nullptr, 0, &q));
  EXPECT_FALSE(decode_hello(good.data(), good.size(), nullptr));

  auto raw = [](const std::string& id, size_t declared) {
    Bytes b;
    b.push_back(static_cast<uint8_t>(declared));
    b.insert(b.end(), id.begin(), id.end());
    b.resize(b.size() + 64);
    return b;
  };
  for (const std::string& id :
       std::vector<std::string>{"", "a b", "a/b", "x\xc3\xa9", std::string("a\0b", 3), "a:b"}) {
    Bytes b = raw(id, id.size());
    EXPECT_FALSE(decode_hello(b.data(), b.size(), &q)) << id;
  }
  Bytes too_long = raw(std::string(65, 'a'), 65);
  EXPECT_FALSE(decode_hello(too_long.data(), too_long.size(), &q));
  Bytes lies = raw("abcd", 3);  // declared length disagrees with the size
  EXPECT_FALSE(decode_hello(lies.data(), lies.size(), &q));

  for (const std::string& id : std::vector<std::string>{"", "a b", std::string(65, 'a')}) {
    p.node_id = id;
    EXPECT_THROW(encode_hello(p), ConfigError) << id;
  }
}

TEST(Frame, TelemetryRoundTripAndRejects) {
  TelemetryPayload p{~uint64_t{0}, 1234567890123ull, 42};
  Bytes b = encode_telemetry(p);
  TelemetryPayload q;
  ASSERT_TRUE(decode_telemetry(b.data(), b.size(), &q));
  EXPECT_EQ(q.wan_bytes, p.wan_bytes);
  EXPECT_EQ(q.fp32_bytes, p.fp32_bytes);
  EXPECT_EQ(q.frames, p.frames);
  for (size_t len = 0; len < b.size(); ++len) {
    EXPECT_FALSE(decode_telemetry(b.data(), len, &q)) << len;
  }
  Bytes longer = b;
  longer.push_back(0);
  EXPECT_FALSE(decode_telemetry(longer.data(), longer.size(), &q));
  Bytes wrong_count = b;
  wrong_count[0] = 4;
  EXPECT_FALSE(decode_telemetry(wrong_count.data(), wrong_count.size(), &q));
  EXPECT_FALSE(decode_telemetry(nullptr, 0, &q));
}

TEST(Frame, Names) {
  std::set<std::string> types;
  for (MsgType t : kAllTypes) types.insert(msg_type_name(t));
  EXPECT_EQ(types.size(), 7u);
  EXPECT_STREQ(msg_type_name(MsgType::kDelta), "delta");
  EXPECT_STREQ(msg_type_name(static_cast<MsgType>(99)), "unknown");
  std::set<std::string> reasons;
  for (int r = 0; r <= static_cast<int>(RejectReason::kPayloadTooLarge); ++r) {
    reasons.insert(reject_reason_name(static_cast<RejectReason>(r)));
  }
  EXPECT_EQ(reasons.size(), static_cast<size_t>(RejectReason::kPayloadTooLarge) + 1);
  EXPECT_EQ(reasons.count("unknown"), 0u);
}

TEST(Frame, HandshakeCarriesACipherIdAndNoTensor) {
  for (int id = 0; id <= 255; ++id) {
    Bytes b = control_frame(MsgType::kHandshake, {1, 2, 3});
    b[kOffCodec] = static_cast<uint8_t>(id);
    EXPECT_EQ(reason(b),
              id <= fedwan::wire::kMaxAeadId ? RejectReason::kNone : RejectReason::kBadCodec)
        << id;
  }
  Bytes chunked = control_frame(MsgType::kHandshake, {1});
  set_u32(chunked, kOffChunkCount, 1);
  EXPECT_EQ(reason(chunked), RejectReason::kBadChunk);
  Bytes sealed_flag = control_frame(MsgType::kHandshake, {1});
  sealed_flag[kOffFlags] = 0x80;
  EXPECT_EQ(reason(sealed_flag), RejectReason::kBadReserved);
}

}  // namespace
namespace {
// A piece of a checkpoint file: `n` bytes of a file of `total`, piece i of count.
Bytes checkpoint_piece(uint32_t n, uint64_t total, uint32_t index, uint32_t count) {
  FrameHeader h;
  h.type = MsgType::kCheckpoint;
  h.round = 7;
  h.chunk_index = index;
  h.chunk_count = count;
  h.element_count = n;
  h.total_elements = total;
  Bytes payload(n, 0x5a);
  return encode_frame(h, payload.data(), payload.size());
}
Bytes checkpoint_signal(uint8_t flags) {
  FrameHeader h;
  h.type = MsgType::kCheckpoint;
  h.flags = flags;
  h.round = 7;
  return encode_frame(h, nullptr, 0);
}
}  // namespace

TEST(Frame, CheckpointPiecesAndSignals) {
  EXPECT_EQ(reason(checkpoint_piece(100, 250, 1, 3)), RejectReason::kNone);
  EXPECT_EQ(reason(checkpoint_piece(250, 250, 0, 1)), RejectReason::kNone);
  EXPECT_EQ(reason(checkpoint_signal(kFlagReplicaStored)), RejectReason::kNone);
  EXPECT_EQ(reason(checkpoint_signal(kFlagNoReplica)), RejectReason::kNone);
  ParsedFrame f = parse_frame(checkpoint_piece(100, 250, 1, 3).data(), 64 + 100);
  ASSERT_TRUE(f.ok()) << f.detail;
  EXPECT_EQ(f.payload_size, 100u);
  EXPECT_STREQ(msg_type_name(MsgType::kCheckpoint), "checkpoint");

  EXPECT_EQ(reason(checkpoint_piece(100, 250, 3, 3)), RejectReason::kBadChunk);
  EXPECT_EQ(reason(checkpoint_piece(100, 250, 0, 0)), RejectReason::kBadChunk);
  EXPECT_EQ(reason(checkpoint_piece(100, 99, 0, 2)), RejectReason::kBadElements);
  FrameLimits lim;
  lim.max_piece_bytes = 64;
  EXPECT_EQ(reason(checkpoint_piece(65, 250, 0, 4), lim), RejectReason::kBadElements);
  lim = {};
  lim.max_checkpoint_bytes = 200;
  EXPECT_EQ(reason(checkpoint_piece(100, 250, 0, 3), lim), RejectReason::kBadElements);
  // A piece whose element_count disagrees with its payload.
  Bytes b = checkpoint_piece(100, 250, 1, 3);
  set_u32(b, kOffElements, 99);
  EXPECT_EQ(reason(b), RejectReason::kBadPayloadSize);
  b = checkpoint_piece(100, 250, 1, 3);
  set_u32(b, kOffElements, 0);
  EXPECT_EQ(reason(b), RejectReason::kBadElements);
  b = checkpoint_piece(100, 250, 1, 3);
  b[kOffCodec] = 1;
  EXPECT_EQ(reason(b), RejectReason::kBadCodec);
  b = checkpoint_piece(100, 250, 1, 3);
  set_u64(b, kOffWeight, 0x3ff0000000000000ull);  // 1.0
  EXPECT_EQ(reason(b), RejectReason::kBadWeight);
  // Signals: one known bit, nothing else.
  EXPECT_EQ(reason(checkpoint_signal(kFlagReplicaStored | kFlagNoReplica)),
            RejectReason::kBadReserved);
  EXPECT_EQ(reason(checkpoint_signal(0x04)), RejectReason::kBadReserved);
  b = checkpoint_signal(kFlagReplicaStored);
  set_u32(b, kOffChunkCount, 1);
  EXPECT_EQ(reason(b), RejectReason::kBadChunk);
  b = checkpoint_signal(kFlagNoReplica);
  set_u64(b, kOffTotal, 5);
  EXPECT_EQ(reason(b), RejectReason::kBadElements);
  FrameHeader h;
  h.type = MsgType::kCheckpoint;
  h.flags = kFlagReplicaStored;
  Bytes payload(3, 1);
  b = encode_frame(h, payload.data(), payload.size());
  EXPECT_EQ(reason(b), RejectReason::kBadPayloadSize);
}

TEST(Frame, ReplicaFlagsOnlyOnTheirTypes) {
  Bytes hello = control_frame(MsgType::kHello);
  hello[kOffFlags] = kFlagNeedReplica | kFlagSent;
  EXPECT_EQ(reason(hello), RejectReason::kNone);
  Bytes welcome = control_frame(MsgType::kWelcome);
  welcome[kOffFlags] = kFlagKeepsReplicas | kFlagNoChange;
  EXPECT_EQ(reason(welcome), RejectReason::kNone);
  welcome[kOffFlags] = kFlagLeaving;
  EXPECT_EQ(reason(welcome), RejectReason::kBadReserved);
  Bytes heartbeat = control_frame(MsgType::kHeartbeat, {});
  heartbeat[kOffFlags] = kFlagNeedReplica;
  EXPECT_EQ(reason(heartbeat), RejectReason::kBadReserved);
}

TEST(Frame, MembershipFlagsOnlyOnHeartbeats) {
  Bytes heartbeat = control_frame(MsgType::kHeartbeat, {});
  for (uint8_t f : {kFlagLeaving, kFlagPausing, kFlagMembership}) {
    heartbeat[kOffFlags] = f;
    EXPECT_EQ(reason(heartbeat), RejectReason::kNone) << int{f};
    Bytes hello = control_frame(MsgType::kHello);
    hello[kOffFlags] = f;
    EXPECT_EQ(reason(hello), RejectReason::kBadReserved) << int{f};
  }
}

TEST(Frame, NoSessionOnlyOnHandshakes) {
  Bytes handshake = control_frame(MsgType::kHandshake, {});
  handshake[kOffFlags] = kFlagNoSession;
  EXPECT_EQ(reason(handshake), RejectReason::kNone);
  handshake[kOffFlags] = static_cast<uint8_t>(kFlagNoSession | 0x02);
  EXPECT_EQ(reason(handshake), RejectReason::kBadReserved);
  for (MsgType t : {MsgType::kReject, MsgType::kTelemetry, MsgType::kDone}) {
    Bytes other = control_frame(t, {});
    other[kOffFlags] = kFlagNoSession;
    EXPECT_EQ(reason(other), RejectReason::kBadReserved) << int(t);
  }
}

TEST(Frame, PaceGoesAloneOnHeartbeats) {
  Bytes heartbeat = control_frame(MsgType::kHeartbeat, encode_pace({3, 4}));
  heartbeat[kOffFlags] = kFlagPace;
  EXPECT_EQ(reason(heartbeat), RejectReason::kNone);
  for (uint8_t other : {kFlagNeedUpdate, kFlagLeaving, kFlagPausing, kFlagMembership}) {
    heartbeat[kOffFlags] = static_cast<uint8_t>(kFlagPace | other);
    EXPECT_EQ(reason(heartbeat), RejectReason::kBadReserved) << int{other};
  }
  Bytes welcome = control_frame(MsgType::kWelcome);
  welcome[kOffFlags] = kFlagPace;  // 0x01 there is not pace
  EXPECT_EQ(reason(welcome), RejectReason::kBadReserved);
}

TEST(Frame, BusyGoesAloneOnHeartbeats) {
  Bytes heartbeat = control_frame(MsgType::kHeartbeat, {});
  heartbeat[kOffFlags] = kFlagBusy;
  EXPECT_EQ(reason(heartbeat), RejectReason::kNone);
  for (uint8_t other : {kFlagPace, kFlagNeedUpdate, kFlagLeaving, kFlagPausing, kFlagMembership}) {
    heartbeat[kOffFlags] = static_cast<uint8_t>(kFlagBusy | other);
    EXPECT_EQ(reason(heartbeat), RejectReason::kBadReserved) << int{other};
  }
  for (MsgType t : {MsgType::kHello, MsgType::kDone, MsgType::kTelemetry}) {
    Bytes other = control_frame(t, {});
    other[kOffFlags] = kFlagBusy;
    EXPECT_EQ(reason(other), RejectReason::kBadReserved) << int(t);
  }
}

TEST(Frame, PaceRoundTripAndRejects) {
  const Bytes b = encode_pace({17, 4});
  PacePayload q;
  ASSERT_TRUE(decode_pace(b.data(), b.size(), &q));
  EXPECT_EQ(q.allowed, 17u);
  EXPECT_EQ(q.window, 4u);
  for (size_t len = 0; len < b.size(); ++len) EXPECT_FALSE(decode_pace(b.data(), len, &q)) << len;
  Bytes longer = b;
  longer.push_back(0);
  EXPECT_FALSE(decode_pace(longer.data(), longer.size(), &q));
  Bytes wrong_count = b;
  wrong_count[0] = 1;
  EXPECT_FALSE(decode_pace(wrong_count.data(), wrong_count.size(), &q));
  // Nothing allowed, or no window, is no allowance.
  EXPECT_FALSE(decode_pace(encode_pace({0, 4}).data(), 9, &q));
  EXPECT_FALSE(decode_pace(encode_pace({4, 0}).data(), 9, &q));
  EXPECT_FALSE(decode_pace(nullptr, 9, &q));
}

TEST(Frame, MembershipRoundTripAndRejects) {
  const MembershipPayload p{1234.5, 7};
  const Bytes b = encode_membership(p);
  MembershipPayload q;
  ASSERT_TRUE(decode_membership(b.data(), b.size(), &q));
  EXPECT_EQ(q.weight, p.weight);
  EXPECT_EQ(q.sites, p.sites);
  for (size_t len = 0; len < b.size(); ++len) {
    EXPECT_FALSE(decode_membership(b.data(), len, &q)) << len;
  }
  Bytes longer = b;
  longer.push_back(0);
  EXPECT_FALSE(decode_membership(longer.data(), longer.size(), &q));
  Bytes wrong_count = b;
  wrong_count[0] = 3;
  EXPECT_FALSE(decode_membership(wrong_count.data(), wrong_count.size(), &q));
  // A weight that is negative, infinite or not a number is malformed.
  for (double w :
       {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    const Bytes bad = encode_membership({w, 1});
    EXPECT_FALSE(decode_membership(bad.data(), bad.size(), &q)) << w;
  }
  EXPECT_FALSE(decode_membership(nullptr, 0, &q));
}

TEST(NeedUpdate, RoundTripsProgressAndMissingChunks) {
  NeedUpdatePayload p;
  const std::vector<uint32_t> missing = {3, 4, 9, 17};
  const Bytes b = encode_need_update(5, missing);
  EXPECT_EQ(b.size(), 8u + 2u);  // chunks 3..18 fit in two bitmap bytes
  ASSERT_TRUE(decode_need_update(b.data(), b.size(), 20, &p));
  EXPECT_TRUE(p.progress_known);
  EXPECT_EQ(p.delivered, 5u);
  EXPECT_EQ(p.missing, missing);
  // Nothing missing: progress only.
  const Bytes none = encode_need_update(7, {});
  ASSERT_TRUE(decode_need_update(none.data(), none.size(), 20, &p));
  EXPECT_EQ(p.delivered, 7u);
  EXPECT_TRUE(p.missing.empty());
}

TEST(NeedUpdate, AnEmptyPayloadMeansEveryChunk) {
  NeedUpdatePayload p;
  ASSERT_TRUE(decode_need_update(nullptr, 0, 4, &p));
  EXPECT_FALSE(p.progress_known);
  EXPECT_EQ(p.missing, (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST(NeedUpdate, ChunksPastTheBitmapsReachAreLeftForLater) {
  const uint32_t far = 2 + static_cast<uint32_t>(kNeedUpdateBitmapBytes) * 8;
  const Bytes b = encode_need_update(0, {2, far});
  EXPECT_LE(b.size(), 8 + kNeedUpdateBitmapBytes);
  NeedUpdatePayload p;
  ASSERT_TRUE(decode_need_update(b.data(), b.size(), far + 1, &p));
  EXPECT_EQ(p.missing, std::vector<uint32_t>{2});
}

TEST(NeedUpdate, MalformedPayloadsAreRefused) {
  NeedUpdatePayload p;
  const Bytes b = encode_need_update(1, {3});
  EXPECT_FALSE(decode_need_update(b.data(), 7, 10, &p));        // shorter than 8
  EXPECT_FALSE(decode_need_update(b.data(), b.size(), 3, &p));  // chunk 3 of 3
  const Bytes many = encode_need_update(11, {0});
  EXPECT_FALSE(decode_need_update(many.data(), many.size(), 10, &p));  // 11 of 10 delivered
  Bytes big(8 + kNeedUpdateBitmapBytes + 1, 0);
  EXPECT_FALSE(decode_need_update(big.data(), big.size(), 1u << 20, &p));  // over the limit
  EXPECT_FALSE(decode_need_update(b.data(), b.size(), 10, nullptr));
}

}  // namespace fedwan::wire
