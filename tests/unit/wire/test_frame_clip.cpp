// Adaptive clipping over regions (wire/frame.hpp, kFlagUnclipped and
// kFlagClip): a region's count of unclipped sites up, the parent's clip
// down on anchor updates and welcomes. What the encoders write, what
// parse_frame hands back, and every malformed shape it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "frame_test_util.hpp"
#include "wire/frame.hpp"

namespace fedwan::wire {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

FrameHeader delta_header() { return data_header(MsgType::kDelta, fp16(), 600, 1500, 1, 3); }

Bytes update_anchor() {
  FrameHeader h = data_header(MsgType::kAnchor, fp16(), 600, 1500, 1, 3);
  h.flags = 0;  // an update, not the model in full
  const Bytes values = codec_bytes(fp16(), 600);
  return encode_frame(h, values.data(), values.size());
}

TEST(FrameClip, UnclippedCountRoundTripsAloneWithExcusedAndWithoutValues) {
  const Bytes values = codec_bytes(fp16(), 600);
  Bytes b = encode_delta_frame(delta_header(), values.data(), values.size(), 0, 7);
  ASSERT_EQ(b.size(), kHeaderSize + values.size() + kTrailerSize);
  EXPECT_EQ(b[kOffFlags], kFlagUnclipped);
  ParsedFrame f = parse_frame(b.data(), b.size());
  ASSERT_TRUE(f.ok()) << f.detail;
  ASSERT_TRUE(f.unclipped_sites.has_value());
  EXPECT_EQ(*f.unclipped_sites, 7u);
  EXPECT_EQ(f.excused_weight, 0.0);
  EXPECT_EQ(f.payload_size, values.size());
  EXPECT_EQ(trailer_size(f.header), kTrailerSize);

  // Both trailers: the excused weight first, then the count.
  b = encode_delta_frame(delta_header(), values.data(), values.size(), 2.5, 0);
  EXPECT_EQ(b[kOffFlags], kFlagExcused | kFlagUnclipped);
  f = parse_frame(b.data(), b.size());
  ASSERT_TRUE(f.ok()) << f.detail;
  EXPECT_EQ(f.excused_weight, 2.5);
  EXPECT_EQ(f.unclipped_sites, std::optional<uint64_t>(0));
  EXPECT_EQ(f.payload_size, values.size());

  // Every copy refused below: the trailers alone.
  b = encode_delta_frame(delta_header(), nullptr, 0, 4.0, 3);
  ASSERT_EQ(b.size(), kHeaderSize + 2 * kTrailerSize);
  f = parse_frame(b.data(), b.size());
  ASSERT_TRUE(f.ok()) << f.detail;
  EXPECT_EQ(f.header.flags, kFlagExcused | kFlagNoValues | kFlagUnclipped);
  EXPECT_EQ(f.payload_size, 0u);
  EXPECT_EQ(f.excused_weight, 4.0);
  EXPECT_EQ(*f.unclipped_sites, 3u);

  // Without a count the delta is what it was.
  b = encode_delta_frame(delta_header(), values.data(), values.size(), 0);
  EXPECT_EQ(b, encode_frame(delta_header(), values.data(), values.size()));
  EXPECT_FALSE(parse_frame(b.data(), b.size()).unclipped_sites.has_value());
}

TEST(FrameClip, RefusesACountTooLargeOrCutShort) {
  const Bytes values = codec_bytes(fp16(), 600);
  Bytes b = encode_delta_frame(delta_header(), values.data(), values.size(), 0, 1);
  set_u64(b, b.size() - kTrailerSize, uint64_t{1} << 32);
  ParsedFrame f = parse_frame(b.data(), b.size());
  EXPECT_EQ(f.reject, RejectReason::kBadWeight);
  EXPECT_NE(f.detail.find("unclipped"), std::string::npos) << f.detail;
  EXPECT_FALSE(f.unclipped_sites.has_value());
  EXPECT_EQ(f.payload, nullptr);

  // The flag without its trailer: the payload is 8 bytes short.
  Bytes plain = encode_frame(delta_header(), values.data(), values.size());
  plain[kOffFlags] = kFlagUnclipped;
  EXPECT_EQ(reason(plain), RejectReason::kBadPayloadSize);
  EXPECT_THROW(
      encode_delta_frame(delta_header(), values.data(), values.size(), 0, uint64_t{1} << 32),
      ProtocolError);
}

TEST(FrameClip, ClipRidesOnAnAnchorUpdate) {
  const Bytes plain = update_anchor();
  const Bytes b = with_clip(plain, 0.75);
  ASSERT_EQ(b.size(), plain.size() + kTrailerSize);
  ParsedFrame f = parse_frame(b.data(), b.size());
  ASSERT_TRUE(f.ok()) << f.detail;
  EXPECT_EQ(f.header.flags, kFlagClip);
  EXPECT_EQ(f.clip, 0.75);
  EXPECT_EQ(f.payload_size, plain.size() - kHeaderSize);  // the codec bytes alone
  EXPECT_TRUE(std::equal(plain.begin() + kHeaderSize, plain.end(), f.payload));
  EXPECT_EQ(parse_frame(plain.data(), plain.size()).clip, 0.0);

  for (double bad : {0.0, -1.0, kInf, kNaN}) {
    Bytes c = b;
    set_f64(c, c.size() - kTrailerSize, bad);
    EXPECT_EQ(reason(c), RejectReason::kBadWeight) << bad;
  }
  // Not on the model in full, not twice, not without its trailer.
  const Bytes full = data_frame(MsgType::kAnchor, fp16());
  EXPECT_THROW(with_clip(full, 1.0), ProtocolError);
  Bytes c = b;
  c[kOffFlags] = kFlagClip | kFlagFullAnchor;
  EXPECT_EQ(reason(c), RejectReason::kBadReserved);
  EXPECT_THROW(with_clip(b, 1.0), ProtocolError);
  Bytes short_one = plain;
  short_one[kOffFlags] = kFlagClip;
  EXPECT_EQ(reason(short_one), RejectReason::kBadPayloadSize);
  for (double bad : {0.0, -2.0, kInf, kNaN}) EXPECT_THROW(with_clip(plain, bad), ProtocolError);
}

TEST(FrameClip, ClipRidesOnAWelcomeAfterItsDigest) {
  const Bytes digest(32, 0xab);
  const Bytes plain = control_frame(MsgType::kWelcome, digest);
  const Bytes b = with_clip(plain, 2.0);
  ParsedFrame f = parse_frame(b.data(), b.size());
  ASSERT_TRUE(f.ok()) << f.detail;
  EXPECT_EQ(f.header.flags, kFlagNoChange | kFlagClip);
  EXPECT_EQ(f.clip, 2.0);
  ASSERT_EQ(f.payload_size, 32u);
  EXPECT_TRUE(std::equal(digest.begin(), digest.end(), f.payload));

  Bytes c = b;
  set_f64(c, c.size() - kTrailerSize, -0.5);
  EXPECT_EQ(reason(c), RejectReason::kBadWeight);
  // A welcome too short for its trailer.
  Bytes tiny = control_frame(MsgType::kWelcome, {1, 2, 3});
  tiny[kOffFlags] = kFlagClip;
  EXPECT_EQ(reason(tiny), RejectReason::kBadPayloadSize);
  // Only welcomes and anchors carry a clip.
  for (MsgType t : {MsgType::kHello, MsgType::kTelemetry, MsgType::kReject, MsgType::kDone}) {
    EXPECT_THROW(with_clip(control_frame(t, digest), 1.0), ProtocolError) << msg_type_name(t);
  }
  Bytes hello = control_frame(MsgType::kHello, digest);
  hello[kOffFlags] = kFlagClip;  // kFlagNeedReplica on a hello: its own meaning
  EXPECT_EQ(reason(hello), RejectReason::kNone);
  EXPECT_EQ(parse_frame(hello.data(), hello.size()).clip, 0.0);
  EXPECT_THROW(with_clip(data_frame(MsgType::kDelta, fp16()), 1.0), ProtocolError);
}

}  // namespace
}  // namespace fedwan::wire
